"""Live job progress: rows, audio seconds and errors of each block of finished rows, as
the runner finishes it (the local runner's batches; on Ray, the model actors' reports).
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc


def block_counts(batch: pa.Table) -> tuple[int, float, int, float]:
    """(rows, audio seconds, rows with an error, partial recordings) of a block of output
    rows: the last is for the pieces of long recordings (pipeline.pieces), 0 here."""
    audio = pc.sum(batch.column("duration_s")).as_py() or 0.0
    return batch.num_rows, float(audio), batch.num_rows - batch.column("error").null_count, 0.0


def shutdown_ray() -> None:
    """Disconnect the driver, so that no worker's output arrives after the job's summary."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
