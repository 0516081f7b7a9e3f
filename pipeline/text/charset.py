"""Character vocabulary of the embedded CTC draft head.

Index 0 is the CTC blank; indices 1..95 are the printable ASCII characters chr(32)..chr(126)
in code-point order, so drafts are cased and punctuated like Whisper's own output.
An n-gram LM over this vocabulary uses the non-blank tokens only: LM index = id - 1.
"""
from __future__ import annotations

BLANK = 0
CHARS = [chr(c) for c in range(32, 127)]
_INDEX = {ch: i + 1 for i, ch in enumerate(CHARS)}
NUM_CLASSES = len(CHARS) + 1


def encode(text: str) -> list[int]:
    """Character ids of ``text``; characters outside printable ASCII are dropped."""
    return [_INDEX[ch] for ch in text if ch in _INDEX]


def decode(ids) -> str:
    """Text of non-blank ids (no CTC collapsing: that is the decoder's job)."""
    return "".join(CHARS[i - 1] for i in ids if 0 < i <= len(CHARS))


def lm_token_ids(text: str) -> list[int]:
    """Token ids of ``text`` for an n-gram LM over this vocabulary: the CTC id minus one.
    The blank has no LM token, so LM index 0 is the space (chr(32))."""
    return [i - 1 for i in encode(text)]
