"""Where everything lives in an output folder DST, and why the Parquet readers see only the rows.

Everything that is not a part is kept out of the Parquet readers' way: pyarrow and pandas
skip ``_`` and ``.`` names, but Hugging Face ``datasets.load_dataset("parquet",
data_dir=DST)`` reads every file under DST (a top-level ``_SUCCESS`` or a file in a
``_srt/`` folder breaks it) and skips only ``.`` names and files in ``__`` folders. So the
job's own files (summary, success marker, lock, quarantine, the job log, the report) live
in one folder, ``SIDECAR_DIR``; what is made from the rows for people and other tools (the
``--format`` files, the pseudo-label exports) sits beside the parts, one ``__<name>``
folder each (:func:`export_dir`); temporary parts start with ``.``.
"""
from __future__ import annotations

import posixpath

SIDECAR_DIR = "__shardscribe__"
SUMMARY_NAME = f"{SIDECAR_DIR}/summary.json"
SUCCESS_NAME = f"{SIDECAR_DIR}/_SUCCESS"
LOCK_NAME = f"{SIDECAR_DIR}/LOCK"
QUARANTINE_DIR = f"{SIDECAR_DIR}/quarantine"
TMP_PREFIX = ".tmp-"
PART_PREFIX = "part-"
CLAIM_PREFIX = "LOCK."          # the claims: __shardscribe__/LOCK.<epoch>
# An export's folder beside the parts: "__" is the one prefix every Parquet reader skips
# (module docstring), so DST still reads as exactly the rows.
EXPORT_PREFIX = "__"
PSEUDO_LABEL_EXPORT = "pseudo_label"


def sidecar_path(dst: str, name: str) -> str:
    """URL of ``name`` in DST's sidecar folder (any fsspec URL)."""
    return posixpath.join(dst.rstrip("/"), SIDECAR_DIR, name)


def export_dir(name: str) -> str:
    """The folder, relative to DST, of the export ``name``: a ``--format`` (``srt``,
    ``nemo``, ...) or ``pseudo_label``."""
    return f"{EXPORT_PREFIX}{name}"
