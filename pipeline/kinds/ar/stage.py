"""Decoder kind ``ar``: full autoregressive greedy decoding of each segment, the baseline
every speculative decoder must reproduce or beat (pipeline.decoding.ar.greedy); with
``decoder.token_map`` or ``token_map.online``, drafted from a token map ("Model-free
Speculative Decoding for Transformer-based ASR with Token Map Drafting"), with the same
output; an online map learns each batch's transcripts once they are decoded.

On Whisper it also runs the model options that need per-row decoding: a language
detected per recording or per segment (the prompt then differs per row), timestamp
tokens (the segment's text cut into timed spans) and word times from cross-attention
alignment (pipeline.models.whisper.prompting, pipeline.models.whisper.alignment)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ...audio import SAMPLE_RATE
from .fallback import FallbackRule, GumbelSampling, decode_with_fallback
from ..base import SegmentResult, encode_then
from ...decoding.ar.greedy import TokenRules, greedy_decode
from ...decoding.ar.graphs import StaticDecoding
from ...decoding.drafting.drafters import NO_DRAFT, TokenMapDrafter

if TYPE_CHECKING:
    from ...models.base import ARDecoderModel, MultitaskDecoderModel


def map_drafting(adapter: ARDecoderModel, cfg) -> TokenMapDrafter | None:
    """The token-map drafting ``cfg`` asks for (None where decoder.token_map is null and
    token_map.online off), a given map checked against the adapter's vocabulary; with
    token_map.online, a map that grows from this decoder's own transcripts on top of it.
    One map and one policy per decoder, kept across batches."""
    tm = cfg.token_map
    if cfg.decoder.token_map is None and not tm.online:
        return None
    from ...decoding.drafting.token_map import TokenMap
    from ...decoding.drafting.token_map_online import OnlineTokenMap
    from ...decoding.drafting.token_map_policy import DraftPolicy

    token_map = None
    if cfg.decoder.token_map is not None:
        token_map = TokenMap.load(cfg.decoder.token_map)
        if token_map.max_token >= adapter.vocab_size:
            raise ValueError(f"decoder.token_map: {cfg.decoder.token_map} holds token {token_map.max_token}, beyond "
                             f"the model's vocabulary ({adapter.vocab_size}): built with another tokenizer")
    if tm.online:
        token_map = OnlineTokenMap(max_len=tm.max_draft, max_keys=tm.online_max_keys, base=token_map)
    return TokenMapDrafter(token_map, tm.candidates, tm.max_draft, DraftPolicy() if tm.adaptive else None,
                           map_first=not tm.lookahead_first)


class ARSegmentDecoder:
    name = "ar"

    def __init__(self, adapter: ARDecoderModel, max_new_tokens: int = 224, drafting: TokenMapDrafter | None = None,
                 confidence: bool = False, use_cuda_graphs: bool = True, fallback: FallbackRule | None = None,
                 english_check=None):
        self.adapter = adapter
        # Whisper's temperature fallback (pipeline.kinds.ar.fallback); None: greedy only
        self.fallback = fallback
        # An English-only model's failed-decode check (pipeline.models.whisper.language_check)
        self.english_check = english_check
        # decoder.use_cuda_graphs: plain greedy calls over a static KV cache, replayed as CUDA
        # graphs on a GPU (pipeline.decoding.ar.graphs; the CPU keeps the eager loop)
        self.static = StaticDecoding() if use_cuda_graphs else None
        self.max_new_tokens = max_new_tokens
        self.drafting = drafting
        self.confidence = confidence

    def segment_cost(self, audio: np.ndarray) -> int:
        return self.adapter.segment_cost(len(audio))

    def _decode(self, enc):
        cross = []
        tokens = greedy_decode(self.adapter, enc.states, max_new_tokens=self.max_new_tokens,
                               drafter=self.drafting or NO_DRAFT, cross_out=cross if self.confidence else None,
                               static=self.static)
        tokens = _unheard_rows_empty(tokens, enc.valid_frames)
        if self.drafting is not None:
            self.drafting.learn(tokens)
        return tokens, self._confidence_words(enc, tokens, cross_kv=cross) if self.confidence else None

    def detect_recordings(self, recordings: list[list[np.ndarray]]):
        """Per recording (its segments' audio): the language detected once for all its
        segments, or None where each segment is detected as it is decoded (the adapter's
        ``detect_recordings``; a model without decoding options detects nothing here)."""
        if self.adapter.options is None:
            return [None] * len(recordings)
        return self.adapter.detect_recordings(recordings)

    def decode(self, audios: list[np.ndarray], languages=None) -> list[SegmentResult]:
        """``languages``: per segment, its recording's detected (language, probability)
        or None (``detect_recordings``)."""
        if self.adapter.options is None:
            (tokens, words), t_enc, t_dec = encode_then(self.adapter, audios, self._decode)
            out = [SegmentResult(self.adapter.text(t), "ar", len(t), t_enc, t_dec, generated=len(t)) for t in tokens]
            for res, w in zip(out, words or []):
                res.words, res.word_features = w
            return out
        seconds = [len(a) / SAMPLE_RATE for a in audios]
        out, t_enc, t_dec = encode_then(self.adapter, audios,
                                        lambda enc: self._decode_whisper(enc, seconds, languages))
        for res in out:
            res.t_encode_s, res.t_decode_s = t_enc, t_dec
        return out

    def _decode_whisper(self, enc, seconds: list[float], detected=None) -> list[SegmentResult]:
        from ...models.whisper.prompting import split_timestamps

        # options set: the multitask format's per-row prompts, timestamps and word times
        adapter: MultitaskDecoderModel = self.adapter
        options = adapter.options
        prompts, languages, probs = (adapter.language_prompts(enc.states, detected) if detected is not None
                                     else adapter.language_prompts(enc.states))
        cross = []
        tokens = greedy_decode(adapter, enc.states, max_new_tokens=self.max_new_tokens, prompts=prompts,
                               drafter=self.drafting or NO_DRAFT, rules=TokenRules.of(adapter, adapter.timestamp_rules),
                               cross_out=cross if self.confidence else None, static=self.static)
        if self.drafting is not None:
            self.drafting.learn(tokens)
        if self.fallback is not None:
            tokens = self._fallback(enc.states, tokens, prompts)
        if self.english_check is not None:
            languages = self.english_check.languages(adapter, enc.states, tokens, prompts, cross or None)
        times = None
        if options.word_timestamps:
            from ...models.whisper.alignment import token_times

            times = token_times(adapter, enc.states, enc.valid_frames.tolist(), prompts, tokens,
                                adapter.alignment_heads, adapter.median_filter_width)
        results = []
        for b, toks in enumerate(tokens):
            res = SegmentResult(adapter.text(toks), "ar", len(toks), generated=len(toks),
                                language=languages[b], language_prob=probs[b])
            if options.timestamps:
                # Whisper reads a 30-s window: a time past the segment's audio is clamped to it.
                last = seconds[b]
                _, spans = split_timestamps(toks, adapter.special.timestamp_begin)
                res.spans = [{"start": round(min(a, last), 3), "end": round(min(last if e is None else e, last), 3),
                              "text": adapter.text(ids)} for a, e, ids in spans]
            if times is not None:
                res.words = self._words(toks, times[b], seconds[b])
            results.append(res)
        if self.confidence:
            for res, (words, feats) in zip(results, self._confidence_words(enc, tokens, prompts,
                                                                           [r.words for r in results], cross)):
                res.words, res.word_features = words, feats
        return results

    def _fallback(self, states, tokens: list[list[int]], prompts: list[list[int]]) -> list[list[int]]:
        """``tokens`` with the rows that fail the fallback rule sampled again (a row's
        cross-attention K/V depend on its states alone, so a confidence pass still reuses
        greedy's)."""
        adapter, rule = self.adapter, self.fallback

        def sample(rows: list[int], temperature: float) -> list[list[int]]:
            edit = GumbelSampling(temperature, rule.seed, then=adapter.timestamp_rules)
            return greedy_decode(adapter, states[rows], max_new_tokens=self.max_new_tokens,
                                 prompts=[prompts[r] for r in rows], rules=TokenRules.of(adapter, edit))

        return decode_with_fallback(adapter, states, tokens, rule, sample, prompts)[0]

    def _confidence_words(self, enc, tokens, prompts=None, timed=None, cross_kv=None):
        from ...confidence.features import decoder_words
        from ...models.base import CTC

        # A model with a CTC head offers a second view for free: agreement with its draft.
        drafts = self.adapter.ctc_draft(enc).texts if CTC in self.adapter.capabilities else None
        # the confidence pass reuses greedy decoding's cross-attention K/V (same rows, same
        # order) instead of projecting the encoder states again
        return decoder_words(self.adapter, enc.states, tokens, drafts, timed=timed, prompts=prompts,
                             cross_kv=cross_kv or None)

    def _words(self, toks: list[int], times: list[float], last: float) -> list[dict]:
        from ...models.whisper.alignment import words_of

        adapter = self.adapter
        special = {i for i, t in enumerate(toks) if t >= adapter.special.timestamp_begin} \
            if adapter.options.timestamps else set()
        words = words_of(toks, times, adapter.tokenizer.decode, special)
        # encoder frames are 20 ms: the last one may reach past the audio's end
        return [{**w, "start": round(min(w["start"], last), 3), "end": round(min(w["end"], last), 3)} for w in words]


def _unheard_rows_empty(tokens: list[list[int]], valid_frames) -> list[list[int]]:
    """No tokens for a row with no encoder frame (a clip shorter than one model frame): the
    decoder would only continue the bare prompt, so its text would be whatever the LM says
    without audio."""
    return [t if int(n) > 0 else [] for t, n in zip(tokens, valid_frames.tolist())]


def build(adapter: ARDecoderModel, cfg) -> ARSegmentDecoder:
    from ...models.whisper.language_check import EnglishOnlyCheck

    options = adapter.options     # Whisper's: the fallback is Whisper's rule
    fallback = FallbackRule.of(cfg.decoder, options.task) if options is not None else None
    return ARSegmentDecoder(adapter, cfg.decoder.max_new_tokens, map_drafting(adapter, cfg),
                            confidence=cfg.confidence.enabled, use_cuda_graphs=cfg.decoder.use_cuda_graphs,
                            fallback=fallback, english_check=EnglishOnlyCheck.of(adapter, cfg.filters))
