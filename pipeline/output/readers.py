"""Reading DST's committed rows: only parts under their final names, part by part.

A reader sees only what a commit made visible (pipeline.output.parts): parts under their
final names, never a temporary file or anything in the ``__`` folders beside them
(pipeline.output.layout). A part written before a column was added reads with nulls in
that column. Rows read before the success marker (``__shardscribe__/_SUCCESS``) is there
are not final: a running job may still add parts.
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from .parts import _parts
from ..storage import url_to_fs


def read_part(fs, part: str) -> pa.Table:
    """A part read whole (every column, every page checksum): raises if any of it is bad."""
    with fs.open(part, "rb") as fh:
        return pq.read_table(fh, page_checksum_verification=True)


def _part_tables(dst: str, columns: list[str], options: dict | None, batch_rows: int | None = None):
    """DST's committed rows, part by part (or ``batch_rows`` at a time), as tables of
    ``columns``: a part written before a column was added gets nulls there."""
    from ..records import OUTPUT_SCHEMA

    fs, path = url_to_fs(dst, options)
    for p in _parts(fs, path):
        with fs.open(p, "rb") as fh:
            pf = pq.ParquetFile(fh)
            have = [c for c in columns if c in pf.schema_arrow.names]
            pieces = ([pf.read(columns=have)] if batch_rows is None else
                      (pa.Table.from_batches([b]) for b in pf.iter_batches(batch_size=batch_rows, columns=have)))
            for table in pieces:
                for name in columns:
                    if name not in table.column_names and name in OUTPUT_SCHEMA.names:
                        field = OUTPUT_SCHEMA.field(name)
                        table = table.append_column(field, pa.nulls(table.num_rows, field.type))
                yield table.select([c for c in columns if c in table.column_names])


def read_output(dst: str, columns: list[str], options: dict | None = None):
    tables = list(_part_tables(dst, columns, options))
    return pa.concat_tables(tables, promote_options="default") if tables else None


def iter_output(dst: str, columns: list[str], options: dict | None = None, batch_rows: int = 8192):
    """DST's committed rows as lists of dicts, ``batch_rows`` at a time, part by part, so a
    reader never holds more than one batch of a million-row output. Every row has every
    column of ``columns`` that the output schema knows (null in a part written before it)."""
    for table in _part_tables(dst, columns, options, batch_rows):
        yield table.to_pylist()
