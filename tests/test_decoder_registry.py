"""A new decoder kind is one registry entry and touches no library file.

A toy two-stage kind, defined only here, measures each segment in its first stage and
writes the segment's duration as text in its second: its pending state (a dataclass of its
own) must cross the generic runner, the Arrow rows between pools and the Ray object store
without either knowing its fields. It runs through the in-process runner and the Ray plan
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

from actors.local_runner import run_local
from conftest import ray_job_rows
from pipeline.config import ConfigError, load_config
from pipeline.decoders import DECODER_KINDS, DecoderKind, decoder_kind
from pipeline.decoders.base import PENDING, PendingState, SegmentResult
from pipeline.models import FAMILIES, ModelFamily


@dataclass
class Measured(PendingState):
    samples: int
    peak: np.ndarray          # an array field too, so the bytes path carries both kinds


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

    def cost(self, result) -> int:
        return 1

    def finish(self, results) -> float:
        for r in results:
            assert isinstance(r.pending.peak, np.ndarray) and r.pending.peak.shape == (1,)
            r.text, r.stage = f"{r.pending.samples / 16000:.2f}", "toy"
        return 0.0


TOY = DecoderKind("toy_duration", Measure, Spell)
# A model family registered only here too: the toy kind needs no capability, so its model
# is never loaded, but every worker must still know the family the config names.
TOY_FAMILY = ModelFamily("toy_family", __name__, capabilities=lambda m: frozenset(), max_segment_s=30.0,
                         max_segment_cost=1)


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


def _check(rows_out, rows_in):
    assert sorted(r["id"] for r in rows_out) == sorted(r["id"] for r in rows_in)
    by_id = {r["id"]: r for r in rows_out}
    assert by_id["broken"]["error"] and by_id["broken"]["text"] is None
    for row in rows_in:
        if row["id"] == "broken":
            continue
        out = by_id[row["id"]]
        assert out["error"] is None and out["stage"] == "toy" and out["decoder"] == "toy_duration"
        segs = out["segments"]
        assert segs and all(s["text"] == f"{s['end'] - s['start']:.2f}" for s in segs)
        info = sf.info(row["audio"])
        spoken = sum(float(s["text"]) for s in segs)
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


def test_toy_kind_in_process(toy_registered, manifest, tmp_path):
    cfg = load_config("ar", ["decoder.kind=toy_duration"])
    assert run_local(manifest, cfg, str(tmp_path), progress=False) == len(manifest)
    _check(pq.read_table(sorted(str(p) for p in tmp_path.glob("*.parquet"))).to_pylist(), manifest)


def test_toy_kind_through_the_ray_plan(toy_registered, manifest, tmp_path):
    cfg = load_config("ar", ["decoder.kind=toy_duration", "model.family=toy_family",
                             "batching.recordings_per_batch=2", "ray.num_cpus=4"])
    rows = ray_job_rows(manifest, cfg, tmp_path / "out")
    _check(rows, manifest)
    assert json.dumps([r["id"] for r in rows])  # plain rows, nothing of the toy's state left
    assert "pending_state" not in rows[0]
