"""The decoder-kind registry: what a kind is made of and what it needs.

An entry says what a kind is made of and what it needs, so config validation, the actors,
the Ray plan and the in-process runner never name a kind:
- ``first_stage(adapter, cfg)``: builds the segment decoder the model actor runs;
- ``second_stage(cfg, first_stage)``: optional; builds the finisher of the pending
  results, run by a second actor pool. ``first_stage`` is the first stage's decoder when
  both share a process (so its model and in-process state can be reused), else None; a
  second stage that needs a model and gets None loads its own;
- ``needs``: capabilities the model must have (pipeline.models.base), and
  ``config_needs(cfg)`` those that options of the kind add (SSD's packed gate packs);
- ``packs_windows``: whether ``decoder.pack_windows`` may be set (it reads encoder
  states alone, so clips may share encoder windows);
- ``options`` and ``config_section``: the dataclass of the kind's own options and the
  JobConfig section that holds them (``cfg.<section>``), so a kind of your own brings its
  keys with it (validated by the dataclass's ``validate(key)``, set with ``--set``);
- ``check_config(cfg)``: checks across sections (the kind's options against the decoder's);
- ``preflight(cfg)``: checks against the model's files, run by the driver;
- ``traits``: what else the kind's decoding loop offers (``AR_LOOP``: Whisper's full greedy
  loop, which per-row prompts, language detection and timestamp rules need);
- ``check_shared(cfg, kind)``: checks the kind's options that other kinds' jobs read too
  (the token map, which SSD's fallback drafts with) against the job's kind, whichever it
  is: run for every registered kind, not only the selected one.

A kind also owns its part of the job around the workers, so the job runner (actors.job)
stays the same for every kind:
- ``prepare_job(cfg, dst)``: adjusts ``cfg`` for the output folder ``dst`` before the job
  starts (SSD keeps its adapted draft head in DST's sidecar, so a rerun or a resumed job
  drafts with it at once);
- ``summary_entries(cfg, dst, started_at, rows_run)``: what the kind adds to summary.json
  after the run (the online token map's figures, the adapted head); ``rows_run`` is the
  number of recordings this run transcribed, ``started_at`` its start (``time.time()``);
- ``verb``: the console's word for what the job does (``audit`` validates, the others
  transcribe);
- ``untranscribed_stages``: the segment stages whose rows carry no transcript, so the
  summary scores no WER on them (``audit``'s);
- ``calibration_fallbacks``: segment stage -> the confidence calibration key
  (``"<kind>:<stage>"``, pipeline.confidence.calibration) a stage without its own map
  uses; SSD's segments decoded as plain AR have the ``ar`` kind's evidence.

Factories are "module:attribute" strings (imported when used, so validating a config does
not import torch) or callables. A DecoderKind travels to Ray actors with the plan, so a
kind registered by a user's own code works in every worker without touching this package.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable, Mapping

from ..models.base import AR_LOOP  # noqa: F401 - the traits a kind may declare


def _resolve(ref):
    if callable(ref):
        return ref
    module, attr = ref.split(":")
    return getattr(importlib.import_module(module), attr)


@dataclass(frozen=True)
class DecoderKind:
    name: str
    first_stage: str | Callable
    second_stage: str | Callable | None = None
    needs: frozenset = field(default_factory=frozenset)
    packs_windows: bool = False
    config_section: str | None = None
    options: type | None = None           # a dataclass; its instance is cfg.<config_section>
    check_config: Callable | None = None   # cfg -> None, raising pipeline.config_values.ConfigError
    traits: frozenset = field(default_factory=frozenset)
    config_needs: Callable | None = None   # cfg -> extra capabilities the kind's options need
    # "module:function" (or a callable): cfg -> None, raising pipeline.models.errors.ModelError
    # where the kind's options do not fit the model's files; the driver runs it before any
    # worker starts (it may read checkpoint configs, never weights)
    preflight: str | Callable | None = None
    # Whether a Ray model actor of this kind holds a GPU where the cluster has them; None:
    # where it needs a model capability (``needs``), so ``audit`` takes none.
    holds_device: bool | None = None
    # The job-level hooks ("module:function" or callables; the module docstring has what each is for).
    check_shared: str | Callable | None = None     # (cfg, kind) -> None, raising ConfigError
    prepare_job: str | Callable | None = None      # (cfg, dst) -> None
    summary_entries: str | Callable | None = None  # (cfg, dst, started_at, rows_run) -> dict
    verb: str = "transcribing"
    untranscribed_stages: frozenset = field(default_factory=frozenset)
    calibration_fallbacks: Mapping[str, str] = field(default_factory=dict, hash=False)

    @property
    def two_stage(self) -> bool:
        return self.second_stage is not None

    @property
    def uses_device(self) -> bool:
        return bool(self.needs) if self.holds_device is None else self.holds_device

    def needs_for(self, cfg) -> frozenset:
        """Capabilities the model must have for this kind under ``cfg``."""
        return self.needs | (frozenset(self.config_needs(cfg)) if self.config_needs else frozenset())

    def check(self, cfg) -> None:
        """The kind's preflight of ``cfg`` (a no-op for a kind with none)."""
        if self.preflight is not None:
            _resolve(self.preflight)(cfg)

    def check_against(self, cfg, kind: "DecoderKind") -> None:
        """This kind's shared options in ``cfg`` against the job's ``kind`` (a no-op for a
        kind with none)."""
        if self.check_shared is not None:
            _resolve(self.check_shared)(cfg, kind)

    def prepare(self, cfg, dst: str) -> None:
        """The kind's set-up of ``cfg`` for the output folder ``dst``, before the job."""
        if self.prepare_job is not None:
            _resolve(self.prepare_job)(cfg, dst)

    def summary(self, cfg, dst: str, started_at: float, rows_run: int) -> dict:
        """The kind's entries of the job's summary.json (none for a kind with no hook)."""
        if self.summary_entries is None:
            return {}
        return _resolve(self.summary_entries)(cfg, dst, started_at, rows_run)

    def build_first_stage(self, adapter, cfg):
        return _resolve(self.first_stage)(adapter, cfg)

    def build_second_stage(self, cfg, first_stage=None):
        return _resolve(self.second_stage)(cfg, first_stage)



DECODER_KINDS: dict[str, DecoderKind] = {}


def register_decoder_kind(kind: DecoderKind) -> DecoderKind:
    if kind.options is not None and not kind.config_section:
        raise ValueError(f"decoder kind {kind.name!r}: options need a config_section")
    for other in DECODER_KINDS.values():
        if other.name != kind.name and kind.config_section and other.config_section == kind.config_section:
            raise ValueError(f"decoder kind {kind.name!r}: section {kind.config_section!r} belongs to {other.name!r}")
    DECODER_KINDS[kind.name] = kind
    return kind


def option_sections() -> dict[str, type]:
    """The JobConfig sections the registered kinds bring: section name -> dataclass."""
    return {k.config_section: k.options for k in DECODER_KINDS.values() if k.options is not None}


def untranscribed_stages() -> frozenset:
    """The segment stages of every registered kind whose rows carry no transcript: the rows
    of a folder may come from another kind's run (--resume)."""
    return frozenset().union(*(k.untranscribed_stages for k in DECODER_KINDS.values()))


def decoder_kind(name: str) -> DecoderKind:
    try:
        return DECODER_KINDS[name]
    except KeyError:
        raise KeyError(f"no decoder kind {name!r} (known: {', '.join(sorted(DECODER_KINDS))})") from None
