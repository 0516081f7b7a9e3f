"""The output folder's commit protocol: each input recording in DST exactly once, whatever
happens to the job. Each module keeps its own part of the protocol in its docstring:

- :mod:`pipeline.output.layout`: where everything lives in DST (parts, the
  ``__shardscribe__`` sidecar, the ``__<name>`` exports), so Parquet readers see only rows;
- :mod:`pipeline.output.lock`: the folder's lock (claims by epoch, the heartbeat,
  staleness) and the fence every commit passes;
- :mod:`pipeline.output.parts`: parts (temporary name, fence, rename; named by their ids),
  when to commit (PartCommitter), ``--overwrite``, and the job's begin and commit (the
  summary, then ``_SUCCESS``, last);
- :mod:`pipeline.output.handoff`: parts written by the Ray runner's model actors and
  committed (fenced, renamed) by the driver;
- :mod:`pipeline.output.resume`: a job's start (one whole read of every part),
  quarantine, and ``--retry-errors``' part rewrites;
- :mod:`pipeline.output.summary`: summary.json and the kinds of error rows;
- :mod:`pipeline.output.readers`: the committed rows, for readers.

Imports point one way: layout <- lock <- parts <- readers <- resume <- summary. Every name
below is re-exported here, so ``from shardscribe.pipeline.output import X`` keeps working; a test that
changes a module-level setting (STALE_AFTER_S, HEARTBEAT_S) sets it on the module that
reads it (pipeline.output.lock).
"""
from __future__ import annotations

from .layout import (CLAIM_PREFIX, EXPORT_PREFIX, LOCK_NAME, PART_PREFIX, PSEUDO_LABEL_EXPORT,
                     QUARANTINE_DIR, SIDECAR_DIR, SUCCESS_NAME, SUMMARY_NAME, TMP_PREFIX, export_dir,
                     sidecar_path)
from .lock import (HEARTBEAT_ENV, HEARTBEAT_S, STALE_AFTER_S, STALE_ENV, LockLost, OutputBusy,
                   OutputLock, lock_is_stale, new_job_id)
from .lock import _HELD as _HELD
from .lock import _HELD_GUARD as _HELD_GUARD
from .lock import _fence as _fence
from .lock import _folder_key as _folder_key
from .lock import _held_lock as _held_lock
from .lock import _identity as _identity
from .lock import _pid_alive as _pid_alive
from .lock import _rename_fenced as _rename_fenced
from .lock import _same_pid_namespace as _same_pid_namespace
from .parts import (PartCommitter, begin_job, clear_output, commit_job, part_name,
                    write_part)
from .parts import _is_part as _is_part
from .parts import _parts as _parts
from .parts import _put_part as _put_part
from .parts import _write_atomic as _write_atomic
from .readers import iter_output, read_output, read_part
from .readers import _part_tables as _part_tables
from .resume import (WANTED_SCHEMA, OutputScan, drop_error_rows, drop_rows, quarantine_unreadable,
                     scan_output, wanted_ids)
from .resume import _COLUMNS_SINCE_FIRST as _COLUMNS_SINCE_FIRST
from .resume import _SCAN_SCHEMA as _SCAN_SCHEMA
from .resume import _column_or_nulls as _column_or_nulls
from .resume import _config_hash_counts as _config_hash_counts
from .resume import _quarantine as _quarantine
from .resume import _scan_part as _scan_part
from .summary import (ERROR_KINDS, LANGUAGE_MISMATCH, error_kind, read_summary, summarize,
                      summary_exists)
from .summary import _KIND_RULES as _KIND_RULES
from .summary import _SUMMARY_SCHEMA as _SUMMARY_SCHEMA
from .summary import _summary_rows as _summary_rows

__all__ = [
    # layout
    "CLAIM_PREFIX", "EXPORT_PREFIX", "LOCK_NAME", "PART_PREFIX", "PSEUDO_LABEL_EXPORT", "QUARANTINE_DIR",
    "SIDECAR_DIR", "SUCCESS_NAME", "SUMMARY_NAME", "TMP_PREFIX", "export_dir", "sidecar_path",
    # lock
    "HEARTBEAT_ENV", "HEARTBEAT_S", "STALE_AFTER_S", "STALE_ENV", "LockLost", "OutputBusy", "OutputLock",
    "lock_is_stale", "new_job_id",
    # parts
    "PartCommitter", "begin_job", "clear_output", "commit_job", "part_name", "write_part",
    # readers
    "iter_output", "read_output", "read_part",
    # resume
    "WANTED_SCHEMA", "OutputScan", "drop_error_rows", "drop_rows", "quarantine_unreadable", "scan_output",
    "wanted_ids",
    # summary
    "ERROR_KINDS", "LANGUAGE_MISMATCH", "error_kind", "read_summary", "summarize", "summary_exists",
]
