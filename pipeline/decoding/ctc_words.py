"""Word timestamps from a CTC best path: the frame labels of the alignment the decoder
chose (greedy CTC's per-frame argmax, Graves et al. 2006; or the surviving alignment of
the best hypothesis of the batched beam search of "FlexCTC: GPU-powered CTC Beam Decoding
with advanced Contextual Abilities", which keeps it per hypothesis).

A token occupies the run of frames where the path holds its label after emitting it
(blank frames belong to no token), so a word starts at the first frame of its first token
and ends after the last frame of its last token. Frame ``f`` starts at ``f x stride`` seconds,
the model's frame stride (Whisper encoder and wav2vec2: 20 ms; Parakeet: 80 ms). Word
boundaries follow the vocabulary's own convention (``CTCVocabulary.word_roles``: a space
or ``|`` separates, ``▁`` opens a word), and a word's text is the vocabulary's decoding of
its tokens, so the words spell the transcript.
"""
from __future__ import annotations

from typing import Sequence

from ..text.ctc_vocabulary import SEPARATOR, WORD_START


def token_runs(path: Sequence[int], blank: int) -> tuple[list[int], list[int], list[int]]:
    """Collapse a frame path: the emitted tokens, each one's first frame and the frame
    after its run (a repeated label continues the run; a blank ends it)."""
    tokens, starts, ends = [], [], []
    prev = blank
    for f, label in enumerate(path):
        if label != blank and label == prev:
            ends[-1] = f + 1
        elif label != blank:
            tokens.append(label)
            starts.append(f)
            ends.append(f + 1)
        prev = label
    return tokens, starts, ends


def words_from_path(path: Sequence[int], blank: int, vocabulary, stride_s: float) -> list[dict]:
    """``[{word, start, end}]`` (seconds from the path's first frame) of a frame path."""
    return words_and_tokens(path, blank, vocabulary, stride_s)[0]


def words_and_tokens(path: Sequence[int], blank: int, vocabulary, stride_s: float) -> tuple[list[dict], list[list[int]]]:
    """The words of ``words_from_path`` and, per word, the indices of its emitted tokens
    (in the order of ``token_runs``), for word-level confidence."""
    tokens, starts, ends = token_runs(path, blank)
    words: list[dict] = []
    members: list[list[int]] = []
    current: list[int] = []
    current_idx: list[int] = []
    first = last = 0

    def close():
        text = vocabulary.decode(current).strip()
        if text:
            words.append({"word": text, "start": round(first * stride_s, 3), "end": round(last * stride_s, 3)})
            members.append(list(current_idx))
        current.clear()
        current_idx.clear()

    for k, (tok, start, end, role) in enumerate(zip(tokens, starts, ends, vocabulary.word_roles(tokens))):
        if role == SEPARATOR or (role == WORD_START and current):
            if current:
                close()
            if role == SEPARATOR:
                continue
        if not current:
            first = start
        current.append(tok)
        current_idx.append(k)
        last = end
    if current:
        close()
    return words, members
