"""In-process runner: the same actors and stages as the Ray plan, without Ray.

Serves benchmarks, debugging and machines without Ray (the lent GPU machine). Output
parts are written with pyarrow through fsspec, the same schema as the Ray path.
"""
from __future__ import annotations

import logging
import posixpath
import sys
import time
import uuid

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from actors.audio_prep import AudioPrep
from actors.finisher import Finisher
from actors.transcriber import Transcriber
from pipeline.decoders import decoder_kind
from pipeline.records import OUTPUT_SCHEMA
from pipeline.sources import input_batches

log = logging.getLogger(__name__)


def run_local(rows, cfg, dst: str, rows_per_part: int = 1024, progress: bool = True,
              kind=None, items: list[dict] | None = None) -> int:
    """Transcribe ``rows`` (a list of manifest row dicts, or a pipeline.sources.Source read
    piece by piece; ``items``: its scan's work items) into Parquet parts under ``dst``;
    returns rows written."""
    kind = kind or decoder_kind(cfg.decoder.kind)
    if kind.name != cfg.decoder.kind:
        raise ValueError(f"decoder kind {kind.name!r} given for a config of decoder.kind={cfg.decoder.kind}")
    prep = AudioPrep(cfg.to_dict(), kind)
    model = Transcriber(cfg.to_dict(), kind)
    # A second stage shares the first stage's model in-process (no second copy).
    second = Finisher(cfg.to_dict(), kind, first_stage=model.decoder) if kind.two_stage else None
    fs, path = fsspec.core.url_to_fs(dst)
    fs.makedirs(path, exist_ok=True)
    run_id = uuid.uuid4().hex[:12]
    pending: list[pa.Table] = []
    written = part = 0
    step = cfg.batching.recordings_per_batch
    start = time.perf_counter()

    def flush():
        nonlocal pending, part
        if pending:
            with fs.open(posixpath.join(path, f"local-{run_id}-{part:05d}.parquet"), "wb") as fh:
                pq.write_table(pa.concat_tables(pending), fh)
            part += 1
            pending = []

    total = f"/{len(rows)}" if isinstance(rows, list) else ""
    for batch in input_batches(rows, step, items):
        out = model(prep(batch))
        if second is not None:
            out = second(out)
        assert out.schema == OUTPUT_SCHEMA
        pending.append(out)
        written += out.num_rows
        if sum(t.num_rows for t in pending) >= rows_per_part:
            flush()
        if progress:
            rate = written / max(time.perf_counter() - start, 1e-9)
            print(f"\rlocal: {written}{total} recordings ({rate:.2f}/s)", end="", file=sys.stderr)
    flush()
    if progress:
        print(file=sys.stderr)
    return written
