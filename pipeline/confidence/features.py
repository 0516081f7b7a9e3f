"""Words and word-confidence features of a decoder's segments, one function per kind of
evidence (the decoders call these; pipeline.confidence.apply turns the features into
calibrated confidences):

- ``decoder_words``: an attention decoder's final tokens (ar, every ssd stage), with the
  agreement of each word with the CTC draft where there is one;
- ``ctc_words``: a CTC path (ctc_greedy, ctc_beam) with, for the beam, the agreement with
  the greedy path's text and the N-best posterior of each word;
- ``transducer_words``: a transducer's tokens and their frames.

Each returns ``(words, features)``: ``[{word, start, end}]`` (pipeline.confidence.words.
segment_words) and one feature dict per word.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .scores import ctc_token_scores, decoder_token_scores, transducer_token_scores
from .words import agreement, aggregate, nbest_posterior, segment_words, token_word_index

if TYPE_CHECKING:
    from ..models.base import ARDecoderModel, TransducerModel


def _with(features: list[dict], name: str, values: list[float] | None) -> list[dict]:
    if values is not None:
        for f, v in zip(features, values):
            f[name] = float(v)
    return features


def decoder_words(adapter: ARDecoderModel, encoder_states: torch.Tensor, tokens: list[list[int]],
                  drafts: list[str | None] | None = None, timed: list[list[dict] | None] | None = None,
                  prompts: list[list[int]] | None = None, cross_kv: list | None = None):
    """Per row: words and features of ``tokens`` scored by the attention decoder over
    ``encoder_states`` (row i's are ``encoder_states[i]``); ``drafts``: the CTC draft text
    of each row (None: no draft); ``timed``: word timings where the decoder has them;
    ``prompts``: the prompts the tokens were decoded after (default: the adapter's);
    ``cross_kv``: the rows' cross-attention K/V from their greedy decoding, reused."""
    scores = decoder_token_scores(adapter, encoder_states, tokens, prompts, cross_kv)
    out = []
    for i, (toks, sc) in enumerate(zip(tokens, scores)):
        text = adapter.text(toks)
        words = segment_words(text, timed[i] if timed else None)
        feats = aggregate(sc, token_word_index(adapter.text, toks), len(words))
        draft = drafts[i] if drafts else None
        _with(feats, "agree", agreement([w["word"] for w in words], draft) if draft is not None else None)
        out.append((words, feats))
    return out


def ctc_words(log_probs: torch.Tensor, path: list[int], blank: int, vocabulary, stride_s: float | None,
              greedy_text: str | None = None, nbest: tuple[list[str], list[float]] | None = None):
    """Words and features of a CTC frame ``path`` over ``log_probs`` [T, C] (valid frames);
    ``greedy_text``: the greedy path's text to agree with (a beam decoder); ``nbest``:
    (texts, scores) of the beam's hypotheses, best first. Without a word vocabulary there
    are no words: (None, None)."""
    from ..decoding.ctc_words import words_and_tokens

    if vocabulary is None:
        return None, None
    timed, members = words_and_tokens(path, blank, vocabulary, stride_s or 0.0)
    token, _ = ctc_token_scores(log_probs, path, blank)
    index = [-1] * len(token.get("prob", []))
    for w, m in enumerate(members):
        for k in m:
            index[k] = w
    keep = [k for k, w in enumerate(index) if w >= 0]
    sub = {name: v[keep] for name, v in token.items()}
    feats = aggregate(sub, [index[k] for k in keep], len(timed))
    words = [dict(w) for w in timed] if stride_s is not None else [dict(w, start=None, end=None) for w in timed]
    texts = [w["word"] for w in words]
    _with(feats, "agree", agreement(texts, greedy_text) if greedy_text is not None else None)
    if nbest is not None:
        posterior, best = nbest_posterior(texts, *nbest)
        _with(feats, "nbest", posterior)
        _with(feats, "nbest_best", [best] * len(feats))
    return words, feats


def transducer_words(adapter: TransducerModel, frames: torch.Tensor, tokens: list[int], token_frames: list[int],
                     timed: list[dict]):
    """Words and features of one utterance's transducer ``tokens`` emitted at
    ``token_frames`` over its encoder ``frames`` [T, H]; ``timed``: the words of that best
    path with their times, which the decoder reads from its own search."""
    sc = transducer_token_scores(adapter, frames, tokens, token_frames)
    text = adapter.decode_text(tokens).strip()
    words = segment_words(text, timed if tokens else None)
    feats = aggregate(sc, token_word_index(adapter.decode_text, tokens), len(words))
    return words, feats
