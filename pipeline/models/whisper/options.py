"""The whisper family's own config keys (``model.<key>``): the decoder prompt, timestamps,
the CTC draft head, and the CPU precision choices. Imports no torch, so a config is
validated without it."""
from __future__ import annotations

import re
from dataclasses import dataclass

from ...config_values import ConfigError, at_least, choice
from ..base import AR_LOOP, ATTENTION_DECODER

WHISPER_TASKS = ("transcribe", "translate")
# Options that change Whisper's decoding: the decoder kinds with an attention decoder read
# them; some need a kind with the full AR loop (per-row prompts, timestamp rules).
PROMPT_OPTIONS = ("language", "task", "initial_prompt")
AR_ONLY_OPTIONS = ("timestamps", "word_timestamps")
_LANGUAGE_CODE = r"[a-z]{2,3}|[a-z]{2}-[a-z]{2,4}"
# model.source of the shipped Whisper models (loader.py's EMBEDDED, EMBEDDED_BASE; that
# module imports torch, which validating a config must not).
SHIPPED_SOURCES = ("embedded", "embedded-base")
QUANTIZE_CHOICES = ("auto", "none", "int8")   # model.quantize (pipeline.device.quantize_name resolves auto)


@dataclass
class WhisperModelOptions:
    OWNERS = "Whisper models"
    # Not in config_hash: how fast the same model runs. model.quantize is one though it moves
    # a few words: folders written before its auto default resume on any CPU, and int8's
    # WER stays within +2% relative of float32's (docs/engines.md).
    EXECUTION_KEYS = ("screened_argmax", "encoder_micro_batch", "quantize")
    FILE_KEYS = ("ctc_head",)                                     # hashed by content
    LANGUAGE_DETECTION = ("recording", "segment")                 # model.language_detection's values

    ctc_head: str | None = None       # whisper: "embedded" (the shipped head), a head directory, or null
    # Segments per encoder call: a batch is encoded in slices of this many (0: whole
    # batches; null: the family's default for the device, e.g. Whisper's on CPU).
    encoder_micro_batch: int | None = None
    # Whisper's decoder prompt (docs/ar.md, "Whisper options"). language: a code such as
    # "de" (checked against the checkpoint's languages before any worker starts), "auto"
    # (detected from Whisper's language token, see language_detection), or null: the
    # model's own default (none on an English-only model, "en" on a multilingual one).
    language: str | None = None
    # With language=auto: where the language is detected. recording: once per recording,
    # on up to its first 30 s of speech (its segments joined, as faster-whisper detects on
    # the VAD-filtered audio), and every segment is decoded in it; segment: each segment on
    # its own (for recordings that change language). docs/languages.md has the figures.
    language_detection: str = "recording"
    # With language=auto: the languages the detection may pick, e.g. [es, fr] (null: any of
    # the model's); the probability written is then the one among these.
    language_candidates: list | None = None
    task: str = "transcribe"          # transcribe | translate (into English; multilingual models)
    initial_prompt: str | None = None  # text the decoder reads as previous text (<|startofprev|>)
    timestamps: bool = False          # decode with Whisper's timestamp tokens: segments[].spans
    word_timestamps: bool = False     # segments[].words from cross-attention alignment (DTW)

    # auto | none | int8. int8: the encoder's and decoder's Linear layers with int8 weights
    # (but the encoder's fc2 and the output projection: adapter.quantize_int8), one scale
    # per output channel, activations quantised at run time with one scale per token
    # (models.int8_rows on torch's fbgemm/oneDNN kernels; CPU only), so a clip's text does
    # not depend on its batch. auto: int8 on a CPU without
    # native bfloat16 (neither AMX nor AVX512-BF16, pipeline.device.cpu_bf16_native),
    # none elsewhere (such a CPU runs the encoder in bfloat16 instead, a GPU its dtype).
    # Changes a few words (figures: docs/engines.md); not in config_hash.
    quantize: str = "auto"
    # The encoder's own dtype (null: model.dtype); bfloat16 on CPU needs AMX or AVX512-BF16.
    # auto: bfloat16 on a CPU that has them, with model.dtype float32 (the encoder is ~70%
    # of a CPU job; WER within faster-whisper's +2% on held-out and real speech, figures:
    # docs/engines.md), else model.dtype. Transcripts then depend on the CPU's flags.
    encoder_dtype: str | None = "auto"
    # The dtype of the decoder's cross-attention K/V projection, a function of the encoder
    # states alone (pipeline.models.whisper.cross_projection). auto: the encoder's dtype as
    # model.encoder_dtype resolves it; null: model.dtype.
    cross_kv_dtype: str | None = "auto"
    # Whisper: greedy steps pick their token through a low-precision screen of the output
    # projection, rescored in float32 (pipeline.models.screened_argmax): the float32
    # argmax for a half (bfloat16, on a CPU with AMX or AVX512-BF16) or a quarter (int8
    # through fbgemm, other x86 CPUs) of the weight traffic. Applies to a float32 decoder
    # on a CPU; elsewhere, and when false, the full product.
    screened_argmax: bool = True


    def validate(self, key: str, model) -> None:
        choice(f"{key}.task", self.task, WHISPER_TASKS)
        if self.language is not None and not re.fullmatch(rf"auto|{_LANGUAGE_CODE}", self.language):
            raise ConfigError(f"{key}.language: expected a language code such as en or de, auto, or null; "
                              f"got {self.language!r}")
        choice(f"{key}.language_detection", self.language_detection, self.LANGUAGE_DETECTION)
        if self.language_candidates is not None:
            found = self.language_candidates
            if (not isinstance(found, list) or not found
                    or not all(isinstance(c, str) and re.fullmatch(_LANGUAGE_CODE, c) for c in found)):
                raise ConfigError(f"{key}.language_candidates: expected a list of language codes such as [es, fr], "
                                  f"or null; got {found!r}")
            if self.language != "auto":
                raise ConfigError(f"{key}.language_candidates: restricts the detection of model.language=auto; "
                                  f"model.language={self.language}")
        choice(f"{key}.quantize", self.quantize, QUANTIZE_CHOICES)
        for name in ("encoder_dtype", "cross_kv_dtype"):
            if getattr(self, name) is not None:
                choice(f"{key}.{name}", getattr(self, name), ("auto", "float32", "float16", "bfloat16"))
        # int8 runs on the CPU only, where model.dtype=auto is float32.
        dtype = "float32" if model.dtype == "auto" else model.dtype
        if self.quantize == "int8" and self.cross_kv_dtype not in (None, "auto", dtype):
            raise ConfigError(f"{key}.cross_kv_dtype: the cross-attention projections are {self.quantize} "
                              f"under model.quantize={self.quantize}; leave it auto")
        if self.quantize == "int8" and model.device.startswith("cuda"):
            raise ConfigError(f"{key}.quantize: {self.quantize} runs on CPU only, model.device={model.device}")
        if self.encoder_micro_batch is not None:
            at_least(f"{key}.encoder_micro_batch", self.encoder_micro_batch, 0)

    def check_job(self, cfg, kind, kinds) -> None:
        """The prompt options need an attention decoder; detection, timestamps and word
        times need a kind with the full AR loop (``kinds``: every registered kind, to name
        those). Token-map drafting checks itself against ``timestamps`` (its kind's
        ``check_shared``)."""
        default = WhisperModelOptions()
        set_options = [o for o in PROMPT_OPTIONS + AR_ONLY_OPTIONS if getattr(self, o) != getattr(default, o)]
        if not set_options:
            return
        if cfg.model.family != "whisper":
            raise ConfigError(f"model.{set_options[0]}: a Whisper option; model.family={cfg.model.family}")
        if ATTENTION_DECODER not in kind.needs_for(cfg):
            raise ConfigError(f"model.{set_options[0]}: decoder.kind={kind.name} does not run Whisper's decoder")
        ar_only = [o for o in AR_ONLY_OPTIONS if getattr(self, o)] + (["language"] if self.language == "auto" else [])
        if ar_only and AR_LOOP not in kind.traits:
            option = ar_only[0] + ("=auto" if ar_only[0] == "language" else "")
            loops = ", ".join(n for n, k in kinds.items() if AR_LOOP in k.traits)
            raise ConfigError(f"model.{option}: only decoder.kind={loops} decodes with it, not {kind.name}")

    @staticmethod
    def runs_bf16(model) -> bool:
        """Whether the checkpoint runs in bfloat16 under model.dtype=auto on CUDA
        (pipeline.device.runs_bf16): not the shipped Whisper models, whose decoder flips
        words in bfloat16 (tiny.en: 7 clips' WER 1.5% -> 7.6%, docs/engines.md); they stay
        float32 (TF32 on CUDA). The ctc family's embedded model reads the encoder's output
        alone, which model.encoder_dtype=auto already runs in bfloat16 on CPUs that have it."""
        return not (model.family == "whisper" and model.source in SHIPPED_SOURCES)

    @staticmethod
    def canonical(model: dict) -> None:
        """What ``auto`` means on this machine, for config_hash: null where it changes
        nothing, so configs that do not use it hash as before the default existed.
        model.dtype is common to every family, but config_hash runs each registered
        family's ``canonical`` on the one model section, this one among them: its ``auto``
        hashes as float32 (pipeline.device.hashed_dtype_name), the old default."""
        from ...device import cross_kv_dtype_name, encoder_dtype_name, hashed_dtype_name

        model["dtype"] = hashed_dtype_name(model.get("dtype", "float32"))
        encoder = encoder_dtype_name(model.get("encoder_dtype"), model.get("device", "auto"),
                                     model.get("dtype", "float32"))
        cross = cross_kv_dtype_name(model.pop("cross_kv_dtype", None), encoder, model.get("dtype", "float32"))
        model["encoder_dtype"] = encoder
        # model.quantize is an execution key (stripped before this runs); its entry stays
        # at the value every hash had before auto existed, so their folders still resume.
        model["quantize"] = "none"
        # Detection keys change nothing without model.language=auto: hashed only with it.
        if model.get("language") != "auto":
            model.pop("language_detection", None)
            model.pop("language_candidates", None)
        if cross is not None:
            model["cross_kv_dtype"] = cross
