"""Whisper behind the model-adapter interface the decoders use.

A decoder sees only: ``encode`` (audio -> encoder states + valid frame counts),
``decoder_hidden``/``logits`` (teacher-forced or incremental decoder passes with a KV
cache, positions given explicitly so right- or left-padded rows stay correct),
the prompt, end-of-text id, and the suppress masks greedy decoding applies. Whisper's
encoder always reads a 30-s window (3000 mel frames -> 1500 states); only the first
ceil(samples / 320) states belong to the audio.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from ...audio import SAMPLE_RATE
from .prompting import (TimestampRules, WhisperOptions, WhisperTokens, detect_language,
                        options_error, prefix)
from ..base import ATTENTION_DECODER, BEAM_VOCABULARY, CTC, PACKABLE, CTCDraftBatch, EncoderBatch

SAMPLES_PER_STATE = 320  # hop 160 x conv stride 2
WINDOW_SAMPLES = 30 * SAMPLE_RATE
WINDOW_FRAMES = 1500  # encoder states per 30-s window
PACK_GAP_S = 0.3  # silence between packed clips
# A packed clip's share of the batch budget: its states plus a gap's worth.
PACKED_EXTRA_FRAMES = 16


_UNBUILT = object()


class WhisperAdapter:
    def __init__(self, model, processor, device: str | torch.device = "cpu", ctc_head=None,
                 ctc_decode=None, encoder_micro_batch: int = 0, options: WhisperOptions | None = None,
                 screened_argmax: bool = True, cross_kv_dtype: torch.dtype | None = None):
        self.model = model.requires_grad_(False)
        # A CTC head over the encoder states: module(states [B,T,D], lengths [B]) -> logits
        # [B,T,C]; ctc_decode maps its collapsed ids to text.
        self.ctc_head = ctc_head.to(device).eval() if ctc_head is not None else None
        self.ctc_decode = ctc_decode
        self.processor = processor
        # Segments per encoder call (0: the whole batch); the result is the same, the
        # speed is not (pipeline.config.ModelConfig.encoder_micro_batch).
        self.encoder_micro_batch = encoder_micro_batch
        self.tokenizer = processor.tokenizer
        self.device = torch.device(device)
        # The decoder's dtype (the states' dtype every decoder and head sees) and the
        # encoder's, which model.encoder_dtype may set apart.
        self.dtype = model.model.decoder.embed_tokens.weight.dtype
        self.encoder_dtype = model.model.encoder.conv1.weight.dtype
        cfg = model.config
        gen = model.generation_config
        fe = processor.feature_extractor
        if fe.feature_size != cfg.num_mel_bins:
            raise ValueError(f"the checkpoint's feature extractor makes {fe.feature_size} mel bins, its encoder "
                             f"reads {cfg.num_mel_bins}")
        self.options = options = options or WhisperOptions()
        self.special = special = WhisperTokens.of(model, self.tokenizer)
        problem = options_error(special, options.language, options.task, options.timestamps,
                                options.language_candidates)
        if problem:
            raise ValueError(problem)
        if options.word_timestamps and not getattr(gen, "alignment_heads", None):
            raise ValueError("model.word_timestamps: the model's generation config names no alignment_heads")
        self.eot_id = special.eot
        sot, no_ts = special.sot, special.no_timestamps
        self.previous_ids = self._previous_text(options.initial_prompt, int(cfg.max_target_positions))
        fixed = options.language if options.language not in (None, "auto") else "en"
        self.prompt_ids = prefix(special, special.lang_to_id.get(fixed), options.task, options.timestamps,
                                 self.previous_ids)
        # What a row records as its language: the one a multilingual model's prompt names
        # (en where model.language is null), as configured on an English-only one.
        self.prompt_language = fixed if special.multilingual else options.language
        self.timestamp_rules = (TimestampRules(special, getattr(gen, "max_initial_timestamp_index", None))
                                if options.timestamps else None)
        self.alignment_heads = [tuple(h) for h in getattr(gen, "alignment_heads", None) or []]
        self.median_filter_width = int(getattr(cfg, "median_filter_width", 7))
        self.vocab_size = int(cfg.vocab_size)
        suppress = torch.zeros(self.vocab_size, dtype=torch.bool)
        ids = [t for t in (gen.suppress_tokens or cfg.suppress_tokens or []) if t < self.vocab_size]
        suppress[ids] = True
        # Timestamp and other special tokens are never produced in no-timestamp greedy mode
        # (with timestamps, TimestampRules decides where time tokens go).
        if not options.timestamps:
            suppress[int(no_ts) + 1 if no_ts is not None else self.vocab_size:] = True
        suppress[sot] = True
        if no_ts is not None:
            suppress[int(no_ts)] = True
        self.suppress_mask = suppress.to(self.device)
        begin = gen.begin_suppress_tokens or cfg.begin_suppress_tokens or []
        self.begin_suppress_ids = torch.tensor(list(begin), dtype=torch.long, device=self.device)
        self.max_positions = int(cfg.max_target_positions)
        # The only CTC head this family loads is the character head (pipeline.text.charset).
        self.capabilities = frozenset({ATTENTION_DECODER, PACKABLE}
                                      | ({CTC, BEAM_VOCABULARY} if self.ctc_head is not None else set()))
        self.window_samples = WINDOW_SAMPLES
        # Greedy steps' token choice without the logits (None: take the logits' argmax);
        # built on first use (a 20-40 MB low-precision copy that CTC-only configs never need).
        self._next_tokens = _UNBUILT if screened_argmax else None
        # The decoder's cross-attention K/V projected in another dtype
        # (pipeline.models.whisper.cross_projection; model.cross_kv_dtype), else None: the
        # model's own layers project them in its dtype.
        self.cross_projection = None
        if cross_kv_dtype is not None and cross_kv_dtype != self.dtype:
            from .cross_projection import CrossProjection

            self.cross_projection = CrossProjection(model.model.decoder.layers, cross_kv_dtype, self.dtype)
        self._static_step = None
        self._log_mel = _UNBUILT   # the device features, built on first use (features)

    frame_stride_s = SAMPLES_PER_STATE / SAMPLE_RATE   # encoder states (and CTC head frames)

    @property
    def next_tokens(self):
        if self._next_tokens is _UNBUILT:
            self._next_tokens = self._screen()
        return self._next_tokens

    @next_tokens.setter
    def next_tokens(self, pick) -> None:
        self._next_tokens = pick

    def _screen(self):
        """The screened argmax over the output projection with the suppressed tokens
        masked (pipeline.models.screened_argmax), for a float32 plain Linear on a CPU:
        screened in bfloat16 where the CPU computes it natively, else in int8 through
        fbgemm where torch has it; else None (the full product)."""
        from ..screened_argmax import Int8ScreenedArgmax, ScreenedArgmax
        from ...device import cpu_bf16_native

        proj = self.model.proj_out
        if (self.device.type != "cpu" or type(proj) is not torch.nn.Linear or proj.bias is not None
                or proj.weight.dtype != torch.float32):
            return None
        if cpu_bf16_native():
            return ScreenedArgmax(proj.weight, self.suppress_mask)
        try:
            return Int8ScreenedArgmax(proj.weight, self.suppress_mask)
        except (RuntimeError, NotImplementedError):     # no fbgemm product, or not exact here
            return None

    def segment_cost(self, num_samples: int, packed: bool = False) -> int:
        """Padded encoder frames a segment takes in a batch: a whole 30-s window, or with
        packing its own states plus a gap's worth (several clips share a window)."""
        if packed:
            return min(WINDOW_FRAMES, num_samples // SAMPLES_PER_STATE + PACKED_EXTRA_FRAMES)
        return WINDOW_FRAMES

    def batch_prompts(self, encoder_states: torch.Tensor) -> list[list[int]]:
        """Per-row decoder prompts (the decoders' interface); with a fixed language
        Whisper's is the same for all (``language_prompts`` detects per row)."""
        return [self.prompt_ids] * encoder_states.shape[0]

    def language_prompts(self, encoder_states: torch.Tensor, languages=None):
        """Per row: the decoder prompt, the language it decodes in (None: not configured)
        and, where the language was detected (model.language=auto), its probability.
        ``languages``: per row, a (code, probability) already detected for the row's
        recording (``detect_recordings``), or None: detected here from the row's own states."""
        B, opts = encoder_states.shape[0], self.options
        if opts.language != "auto":
            return [self.prompt_ids] * B, [self.prompt_language] * B, [None] * B
        known = list(languages) if languages is not None else [None] * B
        todo = [b for b in range(B) if known[b] is None]
        if todo:
            names = {v: k for k, v in self.special.lang_to_id.items()}
            ids, probs = detect_language(self, encoder_states[todo], self.special, opts.language_candidates)
            for b, i, p in zip(todo, ids, probs):
                known[b] = (names[i], p)
        prompts = [prefix(self.special, self.special.lang_to_id[code], opts.task, opts.timestamps,
                          self.previous_ids) for code, _ in known]
        return prompts, [code for code, _ in known], [p for _, p in known]

    @torch.inference_mode()
    def detect_recordings(self, recordings: list[list[np.ndarray]], batch: int = 8) -> list[tuple[str, float] | None]:
        """With model.language=auto and model.language_detection=recording: per recording
        (its speech segments in order), the (language, probability) of its first 30 s of
        speech, the segments joined without their gaps (faster-whisper detects on the first
        30 s of the VAD-filtered audio); one language for the whole recording, so a short
        segment is not decoded in a language its few syllables suggest alone. None for a
        recording of one segment (its own window is the same audio, detected while it is
        decoded, at no extra encoder pass), of none, and where detection is per segment."""
        out: list[tuple[str, float] | None] = [None] * len(recordings)
        if self.options.language != "auto" or self.options.language_detection != "recording":
            return out
        todo = [r for r, segs in enumerate(recordings) if len(segs) > 1]
        names = {v: k for k, v in self.special.lang_to_id.items()}
        for start in range(0, len(todo), batch):
            part = todo[start:start + batch]
            windows = [_first_samples(recordings[r], WINDOW_SAMPLES) for r in part]
            states = self.run_encoder(self.features(windows))
            ids, probs = detect_language(self, states, self.special, self.options.language_candidates)
            for r, i, p in zip(part, ids, probs):
                out[r] = (names[i], p)
        return out

    def _previous_text(self, text: str | None, max_positions: int) -> list[int]:
        """The initial prompt's tokens, at most the last half-context's worth (as Whisper
        keeps previous text)."""
        if not text or not text.strip():
            return []
        if self.special.prev is None:
            raise ValueError("model.initial_prompt: the model's tokenizer has no <|startofprev|> token")
        return self.tokenize(text)[-(max_positions // 2 - 1):]

    # --- audio side -------------------------------------------------------------------
    def features(self, audios: list[np.ndarray]) -> torch.Tensor:
        """Log-mel features [B, mel bins, 3000] on the model's device, computed there
        (pipeline.models.whisper.log_mel), or by the checkpoint's feature extractor on
        the host where its settings are ones the device path does not reproduce."""
        if self._log_mel is _UNBUILT:
            from .log_mel import DeviceLogMel

            fe = self.processor.feature_extractor
            self._log_mel = DeviceLogMel(fe, self.device, self.encoder_dtype) if DeviceLogMel.supports(fe) else None
        if self._log_mel is not None:
            return self._log_mel(audios)
        fe = self.processor.feature_extractor
        feats = fe(audios, sampling_rate=SAMPLE_RATE, return_tensors="pt").input_features
        return feats.to(self.device, self.encoder_dtype)

    @staticmethod
    def valid_frames(num_samples: int, total_frames: int = WINDOW_FRAMES) -> int:
        return min(total_frames, max(1, math.ceil(num_samples / SAMPLES_PER_STATE)))

    def run_encoder(self, features: torch.Tensor) -> torch.Tensor:
        """Encoder states of log-mel ``features`` [B, mel bins, 3000] (80 bins; 128 for
        large-v3 and turbo), in slices of ``encoder_micro_batch`` segments."""
        step = self.encoder_micro_batch or features.shape[0]
        encoder = self.model.model.encoder
        if step >= features.shape[0]:
            return encoder(features).last_hidden_state.to(self.dtype)
        return torch.cat([encoder(features[i:i + step]).last_hidden_state
                          for i in range(0, features.shape[0], step)]).to(self.dtype)

    @torch.inference_mode()
    def encode(self, audios: list[np.ndarray]) -> EncoderBatch:
        for a in audios:
            if len(a) > WINDOW_SAMPLES:
                raise ValueError(f"segment of {len(a) / SAMPLE_RATE:.1f} s exceeds Whisper's 30-s window")
        states = self.run_encoder(self.features(audios))
        valid = torch.tensor([self.valid_frames(len(a), states.shape[1]) for a in audios],
                             dtype=torch.long, device=self.device)
        return EncoderBatch(states=states, valid_frames=valid)

    @staticmethod
    def plan_packing(lengths: list[int], gap_s: float = PACK_GAP_S):
        """Where ``encode_packed`` puts clips of these sample counts (pipeline.packing)."""
        from ...packing import plan_windows

        return plan_windows(lengths, WINDOW_SAMPLES, int(gap_s * SAMPLE_RATE), SAMPLES_PER_STATE)

    @torch.inference_mode()
    def encode_packed(self, audios: list[np.ndarray], gap_s: float = PACK_GAP_S,
                      keep_windows: bool = False) -> EncoderBatch:
        """Encoder states per clip, several short clips per encoder pass; rows are
        right-padded to the longest clip. For decoders that read only the encoder states
        (the CTC head) the clips are isolated (``encode_isolated``: a clip's states do not
        depend on its neighbours). ``keep_windows`` (the SSD packed gate, which verifies
        per window) packs the signals into shared 30-s windows instead (pipeline.packing)
        and also returns the placements and the window states; there a clip's states do
        depend on the clips sharing its window."""
        from ...packing import pack_signals

        if not keep_windows:
            return self.encode_isolated(audios)

        placements = self.plan_packing([len(a) for a in audios], gap_s)
        windows = self.run_encoder(self.features(pack_signals(audios, placements, WINDOW_SAMPLES)))
        total = windows.shape[1]
        first = [p.start // SAMPLES_PER_STATE for p in placements]
        valid = [min(total - a, self.valid_frames(p.length, total)) for a, p in zip(first, placements)]
        states = windows.new_zeros(len(audios), max(valid), windows.shape[2])
        for i, (p, a, n) in enumerate(zip(placements, first, valid)):
            states[i, :n] = windows[p.window, a:a + n]
        return EncoderBatch(states=states, valid_frames=torch.tensor(valid, dtype=torch.long, device=self.device),
                            placements=placements if keep_windows else None,
                            window_states=windows if keep_windows else None)

    @torch.inference_mode()
    def encode_isolated(self, audios: list[np.ndarray]) -> EncoderBatch:
        """Encoder states per clip that are a function of the clip alone, several clips per
        encoder pass (pipeline.packing.plan_sequences): each clip's log-mel (its own 30-s
        padded window, as ``encode`` computes it) is cut to its valid frames and run
        through the convolutions alone, takes positions 0..n-1, and the clips of one
        sequence attend only to themselves (pipeline.packing.block_mask)."""
        from ...packing import block_mask, plan_sequences

        for a in audios:
            if len(a) > WINDOW_SAMPLES:
                raise ValueError(f"segment of {len(a) / SAMPLE_RATE:.1f} s exceeds Whisper's 30-s window")
        encoder = self.model.model.encoder
        feats = self.features(audios)
        valid = [self.valid_frames(len(a), WINDOW_FRAMES) for a in audios]
        embeds = []
        for i, n in enumerate(valid):
            x = torch.nn.functional.gelu(encoder.conv1(feats[i:i + 1, :, :2 * n]))
            x = torch.nn.functional.gelu(encoder.conv2(x))[0].transpose(0, 1)
            embeds.append(x + encoder.embed_positions.weight[:n].to(x.dtype))
        places = plan_sequences(valid, WINDOW_FRAMES)
        n_seq = 1 + max(s for s, _ in places)
        spans = [[] for _ in range(n_seq)]
        for (seq, off), n in zip(places, valid):
            spans[seq].append((off, n))
        length = max(off + n for seq in spans for off, n in seq)
        hidden = embeds[0].new_zeros(n_seq, length, embeds[0].shape[1])
        for (seq, off), x in zip(places, embeds):
            hidden[seq, off:off + len(x)] = x
        allowed = torch.from_numpy(block_mask(spans, length)).to(self.device)
        mask = torch.zeros(allowed.shape, dtype=hidden.dtype, device=self.device)
        mask = mask.masked_fill(~allowed, torch.finfo(hidden.dtype).min)[:, None]
        for layer in encoder.layers:
            hidden = layer(hidden, mask)
        hidden = encoder.layer_norm(hidden).to(self.dtype)
        states = hidden.new_zeros(len(audios), max(valid), hidden.shape[2])
        for i, ((seq, off), n) in enumerate(zip(places, valid)):
            states[i, :n] = hidden[seq, off:off + n]
        return EncoderBatch(states=states, valid_frames=torch.tensor(valid, dtype=torch.long, device=self.device))

    @torch.inference_mode()
    def ctc_draft(self, enc: EncoderBatch) -> CTCDraftBatch:
        """Greedy CTC draft and frame entropies over valid frames (the SSD gate's inputs)."""
        from ..ctc_greedy import ctc_greedy

        if self.ctc_head is None:
            raise ValueError("this model has no CTC head: configure model.ctc_head")
        T = int(enc.valid_frames.max())
        states = enc.states[:, :T]
        logits = self.ctc_head(states.to(next(self.ctc_head.parameters()).dtype), enc.valid_frames)
        log_probs = logits.float().log_softmax(-1)
        g = ctc_greedy(log_probs, enc.valid_frames)
        return CTCDraftBatch(log_probs=log_probs, lengths=enc.valid_frames,
                             texts=[self.ctc_decode(t) for t in g.tokens],
                             entropy=g.entropy, max_entropy=g.max_entropy)

    # --- decoder side -----------------------------------------------------------------
    def decoder_hidden(self, input_ids, encoder_states, cache=None, attention_mask=None,
                       position_ids=None):
        if self.cross_projection is not None:
            cache = self._with_cross(cache, encoder_states)
        out = self.model.model.decoder(
            input_ids=input_ids, encoder_hidden_states=encoder_states,
            cache=cache, attention_mask=attention_mask, position_ids=position_ids, use_cache=True)
        return out.last_hidden_state, out.cache

    def _with_cross(self, cache, encoder_states: torch.Tensor):
        """``cache`` (a new one for None) holding the cross-attention K/V of
        ``encoder_states`` from :attr:`cross_projection`, where it has none yet; the model's
        attention then reads them instead of projecting the states itself."""
        from transformers.cache_utils import DynamicCache, EncoderDecoderCache

        from ..kv_cache import cache_of

        if cache is None:
            return EncoderDecoderCache(DynamicCache(), cache_of(self.cross_projection(encoder_states)))
        if isinstance(cache, EncoderDecoderCache) and cache.cross_attention_cache.get_seq_length() == 0:
            cache.cross_attention_cache = cache_of(self.cross_projection(encoder_states))
            for i in range(len(self.cross_projection.weights)):
                cache.is_updated[i] = True
        return cache

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.proj_out(hidden).float()

    def static_step(self):
        """The decoder's step over caller-owned K/V buffers (the static-cache greedy loop,
        pipeline.decoding.ar.static), built on first use."""
        if self._static_step is None:
            from .static_step import WhisperStaticStep

            self._static_step = WhisperStaticStep(self.model.model.decoder)
        return self._static_step

    def text(self, token_ids: list[int]) -> str:
        if self.options.timestamps:
            token_ids = [t for t in token_ids if t < self.special.timestamp_begin]
        return self.tokenizer.decode(token_ids, skip_special_tokens=True).strip()

    def tokenize(self, text: str) -> list[int]:
        # Whisper's transcripts start with a space token.
        return self.tokenizer.encode(" " + text.strip(), add_special_tokens=False)


# Encoder Linear layers left in float32 under int8: the FFN's second product, whose
# post-GELU input is heavy-tailed, so an activation scale resolves it worst (with one
# scale per call: 12% relative error of the encoder states on the bundled clips, 2.5-5%
# for the others; "jumps" became "jump"). It is a third of the encoder's Linear work.
INT8_KEPT_FLOAT = ("fc2",)


def quantize_int8(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with the Linear layers of its encoder's and decoder's layers in int8 (one
    weight scale per output channel, one activation scale per token: models.int8_rows, on
    torch's fbgemm/oneDNN kernels; CPU only), but for the encoder's INT8_KEPT_FLOAT layers.
    Per-token scales keep a clip's text independent of its batch and SSD's verification
    equal to the AR loop. The output projection stays float32: the screened argmax
    already reads it through int8 and rescores exactly. Per-channel weight scales:
    per-tensor ones changed more transcripts (docs/engines.md)."""
    from ..int8_rows import quantize_rows

    core = model.model
    quantize_rows(core.encoder.layers, skip=INT8_KEPT_FLOAT)
    quantize_rows(core.decoder.layers)
    return model


def load_whisper_adapter(source: str = "embedded", device: str = "cpu",
                         dtype: torch.dtype = torch.float32, cache_dir=None,
                         ctc_head: str | None = None, encoder_micro_batch: int = 0,
                         options: WhisperOptions | None = None, quantize: str = "none",
                         encoder_dtype: torch.dtype | None = None,
                         screened_argmax: bool = True,
                         cross_kv_dtype: torch.dtype | None = None) -> WhisperAdapter:
    """Whisper (+ an optional character CTC head: "embedded" or a head directory);
    ``quantize="int8"``: :func:`quantize_int8` (CPU); ``encoder_dtype``: the encoder's own
    dtype (its states are cast to ``dtype`` for the decoder and the CTC head);
    ``screened_argmax``: see :attr:`WhisperAdapter.next_tokens`; ``cross_kv_dtype``: the
    dtype the decoder's cross-attention K/V are projected in (None: the model's)."""
    from .loader import load_whisper

    model, processor = load_whisper(source, device=device, dtype=dtype, cache_dir=cache_dir)
    if encoder_dtype is not None:
        model.model.encoder.to(encoder_dtype)
    if quantize == "int8":
        if torch.device(device).type != "cpu":
            raise ValueError(f"model.quantize=int8 runs on CPU only, not {device}")
        quantize_int8(model)
    elif quantize != "none":
        raise ValueError(f"model.quantize: unknown {quantize!r}")
    head = decode = None
    if ctc_head:
        from .ctc_head import load_ctc_head
        from ...text import charset

        head, decode = load_ctc_head(ctc_head, device=device), charset.decode
    return WhisperAdapter(model, processor, device=device, ctc_head=head, ctc_decode=decode,
                          encoder_micro_batch=encoder_micro_batch, options=options,
                          screened_argmax=screened_argmax, cross_kv_dtype=cross_kv_dtype)


def _first_samples(segments: list[np.ndarray], limit: int) -> np.ndarray:
    """The first ``limit`` samples of ``segments`` joined, copying no more than that (a
    recording of hours has hours of segments)."""
    out, n = [], 0
    for a in segments:
        if n >= limit:
            break
        piece = np.asarray(a, dtype=np.float32)[:limit - n]
        out.append(piece)
        n += len(piece)
    return np.concatenate(out) if out else np.zeros(0, dtype=np.float32)
