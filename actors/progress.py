"""Live job progress from a Ray Data plan: rows, audio seconds and errors as the rows
leave the last stage.

A last map step (a small task per block) counts each finished block and sends the
counts to one small tally actor, which the driver polls for the console's progress bar.
Ray Data's own progress display counts blocks, not recordings, so it is switched off
while a tally is in use.
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc


class _Tally:
    def __init__(self):
        self.rows = 0
        self.audio_s = 0.0
        self.errors = 0

    def add(self, rows: int, audio_s: float, errors: int) -> None:
        self.rows += rows
        self.audio_s += audio_s
        self.errors += errors

    def totals(self) -> tuple[int, float, int]:
        return self.rows, self.audio_s, self.errors


def block_counts(batch: pa.Table) -> tuple[int, float, int]:
    """(rows, audio seconds, rows with an error) of a block of output rows."""
    audio = pc.sum(batch.column("duration_s")).as_py() or 0.0
    return batch.num_rows, float(audio), batch.num_rows - batch.column("error").null_count


def _count_block(batch: pa.Table, tally) -> pa.Table:
    tally.add.remote(*block_counts(batch))
    return batch


class RayTally:
    """The tally actor and the map step that feeds it. ``attach(ds)`` appends the step;
    ``totals()`` reads the counts so far (None while the actor does not answer)."""

    def __init__(self):
        import ray
        from ray.data import DataContext

        DataContext.get_current().enable_progress_bars = False
        self._actor = ray.remote(num_cpus=0)(_Tally).remote()

    def attach(self, ds):
        return ds.map_batches(_count_block, fn_kwargs={"tally": self._actor}, batch_size=None,
                              batch_format="pyarrow", zero_copy_batch=True)

    def totals(self, timeout_s: float = 2.0) -> tuple[int, float, int] | None:
        import ray

        try:
            return ray.get(self._actor.totals.remote(), timeout=timeout_s)
        except Exception:
            return None


def shutdown_ray() -> None:
    """Disconnect the driver, so that no worker's output arrives after the job's summary."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
