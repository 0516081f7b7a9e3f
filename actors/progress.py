"""Live job progress: rows, audio seconds and errors of each block of finished rows, as
the runner takes it (the local runner's batches; on Ray, the blocks the driver takes to
commit, so the count is never ahead of what a commit holds). Ray Data's own progress
display counts blocks, not recordings, so a job switches it off.
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc


def block_counts(batch: pa.Table) -> tuple[int, float, int]:
    """(rows, audio seconds, rows with an error) of a block of output rows."""
    audio = pc.sum(batch.column("duration_s")).as_py() or 0.0
    return batch.num_rows, float(audio), batch.num_rows - batch.column("error").null_count


def hide_ray_data_progress() -> None:
    """Switch Ray Data's own progress bars off: they count blocks, not recordings, and the
    job's console shows the rows the driver takes."""
    from ray.data import DataContext

    DataContext.get_current().enable_progress_bars = False


def shutdown_ray() -> None:
    """Disconnect the driver, so that no worker's output arrives after the job's summary."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
