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
below is re-exported here, so ``from pipeline.output import X`` keeps working; a test that
changes a module-level setting (STALE_AFTER_S, HEARTBEAT_S) sets it on the module that
reads it (pipeline.output.lock).
"""
from __future__ import annotations

from pipeline.output.layout import (CLAIM_PREFIX, EXPORT_PREFIX, LOCK_NAME, PART_PREFIX, PSEUDO_LABEL_EXPORT,
                                    QUARANTINE_DIR, SIDECAR_DIR, SUCCESS_NAME, SUMMARY_NAME, TMP_PREFIX, export_dir,
                                    sidecar_path)
from pipeline.output.lock import (HEARTBEAT_ENV, HEARTBEAT_S, STALE_AFTER_S, STALE_ENV, LockLost, OutputBusy,
                                  OutputLock, lock_is_stale, new_job_id)
from pipeline.output.lock import _HELD as _HELD
from pipeline.output.lock import _HELD_GUARD as _HELD_GUARD
from pipeline.output.lock import _fence as _fence
from pipeline.output.lock import _folder_key as _folder_key
from pipeline.output.lock import _held_lock as _held_lock
from pipeline.output.lock import _identity as _identity
from pipeline.output.lock import _pid_alive as _pid_alive
from pipeline.output.lock import _rename_fenced as _rename_fenced
from pipeline.output.lock import _same_pid_namespace as _same_pid_namespace
from pipeline.output.parts import (PartCommitter, begin_job, clear_output, commit_job, part_name,
                                   write_part)
from pipeline.output.parts import _is_part as _is_part
from pipeline.output.parts import _parts as _parts
from pipeline.output.parts import _put_part as _put_part
from pipeline.output.parts import _write_atomic as _write_atomic
from pipeline.output.readers import iter_output, read_output, read_part
from pipeline.output.readers import _part_tables as _part_tables
from pipeline.output.resume import (WANTED_SCHEMA, OutputScan, drop_error_rows, drop_rows, quarantine_unreadable,
                                    scan_output, wanted_ids)
from pipeline.output.resume import _COLUMNS_SINCE_FIRST as _COLUMNS_SINCE_FIRST
from pipeline.output.resume import _SCAN_SCHEMA as _SCAN_SCHEMA
from pipeline.output.resume import _column_or_nulls as _column_or_nulls
from pipeline.output.resume import _config_hash_counts as _config_hash_counts
from pipeline.output.resume import _quarantine as _quarantine
from pipeline.output.resume import _scan_part as _scan_part
from pipeline.output.summary import (ERROR_KINDS, LANGUAGE_MISMATCH, error_kind, read_summary, summarize,
                                     summary_exists)
from pipeline.output.summary import _KIND_RULES as _KIND_RULES
from pipeline.output.summary import _SUMMARY_SCHEMA as _SUMMARY_SCHEMA
from pipeline.output.summary import _summary_rows as _summary_rows

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
