"""A decoder kind for the fault suite, registered by the suite only: it needs no model
(nothing is loaded), "transcribes" a segment as its duration, takes a set time per batch
so faults land mid-job, records each actor's pid (so the suite can kill one), and raises
on a poisoned segment: one whose peak is exactly POISON_PEAK, a value that only the
suite's poisoned file has.

``fault_toy2`` is the same first stage with a second: segments longer than PENDING_S are
left pending for a second stage (pooled across batches in the model actor that left
them: actors.stage_loop) that takes a set time per call and records its pid in a file
of its own (``second-<pid>``, read by ``second_stage_pids``)."""
from __future__ import annotations

import os
import sys
import time

import numpy as np

from shardscribe.pipeline.kinds import DECODER_KINDS, DecoderKind
from dataclasses import dataclass

from shardscribe.pipeline.kinds.base import PENDING, PendingState, SegmentResult
from shardscribe.pipeline.models import FAMILIES, ModelFamily

POISON_PEAK = 0.3125
PID_DIR_ENV = "SHARDSCRIBE_FAULT_PID_DIR"
DELAY_ENV = "SHARDSCRIBE_FAULT_DELAY_S"


class DurationDecoder:
    name = "fault_toy"

    def __init__(self, adapter, cfg):
        pid_dir = os.environ.get(PID_DIR_ENV)
        if pid_dir:
            import ray

            node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else "local"
            with open(os.path.join(pid_dir, f"{os.getpid()}"), "w") as fh:
                fh.write(f"{os.getpid()} {node}")
        self.delay = float(os.environ.get(DELAY_ENV, "0"))

    def segment_cost(self, audio) -> int:
        return 1

    def decode(self, audios):
        time.sleep(self.delay)
        if any(a.size and float(np.abs(a).max()) == POISON_PEAK for a in audios):
            raise RuntimeError("poisoned segment")
        return [SegmentResult(f"{a.size / 16000:.2f}", "toy") for a in audios]


PENDING_S = 3.0
SECOND_STAGE = "toy_second"


@dataclass
class ToyPending(PendingState):
    frames: np.ndarray
    text: str


class PendingDurationDecoder(DurationDecoder):
    name = "fault_toy2"

    def decode(self, audios):
        out = super().decode(audios)
        for res, a in zip(out, audios):
            if a.size / 16000 > PENDING_S:
                res.stage, res.pending = PENDING, ToyPending(np.zeros((1, 4), np.float32), res.text)
                res.text = ""
        return out


class ToySecondStage:
    name = "fault_toy2"
    pending_type = ToyPending

    def __init__(self, cfg, first_stage=None):
        pid_dir = os.environ.get(PID_DIR_ENV)
        if pid_dir:
            with open(os.path.join(pid_dir, f"second-{os.getpid()}"), "w") as fh:
                fh.write(f"{os.getpid()} second stage")
        self.delay = float(os.environ.get(DELAY_ENV, "0"))

    def cost(self, result) -> int:
        return 1

    def finish(self, results) -> float:
        time.sleep(self.delay)
        for r in results:
            r.text, r.stage = r.pending.text, SECOND_STAGE
        return self.delay


def second_stage_pids(pid_dir) -> list[int]:
    return [int(f.name.split("-")[1]) for f in os.scandir(pid_dir) if f.name.startswith("second-")]


def _no_capabilities(model_config) -> frozenset:
    return frozenset()


# holds_device: on a cluster with GPUs each model actor holds one, as a model's would
KIND = DecoderKind("fault_toy", DurationDecoder, holds_device=True)
KIND2 = DecoderKind("fault_toy2", PendingDurationDecoder, second_stage=ToySecondStage, holds_device=True)
# has_embedded: its "embedded" model is the toy itself (no checkpoint for the preflight to find)
FAMILY = ModelFamily("fault_family", __name__, capabilities=_no_capabilities, max_segment_s=30.0,
                     max_segment_cost=1, has_embedded=True)
# The toy prices every segment at 1, so its segments never fill a budget: without the
# last key the model stage would join blocks (pipeline.regroup), and the suite's batches,
# each taking the set time, are the input's blocks.
OVERRIDES = ["decoder.kind=fault_toy", "model.family=fault_family", "batching.max_joined_blocks=1"]


def register() -> None:
    """Into this process's registries, and pickled by value for Ray's workers (which
    cannot import this test module)."""
    import ray.cloudpickle

    DECODER_KINDS[KIND.name] = KIND
    DECODER_KINDS[KIND2.name] = KIND2
    FAMILIES[FAMILY.name] = FAMILY
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def unregister(saved_env: dict) -> None:
    """Undo :func:`register`, and put back the environment variables ``saved_env`` held
    (None: unset) before a suite's cluster changed them."""
    DECODER_KINDS.pop(KIND.name, None)
    DECODER_KINDS.pop(KIND2.name, None)
    FAMILIES.pop(FAMILY.name, None)
    for k, v in saved_env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
