"""A new decoder kind, or a new model family, is one registry entry with options of its own,
and touches no library file.

A toy two-stage kind, defined only here, measures each segment in its first stage and
writes the segment's duration as text in its second: its pending state (a dataclass of its
own) must cross the generic runner, the Arrow rows between pools and the Ray object store
without either knowing its fields. The kind brings a config section of its own
(``toy_duration.decimals``) and the toy family a model key of its own (``model.time_unit_ms``):
both are set with ``--set`` style overrides, validated with the key named, and read by the
stages in every worker. It runs through the in-process runner and the Ray plan
on real audio with a broken file mixed in; the reference is the audio file's own length
(soundfile), not our output.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass

import numpy as np
import pyarrow.parquet as pq
import pytest
import soundfile as sf

from shardscribe.actors.local_runner import run_local
from conftest import ray_job_rows
from shardscribe.pipeline.config import ConfigError, load_config
from shardscribe.pipeline.kinds import DECODER_KINDS, DecoderKind, decoder_kind
from shardscribe.pipeline.kinds.base import PENDING, PendingState, SegmentResult
from shardscribe.pipeline.models import FAMILIES, ModelFamily


@dataclass
class Measured(PendingState):
    samples: int
    peak: np.ndarray          # an array field too, so the bytes path carries both kinds


@dataclass
class ToyOptions:
    """The toy kind's own section."""
    decimals: int = 2

    def validate(self, key: str) -> None:
        if not 0 <= self.decimals <= 6:
            raise ConfigError(f"{key}.decimals: must be in [0, 6], got {self.decimals}")


@dataclass
class ToyFamilyOptions:
    """The toy family's own model keys."""
    time_unit_ms: bool = False

    def validate(self, key: str, model) -> None:
        if self.time_unit_ms and model.device.startswith("cuda"):
            raise ConfigError(f"{key}.time_unit_ms: the toy family runs on CPU only")


def _duration_text(seconds: float, cfg) -> str:
    """What the toy writes: the duration, in the family's unit, with the kind's decimals."""
    value = seconds * (1000.0 if getattr(cfg.model, "time_unit_ms", False) else 1.0)
    return f"{value:.{cfg.toy_duration.decimals}f}"


class Measure:
    name = "toy_duration"

    def __init__(self, adapter, cfg):
        assert adapter is None   # the toy needs no model capability, so none is loaded

    def segment_cost(self, audio) -> int:
        return 1

    def decode(self, audios):
        return [SegmentResult("", PENDING, pending=Measured(len(a), np.abs(a).max(keepdims=True)))
                for a in audios]


class Spell:
    name = "toy_duration"
    pending_type = Measured

    def __init__(self, cfg, first_stage):
        self.shared = first_stage is not None
        self.cfg = cfg

    def cost(self, result) -> int:
        return 1

    def finish(self, results) -> float:
        for r in results:
            assert isinstance(r.pending.peak, np.ndarray) and r.pending.peak.shape == (1,)
            r.text, r.stage = _duration_text(r.pending.samples / 16000, self.cfg), "toy"
        return 0.0


TOY = DecoderKind("toy_duration", Measure, Spell, config_section="toy_duration", options=ToyOptions)
# A model family registered only here too: the toy kind needs no capability, so its model
# is never loaded, but every worker must still know the family the config names.
TOY_FAMILY = ModelFamily("toy_family", __name__, capabilities=lambda m: frozenset(), max_segment_s=30.0,
                         max_segment_cost=1, options=ToyFamilyOptions)


@pytest.fixture
def toy_registered(monkeypatch):
    monkeypatch.setitem(DECODER_KINDS, TOY.name, TOY)
    monkeypatch.setitem(FAMILIES, TOY_FAMILY.name, TOY_FAMILY)
    # Ray ships the kind to its workers; this test module is not importable there.
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield TOY
    ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def manifest(tmp_path_factory, samples_dir, sample_manifest):
    root = tmp_path_factory.mktemp("toy")
    rows = [{"id": m["id"], "audio": str(samples_dir / m["audio"])} for m in sample_manifest[:4]]
    (root / "broken.wav").write_bytes(b"not audio at all" * 20)
    rows.append({"id": "broken", "audio": str(root / "broken.wav")})
    return rows


def _check(rows_out, rows_in, decimals: int = 2, scale: float = 1.0):
    assert sorted(r["id"] for r in rows_out) == sorted(r["id"] for r in rows_in)
    by_id = {r["id"]: r for r in rows_out}
    assert by_id["broken"]["error"] and by_id["broken"]["text"] is None
    for row in rows_in:
        if row["id"] == "broken":
            continue
        out = by_id[row["id"]]
        assert out["error"] is None and out["stage"] == "toy" and out["decoder"] == "toy_duration"
        segs = out["segments"]
        assert segs and all(s["text"] == f"{(s['end'] - s['start']) * scale:.{decimals}f}" for s in segs)
        info = sf.info(row["audio"])
        spoken = sum(float(s["text"]) for s in segs) / scale
        assert 0 < spoken <= info.frames / info.samplerate + 0.01


def test_config_names_registered_kinds_only(toy_registered):
    assert load_config("ar", ["decoder.kind=toy_duration"]).decoder.kind == "toy_duration"
    with pytest.raises(ConfigError, match="decoder.kind"):
        load_config("ar", ["decoder.kind=no_such_kind"])
    with pytest.raises(ConfigError, match="decoder.pack_windows"):
        load_config("ar", ["decoder.kind=toy_duration", "decoder.pack_windows=true"])
    assert decoder_kind("toy_duration") is TOY


def test_a_kind_needing_a_capability_the_model_lacks_fails_before_any_worker():
    with pytest.raises(ConfigError, match=r"model: decoder.kind=ctc_greedy needs a model with ctc.*model.ctc_head"):
        load_config("ar", ["decoder.kind=ctc_greedy"])


def test_the_kinds_and_the_familys_own_options_are_config_keys(toy_registered):
    """The toy section and the toy family's key exist only while registered, take their
    defaults, are type-checked and validated by their own dataclasses, and a key of the toy
    family is refused on another family's model."""
    cfg = load_config("ar", ["decoder.kind=toy_duration", "model.family=toy_family", "toy_duration.decimals=4",
                             "model.time_unit_ms=true"])
    assert (cfg.toy_duration.decimals, cfg.model.time_unit_ms) == (4, True)
    assert cfg.to_dict()["toy_duration"] == {"decimals": 4} and cfg.to_dict()["model"]["time_unit_ms"] is True
    assert load_config("ssd").toy_duration.decimals == 2          # every job has the section
    for overrides, message in (
            (["toy_duration.decimals=9"], r"toy_duration.decimals: must be in \[0, 6\]"),
            (["toy_duration.decimals=two"], "toy_duration.decimals: expected int"),
            (["toy_duration.digits=3"], "toy_duration.digits: unknown key"),
            (["model.family=toy_family", "model.time_unit_ms=true", "model.device=cuda"],
             "model.time_unit_ms: the toy family runs on CPU only"),
            (["model.time_unit_ms=true"], "model.time_unit_ms: only ToyFamilyOptions have it, model.family=whisper"),
            (["model.family=toy_family", "model.quantize=int8"], "model.quantize: only Whisper models have it")):
        with pytest.raises(ConfigError, match=message):
            load_config("ar", ["decoder.kind=toy_duration", *overrides])


def test_unregistered_sections_are_unknown_keys():
    with pytest.raises(ConfigError, match="toy_duration: unknown key"):
        load_config("ar", ["toy_duration.decimals=3"])


def test_toy_kind_in_process(toy_registered, manifest, tmp_path):
    cfg = load_config("ar", ["decoder.kind=toy_duration", "toy_duration.decimals=3",
                             "model.family=toy_family", "model.time_unit_ms=true"])
    assert run_local(manifest, cfg, str(tmp_path), progress=False) == len(manifest)
    _check(pq.read_table(sorted(str(p) for p in tmp_path.glob("*.parquet"))).to_pylist(), manifest,
           decimals=3, scale=1000.0)


@pytest.mark.slow      # starts a Ray instance: the fast tier runs the same kind in process
def test_toy_kind_through_the_ray_plan(toy_registered, manifest, tmp_path):
    cfg = load_config("ar", ["decoder.kind=toy_duration", "model.family=toy_family", "toy_duration.decimals=1",
                             "model.time_unit_ms=true", "batching.recordings_per_batch=2", "ray.num_cpus=4"])
    rows = ray_job_rows(manifest, cfg, tmp_path / "out")
    _check(rows, manifest, decimals=1, scale=1000.0)
    assert json.dumps([r["id"] for r in rows])  # plain rows, nothing of the toy's state left
    assert "pending_state" not in rows[0]
