"""The ``ssd`` kind: "Self-Speculative Decoding for LLM-based ASR with CTC Encoder Drafts"
(CTC draft, entropy gate, one verification pass, AR fallback from the verified prefix)."""
from __future__ import annotations

from dataclasses import dataclass, field

from ...config_values import ConfigError, choice, at_least, coerce
from ..ar import map_drafting_key
from ...decoding.drafting.draft_sync import LOOKAHEAD_RULES
from ..registry import DecoderKind, register_decoder_kind
from ...models.base import ATTENTION_DECODER, CTC, PACKABLE


@dataclass
class SSDOptions:
    """Self-speculative decoding thresholds: a named preset, optionally overridden."""
    preset: str = "high_accuracy"
    tau_ctc: float | None = None      # overrides the preset's gate threshold (nats)
    tau_slm: float | None = None      # overrides the preset's verification threshold
    reuse_kv: bool = True             # fallback starts from the verification KV cache (eqs. 6-7)
    verify_max_entropy: float | None = None  # skip verification at/above this max entropy (nats): straight to AR
    lookahead: int = 0                # fallback feeds up to this many draft tokens per step (0: plain AR)
    lookahead_rule: str = "greedy"    # greedy: keep argmax guesses (plain AR's text) | tau_slm: eq. 5 again
    # tau_slm: eq. 5 (a draft token passes above tau_slm) | greedy: only the decoder's own
    # argmax passes and the gate is off, so the text is greedy AR's (for a fitted head)
    verify_rule: str = "tau_slm"
    # Gate on packed-window drafts (null: the preset's, else false). Off in both presets:
    # a packed draft, hence an accepted text, depends on the clips sharing its window.
    pack_gate: bool | None = None
    gate_verify_tau: float | None = None  # gated drafts verified at this tau too (null: the preset's, else off)
    # Calibrate tau_ctc online so that at most this share of the drafts the gate accepts
    # would be rejected by verification; tau_ctc is then the cap (pipeline.decoding.ssd.gate_calibration).
    # null: the preset's, else off (tau_ctc fixed, the paper's gate).
    max_draft_error: float | None = None
    # With pack_gate: pack a batch only while the running gate pass rate is above that
    # batch's break-even (pipeline.decoding.ssd.pack_gate_policy); false packs every batch.
    adaptive_pack_gate: bool = True
    # Draft and verify a batch only while the first pass pays for itself in tokens the
    # fallback need not decode (pipeline.decoding.ssd.verify_policy); a skipped batch is decoded as plain
    # AR, so where drafts do not pay the job runs at the ar kind's speed. null (the
    # default): on; false: every batch drafts (SSD's texts on every row, whatever they cost).
    # null rather than true keeps config_hash as it was when null meant "off unless
    # max_draft_error".
    adaptive_verify: bool | None = None
    # Its break-even in tokens decided per segment (null: measured as the job runs, from
    # timings, so that which batches draft, hence their text, may differ between runs).
    verify_break_even: float | None = None
    # In-job adaptation of the CTC draft head (pipeline.kinds.ssd.adapt): each model
    # actor decodes its first adapt_audio_minutes of audio as plain AR, fits the head on
    # those transcripts for at most adapt_fit_minutes, then drafts with it; the head is
    # saved in adapt_dir (the job sets DST/__shardscribe__/draft_head), where a later
    # actor, rerun or job finds it and drafts with it at once.
    adapt: bool = False
    adapt_audio_minutes: float = 30.0
    adapt_fit_minutes: float = 5.0
    adapt_epochs: int = 40
    adapt_lr: float = 1e-3
    adapt_dir: str | None = None
    # Keys added after outputs were written: hashed only once set off their default.
    HASHED_WHEN_SET = ("adapt", "adapt_audio_minutes", "adapt_fit_minutes", "adapt_epochs", "adapt_lr",
                       "verify_rule")
    EXECUTION_KEYS = ("adapt_dir",)   # where the head is kept, not what it is
    # Named threshold sets (docs/ssd.md has how each was chosen and what it measured).
    # Mappings whose entries a config replaces whole instead of merging them into the
    # defaults' entry of the same name: a preset that leaves out a key must not inherit it
    # from the shipped preset (that would switch on, e.g., its packed gate).
    REPLACED_WHOLE = ("presets",)
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
                coerce(f"{key}.presets.{name}.{k}", v, self.PRESET_KEYS[k])
        choice(f"{key}.preset", self.preset, tuple(self.presets))
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
        at_least(f"{key}.lookahead", self.lookahead, 0)
        at_least(f"{key}.adapt_audio_minutes", self.adapt_audio_minutes, 0.0)
        at_least(f"{key}.adapt_fit_minutes", self.adapt_fit_minutes, 0.0)
        at_least(f"{key}.adapt_epochs", self.adapt_epochs, 1)
        if not self.adapt_lr > 0:
            raise ConfigError(f"{key}.adapt_lr: must be > 0, got {self.adapt_lr}")
        choice(f"{key}.lookahead_rule", self.lookahead_rule, LOOKAHEAD_RULES)
        choice(f"{key}.verify_rule", self.verify_rule, LOOKAHEAD_RULES)
        if self.verify_rule == "greedy":
            gates = [k for k, on in (("pack_gate", self.packs_gate()), ("max_draft_error", target is not None),
                                     ("lookahead_rule", self.lookahead_rule != "greedy")) if on]
            if gates:
                raise ConfigError(f"{key}.verify_rule: greedy verifies every draft against greedy AR's tokens; "
                                  f"it cannot join {key}.{gates[0]} (a gate or rule that accepts other text)")
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

    def verifies_adaptively(self) -> bool:
        """ssd.adaptive_verify resolved: as set, else on."""
        return True if self.adaptive_verify is None else bool(self.adaptive_verify)


def _config_needs(cfg) -> frozenset:
    return frozenset({PACKABLE}) if cfg.ssd.packs_gate() else frozenset()


def _check_config(cfg) -> None:
    if cfg.ssd.adapt and cfg.model.family != "whisper":
        raise ConfigError(f"ssd.adapt: fits the character CTC draft head of Whisper checkpoints; "
                          f"model.family={cfg.model.family} drafts with its own CTC output")
    drafting = map_drafting_key(cfg)
    if drafting is not None and cfg.ssd.lookahead and cfg.ssd.lookahead_rule != "greedy":
        raise ConfigError(f"{drafting}: token-map drafting verifies greedily; "
                          f"ssd.lookahead_rule={cfg.ssd.lookahead_rule} cannot draft with it")


KIND = register_decoder_kind(DecoderKind(
    "ssd", "shardscribe.pipeline.kinds.ssd.stages:build_first_pass", "shardscribe.pipeline.kinds.ssd.stages:build_fallback",
    needs=frozenset({CTC, ATTENTION_DECODER}), config_section="ssd", options=SSDOptions,
    config_needs=_config_needs, check_config=_check_config,
    prepare_job="shardscribe.pipeline.kinds.ssd.job:prepare_job", summary_entries="shardscribe.pipeline.kinds.ssd.job:summary_entries",
    # a segment the fallback decoded as plain AR, with no draft (stage "ar"), has the ar
    # kind's evidence: its calibration
    calibration_fallbacks={"ar": "ar:ar"}))
