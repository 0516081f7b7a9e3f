"""Ray Data sink for the output folder's commit protocol (pipeline.output): each write
task gets at least ``output.rows_per_part`` rows (Ray bundles blocks before the task, no
shuffle) and commits them as one part, temporary name then rename, named by its ids, so a
retried task replaces its own part."""
from __future__ import annotations

import pyarrow as pa
from ray.data import Datasink

from pipeline.output import write_part
from pipeline.records import OUTPUT_SCHEMA


class PartsDatasink(Datasink):
    def __init__(self, dst: str, job_id: str, rows_per_part: int, options: dict | None = None):
        self.dst, self.job_id, self.rows_per_part, self.options = dst, job_id, rows_per_part, options

    @property
    def min_rows_per_write(self) -> int:
        return self.rows_per_part

    def write(self, blocks, ctx) -> list[str]:
        tables = [pa.Table.from_batches(b.to_batches(), schema=OUTPUT_SCHEMA) if isinstance(b, pa.Table) else
                  pa.Table.from_pandas(b, schema=OUTPUT_SCHEMA, preserve_index=False) for b in blocks]
        tables = [t for t in tables if t.num_rows]
        if not tables:
            return []
        return [write_part(pa.concat_tables(tables), self.dst, self.job_id, self.options)]
