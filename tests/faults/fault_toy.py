"""A decoder kind for the fault suite, registered by the suite only: it needs no model
(nothing is loaded), "transcribes" a segment as its duration, takes a set time per batch
so faults land mid-job, records each actor's pid (so the suite can kill one), and raises
on a poisoned segment: one whose peak is exactly POISON_PEAK, a value that only the
suite's poisoned file has."""
from __future__ import annotations

import os
import sys
import time

import numpy as np

from pipeline.decoders import DECODER_KINDS, DecoderKind
from pipeline.decoders.base import SegmentResult
from pipeline.models import FAMILIES, ModelFamily

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


def _no_capabilities(model_config) -> frozenset:
    return frozenset()


KIND = DecoderKind("fault_toy", DurationDecoder)
# has_embedded: its "embedded" model is the toy itself (no checkpoint for the preflight to find)
FAMILY = ModelFamily("fault_family", __name__, capabilities=_no_capabilities, max_segment_s=30.0,
                     max_segment_cost=1, has_embedded=True)
OVERRIDES = ["decoder.kind=fault_toy", "model.family=fault_family"]


def register() -> None:
    """Into this process's registries, and pickled by value for Ray's workers (which
    cannot import this test module)."""
    import ray.cloudpickle

    DECODER_KINDS[KIND.name] = KIND
    FAMILIES[FAMILY.name] = FAMILY
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
