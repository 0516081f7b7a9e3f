"""ARPA back-off n-gram files: parsing, and the token <-> word convention of build-lm.

An ARPA file lists n-grams with a log10 probability and, for n-grams that are contexts of
longer ones, a log10 back-off weight (Katz back-off as KenLM's ``lmplz`` writes it;
"FlexCTC: GPU-powered CTC Beam Decoding with advanced Contextual Abilities", §II-D, builds
NGPU-LM from such a file). Token-level LMs here write LM token ``i`` as the single
character ``chr(i + 100)`` (FlexCTC §IV-A: the n-gram LM is trained on the ASR model's own
token ids), so a sentence of ids is one line of space-separated characters that KenLM
treats as words.

Splitting is on ASCII space/tab only: ``str.split()`` would also split on U+0085 or
U+00A0, which are legal token characters (ids 33 and 60).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

TOKEN_OFFSET = 100
BOS, EOS, UNK = "<s>", "</s>", "<unk>"
SPECIAL = (BOS, EOS, UNK)
LN10 = math.log(10.0)
# chr(id + 100) must stay below the UTF-16 surrogates, which are not encodable.
MAX_VOCAB = 0xD800 - TOKEN_OFFSET

_COUNT = re.compile(r"^ngram\s+(\d+)\s*=\s*(\d+)\s*$")
_SECTION = re.compile(r"^\\(\d+)-grams:\s*$")


def token_word(token: int) -> str:
    """The ARPA word of LM token ``token``."""
    if not 0 <= token < MAX_VOCAB:
        raise ValueError(f"token id {token} cannot be written as chr(id + {TOKEN_OFFSET})")
    return chr(token + TOKEN_OFFSET)


def word_token(word: str) -> int | None:
    """The LM token of an ARPA word, or None for special and non-token words."""
    if len(word) == 1 and ord(word) >= TOKEN_OFFSET:
        return ord(word) - TOKEN_OFFSET
    return None


def tokens_line(tokens) -> str:
    """One training line for lmplz: tokens as characters, space separated."""
    return " ".join(token_word(int(t)) for t in tokens)


@dataclass
class Arpa:
    """The n-grams of an ARPA file, natural-log weights.

    ``ngrams[n-1]`` maps a tuple of n words to ``(logprob, backoff)``; the back-off is
    0.0 where the file gives none.
    """

    order: int
    ngrams: list[dict[tuple[str, ...], tuple[float, float]]] = field(default_factory=list)

    def words(self) -> list[str]:
        return [g[0] for g in self.ngrams[0]]

    def non_token_words(self) -> list[str]:
        """Words that are neither special nor ``chr(id + 100)`` tokens (word-level ARPA)."""
        return [w for w in self.words() if w not in SPECIAL and word_token(w) is None]


def _fields(line: str) -> tuple[str, list[str], str | None]:
    if "\t" in line:
        parts = line.split("\t")
        return parts[0], [w for w in parts[1].split(" ") if w], parts[2] if len(parts) > 2 else None
    parts = [p for p in line.split(" ") if p]
    return parts[0], parts[1:], None


def read_arpa(path: str) -> Arpa:
    """Parse an ARPA file (as written by lmplz or SRILM) into natural-log weights."""
    counts: dict[int, int] = {}
    sections: list[dict] = []
    current = 0
    with open(path, encoding="utf-8", newline=None) as fh:
        for raw in fh:
            line = raw.rstrip("\r\n")
            if not line.strip():
                continue
            if current == 0:
                m = _COUNT.match(line.strip())
                if m:
                    counts[int(m.group(1))] = int(m.group(2))
                    continue
            m = _SECTION.match(line.strip())
            if m:
                current = int(m.group(1))
                while len(sections) < current:
                    sections.append({})
                continue
            if line.strip() == "\\end\\":
                break
            if current == 0 or line.startswith("\\"):
                continue
            logp, words, backoff = _fields(line)
            if backoff is None and len(words) == current + 1:
                backoff, words = words[-1], words[:-1]
            if len(words) != current:
                raise ValueError(f"{path}: bad {current}-gram line: {line!r}")
            sections[current - 1][tuple(words)] = (
                float(logp) * LN10, float(backoff) * LN10 if backoff else 0.0)
    if not sections:
        raise ValueError(f"{path}: no n-gram sections; is this an ARPA file?")
    for n, count in counts.items():
        if n <= len(sections) and len(sections[n - 1]) != count:
            raise ValueError(f"{path}: header says {count} {n}-grams, found {len(sections[n - 1])}")
    return Arpa(order=len(sections), ngrams=sections)
