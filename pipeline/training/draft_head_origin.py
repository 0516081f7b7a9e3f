"""Which model wrote an output folder's rows, for a CTC draft head trained on them
("Self-Speculative Decoding for LLM-based ASR with CTC Encoder Drafts": the draft must
read the same frozen encoder whose decoder made the transcripts it learns).

An output folder keeps the config of each config_hash its rows carry
(pipeline.config_record). A head is trained on the folder's transcripts only where every
one of those configs names the requested model: the same family, and the same
``model.source`` or, for a checkpoint on disk, the same content fingerprint
(pipeline.file_fingerprint; a checkpoint moved to another path is the same model, one
retrained in place is not).
"""
from __future__ import annotations

from ..models.errors import ModelError


def row_hashes(dst: str, options: dict | None = None) -> set[str]:
    """The config hashes DST's committed rows carry."""
    from ..output import iter_output

    return {r["config_hash"] for rows in iter_output(dst, ["config_hash"], options) for r in rows
            if r.get("config_hash")}


def _model_of(keys: dict) -> tuple[str | None, str | None, str | None]:
    model = keys.get("model") or {}
    return model.get("family"), model.get("source"), model.get("source@content")


def check_same_model(dst: str, model_config, options: dict | None = None) -> list[dict]:
    """The config records of DST's rows; ModelError (one line) where DST holds no rows,
    a hash without its record, or a record naming another model than ``model_config``."""
    from ..config_record import recorded_config
    from ..file_fingerprint import fingerprint
    from ..storage import redact_uri

    hashes = sorted(row_hashes(dst, options))
    if not hashes:
        raise ModelError(f"--from-output {redact_uri(dst)}: no transcribed rows there")
    want_content = None if model_config.source == "embedded" else fingerprint(model_config.source, options)
    records = []
    for job_hash in hashes:
        record = recorded_config(dst, job_hash, options)
        if record is None:
            raise ModelError(f"--from-output {redact_uri(dst)}: its rows of config {job_hash} record no config, so "
                             "which model wrote them is unknown; transcribe the input again (train-draft-head --input)")
        family, source, content = _model_of(record["keys"])
        same = family == model_config.family and (
            (source == model_config.source and (content is None or want_content is None or content == want_content))
            or (content is not None and content == want_content))
        if not same:
            raise ModelError(f"--from-output {redact_uri(dst)}: its rows were written by model.source={source} "
                             f"({family}), not by model.source={model_config.source} ({model_config.family}); a "
                             "draft head learns the transcripts of the model it drafts for (pass that --model)")
        records.append(record)
    return records
