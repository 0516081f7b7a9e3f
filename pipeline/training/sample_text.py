"""Real English text available offline, for building test and benchmark LMs.

Python's own ``pydoc_data.topics`` (the language reference's prose, PSF licence) ships
with every CPython, so LM tests and benches build their ARPAs from real text without a
download. Lines are split at sentence ends and cleaned of markup runs.
"""
from __future__ import annotations

import re

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_MARKUP = re.compile(r"[*`|=~^]{2,}|\s+")


def pydoc_sentences(min_chars: int = 20, max_chars: int = 300) -> list[str]:
    """Sentences of the Python language reference, in a fixed order."""
    from pydoc_data.topics import topics

    sentences: list[str] = []
    for key in sorted(topics):
        for block in topics[key].split("\n\n"):
            text = _MARKUP.sub(" ", block).strip()
            for sentence in _SENTENCE_END.split(text):
                sentence = sentence.strip()
                if min_chars <= len(sentence) <= max_chars and sentence.isascii():
                    sentences.append(sentence)
    return sentences
