"""Re-synchronising a draft with greedy decoding (speculative rounds after SSD eq. 6).

SSD ("Self-Speculative Decoding for LLM-based ASR with CTC Encoder Drafts") verifies the CTC draft once and hands everything after the first failing
token j to plain AR decoding. On long segments one early error then sends most of the
segment back to token-by-token decoding, although the draft is usually right again a few
tokens later. Speculative decoding (greedy verification: a proposed token is kept
exactly when it is the decoder's own argmax) can use the rest of the draft as its
proposal source, if it knows where in the draft the decoder now is.

``advance`` keeps that place: a pointer into the draft, moved past each token the decoder
commits. A committed token equal to the draft token under the pointer moves it by one.
Otherwise the pair (previous token, token) is looked for anywhere in the draft, and
failing that the token alone right next to the pointer, nearest first; if it is in
neither, the decoder replaced one draft token with another (the commonest CTC error), and
the pointer skips that one. The pointer only steers which
tokens are proposed; greedy verification keeps the output what plain greedy decoding
gives, whatever it proposes.
"""
from __future__ import annotations

# How a guess (or, in SSD's verification, a draft token) is kept: "greedy", when it is the
# decoder's argmax (the text of plain greedy decoding); "tau_slm", when its probability is
# above SSD's tau_slm (eq. 5's rule).
LOOKAHEAD_RULES = ("greedy", "tau_slm")

# A committed token that differs from the draft token under the pointer is looked for
# this close to the pointer on its own (one token back: the decoder inserted a token the
# draft lacks; one ahead: the draft has an extra token). Anywhere in the draft, it must
# follow the token committed before it there too: a lone common token such as " the"
# matches too many places to re-anchor on.
NEAR = 1


def advance(draft: list[int], ptr: int, token: int, prev: int | None = None, near: int = NEAR) -> int:
    """The draft position after committing ``token`` (after ``prev``) at draft position ``ptr``."""
    n = len(draft)
    if ptr < n and draft[ptr] == token:
        return ptr + 1
    anchored = [q for q in range(n) if draft[q] == token and (q == 0 and prev is None or
                                                            q > 0 and draft[q - 1] == prev)]
    found = anchored or [q for q in range(max(0, ptr - near), min(n, ptr + near + 1)) if draft[q] == token]
    if found:
        # Nearest match wins; at equal distance the one ahead (the draft's extra token).
        return min(found, key=lambda q: (abs(q - ptr), q < ptr)) + 1
    return min(ptr + 1, n)


def proposal(draft: list[int], ptr: int, size: int) -> list[int]:
    """Up to ``size`` draft tokens from ``ptr`` on: the next round's guess."""
    return draft[ptr:ptr + max(size, 0)]
