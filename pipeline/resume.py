"""Resume keyed by content: which input rows a job skips, which it adds, and which
conflict with rows already in the output folder.

A stored row is an input row's when their ids match and so do their sources: the audio
URI (credentials removed, as rows store it), the span's ``offset_s``, and the
``audio_stamp`` ("<size>:<mtime>" of a listed file). A stored value that is null matches
any: rows written before ``audio_stamp`` existed, and manifest and table rows (which have
no stamp), resume as before. An input row whose id the folder holds only from another
source (day2/clip001.wav after day1/clip001.wav, both id ``clip001.wav``) is a conflict:
the job refuses it unless ``--resume``, which adds the recording under a distinct id,
``<id>~<8 hex digits>`` (SHA-256 of its source; :func:`distinct_id`), computed the same
way by every run, so a rerun finds it done.

Both sides are spilled by bucket (pipeline.id_buckets; an id and its distinct id share a
bucket), so the plan is made one bucket at a time. What the driver keeps is one byte per
input row (``ResumePlan.actions``), and each work item carries its own share as bit masks
(``skip``, ``rename``) that :func:`apply_plan` applies where the item is read.
"""
from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .id_buckets import IdBuckets

TODO, DONE, RENAMED, RENAMED_DONE = 0, 1, 2, 3


def distinct_id(rid: str, audio: str | None, stamp: str | None, offset: float | None) -> str:
    """The id a conflicting recording is added under: its id and a hash of its source."""
    key = json.dumps([audio, stamp, offset]).encode()
    return f"{rid}~{hashlib.sha256(key).hexdigest()[:8]}"


def _mask(item: dict, name: str) -> np.ndarray | None:
    if name not in item:
        return None
    return np.unpackbits(np.frombuffer(base64.b64decode(item[name]), np.uint8), count=item["rows"]).astype(bool)


def apply_plan(rows: list[dict], item: dict, position: int = 0) -> list[dict]:
    """``rows`` (the item's, from ``position`` on) less those the plan skips, with the
    distinct ids it gives."""
    from .storage import redact_uri

    skip, rename = _mask(item, "skip"), _mask(item, "rename")
    out = []
    for j, row in enumerate(rows):
        p = position + j
        if skip is not None and skip[p]:
            continue
        if rename is not None and rename[p]:
            row = {**row, "id": distinct_id(row["id"], redact_uri(row["audio"]), row.get("audio_stamp"),
                                            row.get("offset_s"))}
        out.append(row)
    return out


@dataclass
class ResumePlan:
    """What a job does with each input row (``actions``, by the row's place in the source:
    TODO, DONE, RENAMED: to do under its distinct id, RENAMED_DONE: done under it), and the
    counts a job reports."""
    actions: np.ndarray
    done: int = 0              # input recordings the folder holds (under their id or distinct id)
    failed: int = 0            # of those, with an error row
    duplicates: int = 0        # the folder's rows of those recordings beyond one each
    conflicts: int = 0         # input rows whose id the folder holds only from another source
    example: str | None = None     # one conflict, in words
    retry: pa.Table = field(default_factory=lambda: pa.table({"part": pa.array([], pa.int32()),
                                                               "id": pa.array([], pa.string())}))

    @property
    def todo(self) -> int:
        return int(np.count_nonzero((self.actions == TODO) | (self.actions == RENAMED)))

    def work_items(self, items: list[dict]) -> list[dict]:
        """``items`` with their share of the plan: an item whose rows are all done is
        left out, and the others carry ``skip``/``rename`` masks where they need them."""
        out = []
        for item in items:
            a = self.actions[item["first_row"]:item["first_row"] + item["rows"]]
            skip = (a == DONE) | (a == RENAMED_DONE)
            if skip.all():
                continue
            item = dict(item)
            if skip.any():
                item["skip"] = base64.b64encode(np.packbits(skip).tobytes()).decode()
            if (a == RENAMED).any():
                item["rename"] = base64.b64encode(np.packbits(a == RENAMED).tobytes()).decode()
            out.append(item)
        return out

    def wanted(self, scan) -> IdBuckets:
        """The ids the output must hold once the job is done (distinct ids where the plan
        gives them) and whether this run reads each: summarize's input side."""
        from .output import WANTED_SCHEMA

        spill = IdBuckets(WANTED_SCHEMA)
        for b in range(scan.index.buckets):
            rows = scan.index.read(b)
            if not rows.num_rows:
                continue
            a = self.actions[rows.column("seq").to_numpy()]
            ids = rows.column("id").to_pylist()
            for k in np.flatnonzero((a == RENAMED) | (a == RENAMED_DONE)):
                ids[k] = distinct_id(ids[k], rows.column("audio")[k].as_py(), rows.column("stamp")[k].as_py(),
                                     rows.column("offset_s")[k].as_py())
            spill.add(pa.table({"id": pa.array(ids, pa.string()), "run": pa.array((a == TODO) | (a == RENAMED))}))
        return spill.finish()


def _same(a, b):
    """Equal, or either side null (unknown matches)."""
    return pc.or_(pc.or_(pc.is_null(a), pc.is_null(b)), pc.fill_null(pc.equal(a, b), False))


def _pairs(inp: pa.Table, out: pa.Table) -> pa.Table:
    """Every (input row, stored row) with one id, and whether their sources match."""
    stored = out.rename_columns(["id", "s_audio", "s_stamp", "s_offset", "error", "part", "r"])
    j = inp.join(stored, keys="id", join_type="inner")
    same = pc.and_(pc.and_(_same(j.column("audio"), j.column("s_audio")), _same(j.column("stamp"), j.column("s_stamp"))),
                   _same(j.column("offset_s"), j.column("s_offset")))
    return j.append_column("same", same)


def plan_resume(scan, found, retry_errors: bool = False) -> ResumePlan:
    """The plan for the input ``scan`` (pipeline.sources.Scan) against the folder's rows
    ``found`` (pipeline.output.OutputScan; None: an empty or overwritten folder). With
    ``retry_errors``, stored error rows of the input's recordings are not done: the plan's
    ``retry`` lists them (part, id) for removal."""
    plan = ResumePlan(np.zeros(scan.rows, np.uint8))
    if found is None or not found.row_count:
        return plan
    retry = []
    for b in range(scan.index.buckets):
        inp, out = scan.index.read(b), found.index.read(b)
        if not inp.num_rows or not out.num_rows:
            continue
        out = out.append_column("r", pa.array(np.arange(out.num_rows)))
        # distinct ids of every input row whose id the folder holds from another source
        pairs = _pairs(inp, out)
        if retry_errors:
            bad = pairs.filter(pc.and_(pairs.column("same"), pairs.column("error")))
            plan.failed += pc.count_distinct(bad.column("seq")).as_py() if bad.num_rows else 0
            renamed = _renamed_pairs(inp, out, pairs)
            rbad = renamed.filter(pc.and_(renamed.column("same"), renamed.column("error")))
            dropped = pa.concat_arrays([bad.column("r").combine_chunks(), rbad.column("r").combine_chunks()])
            if len(dropped):
                gone = out.filter(pc.is_in(out.column("r"), value_set=dropped))
                retry.append(gone.select(["part", "id"]))
                out = out.filter(pc.invert(pc.is_in(out.column("r"), value_set=dropped)))
                pairs = _pairs(inp, out)
        seqs_same = pairs.filter(pairs.column("same"))
        done = pc.unique(seqs_same.column("seq"))
        plan.actions[done.to_numpy()] = DONE
        plan.done += len(done)
        plan.duplicates += seqs_same.num_rows - len(done)
        if not retry_errors:
            failed = seqs_same.filter(seqs_same.column("error"))
            plan.failed += pc.count_distinct(failed.column("seq")).as_py() if failed.num_rows else 0
        clash = pc.unique(pairs.column("seq")).filter(pc.invert(pc.is_in(pc.unique(pairs.column("seq")), value_set=done)))
        if not len(clash):
            continue
        renamed = _renamed_pairs(inp, out, pairs, clash)
        rdone = pc.unique(renamed.filter(renamed.column("same")).column("seq"))
        plan.actions[clash.to_numpy()] = RENAMED
        plan.actions[rdone.to_numpy()] = RENAMED_DONE
        plan.done += len(rdone)
        open_ = clash.filter(pc.invert(pc.is_in(clash, value_set=rdone)))
        plan.conflicts += len(open_)
        if len(open_) and plan.example is None:
            first = pairs.filter(pc.equal(pairs.column("seq"), open_[0])).slice(0, 1).to_pylist()[0]
            plan.example = (f"id {first['id']!r}: the folder's row is from {first['s_audio']}"
                            + (f" ({first['s_stamp']})" if first["s_stamp"] else "")
                            + f", this input's from {first['audio']}" + (f" ({first['stamp']})" if first["stamp"] else ""))
    if retry:
        plan.retry = pa.concat_tables(retry)
    return plan


def _renamed_pairs(inp: pa.Table, out: pa.Table, pairs: pa.Table, clash: pa.Array | None = None) -> pa.Table:
    """The pairs of the input rows ``clash`` (default: those whose id matched only rows of
    another source) under their distinct ids."""
    if clash is None:
        done = pc.unique(pairs.filter(pairs.column("same")).column("seq"))
        seqs = pc.unique(pairs.column("seq"))
        clash = seqs.filter(pc.invert(pc.is_in(seqs, value_set=done)))
    rows = inp.filter(pc.is_in(inp.column("seq"), value_set=clash))
    if not rows.num_rows:
        return _pairs(rows, out.slice(0, 0))
    ids = [distinct_id(r["id"], r["audio"], r["stamp"], r["offset_s"]) for r in rows.to_pylist()]
    return _pairs(rows.set_column(0, "id", pa.array(ids, pa.string())), out)
