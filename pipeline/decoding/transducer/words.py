"""Word timestamps from a transducer's best path ("Pushing the Limits of Beam Search
Decoding for Transducer-based ASR models": each hypothesis keeps the frame of every token
it emitted). SentencePiece pieces that start with the word marker ``▁`` open a word (a
character vocabulary spells its space as a bare marker); a word spans from its first
heard token's frame to its last token's frame + 1, times the frame shift (80 ms for
Parakeet, 40 ms for the embedded transducer)."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ...models.base import TransducerModel

MARKER = "▁"


def word_timestamps(tokenizer, tokens: list[int], frames: list[int], frame_shift_s: float,
                    offset_s: float = 0.0, decode=None) -> list[dict]:
    """``[{word, start, end}]`` (seconds, plus ``offset_s``) of a token sequence;
    ``decode`` spells a word's ids (default: the tokenizer's ``decode``; Parakeet's
    collapses repeated ids unless told otherwise, so its adapter passes ``decode_text``)."""
    decode = decode or (lambda ids: tokenizer.decode(ids, skip_special_tokens=True))
    pieces = tokenizer.convert_ids_to_tokens([int(t) for t in tokens])
    words: list[list] = []      # [ids, first frame, last frame]
    for tok, piece, fr in zip(tokens, pieces, frames):
        if not words or str(piece).startswith(MARKER):
            # a bare marker (a space of its own) is emitted before the word is heard: the
            # word starts at its next token
            words.append([[tok], None if piece == MARKER else fr, fr])
        else:
            words[-1][0].append(tok)
            words[-1][2] = fr
            if words[-1][1] is None:
                words[-1][1] = fr
    out = []
    for ids, first, last in words:
        text = decode(ids).strip()
        if text and first is not None:
            out.append({"word": text, "start": offset_s + first * frame_shift_s,
                        "end": offset_s + (last + 1) * frame_shift_s})
    return out


def best_path_words(model: TransducerModel, tokens: list[int], frames: list[int]) -> list[dict]:
    """``word_timestamps`` of a transducer adapter's best path (segment-relative seconds):
    its tokenizer, frame shift and text rule."""
    if not tokens:
        return []
    return word_timestamps(model.tokenizer, tokens, frames, model.frame_shift_s, decode=model.decode_text)
