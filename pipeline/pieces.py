"""The pieces of a long recording through the model stage, joined back into one row.

The audio stage hands a long recording on as pieces (pipeline.prepare_stream): prepared
rows of the same id, each with the segments cut since the one before. The model stage
decodes each piece as a row of its own, under an id of its own (``piece_id``: pieces of
one recording may wait in a second stage's pool at the same time), and :class:`PieceJoiner`
keeps their finished output rows, small (text and times, no audio), until the last piece
is done: then they become the recording's one output row, as the whole-recording path
would have written it, and only that row is committed.

Progress moves with the pieces: each finished piece counts its audio seconds and its
``share`` of the recording (the console's bar moves within a recording); the joined row
then counts as one row, less what its pieces already counted.
"""
from __future__ import annotations

import pyarrow as pa

from .records import OUTPUT_SCHEMA, finalize_row, table

# Between a recording's id and its piece's number in the id a piece is decoded under: a
# control character no source gives an id.
PIECE_SEP = "\x1f"
PIECE_COLUMNS = ("piece", "pieces", "share")
TIMES = ("t_prepare_s", "t_encode_s", "t_decode_s", "t_fallback_s")


def piece_id(row_id: str, piece: int) -> str:
    return f"{row_id}{PIECE_SEP}{piece}"


def is_whole(piece: int | None, pieces: int | None) -> bool:
    """Whether a prepared row is a recording in one piece (every short recording; a row
    made without the piece columns, null)."""
    return piece is None or (piece == 0 and pieces == 1)


class PieceJoiner:
    """``finish(row)``: what a finished output row goes through once its segments are
    final (confidence, filters, stamp), run again on the joined row."""

    def __init__(self, finish=None):
        self.finish = finish
        self.tags: dict[str, tuple[str, int, int | None, float]] = {}   # piece id -> (id, piece, pieces, share)
        self.done: dict[str, dict[int, dict]] = {}      # id -> its finished pieces' output rows
        self.count: dict[str, int] = {}                 # id -> its number of pieces, once known
        self.counted: dict[str, tuple[float, float]] = {}   # id -> (seconds, share) its pieces reported

    @property
    def holds(self) -> int:
        """Recordings with pieces finished and their last not yet."""
        return len(self.done)

    def tag(self, prepared: pa.Table) -> pa.Table:
        """``prepared`` with each piece of a recording in several under its piece id,
        and the piece columns dropped; a recording in one piece passes as it is."""
        if "piece" not in prepared.column_names:
            return prepared
        ids = prepared.column("id").to_pylist()
        piece = prepared.column("piece").to_pylist()
        pieces = prepared.column("pieces").to_pylist()
        share = prepared.column("share").to_pylist()
        out_ids = []
        for i, p, n, s in zip(ids, piece, pieces, share):
            if is_whole(p, n):
                out_ids.append(i)
                continue
            pid = piece_id(i, p)
            self.tags[pid] = (i, p, n, s or 0.0)
            out_ids.append(pid)
        body = prepared.drop_columns([c for c in PIECE_COLUMNS if c in prepared.column_names])
        return body.set_column(body.schema.get_field_index("id"), "id", pa.array(out_ids, pa.string()))

    def join(self, out: pa.Table) -> tuple[pa.Table | None, tuple[int, float, int, float]]:
        """The whole rows of the finished output table ``out`` (its recordings in one piece,
        and those whose last piece it finishes, joined), and the progress its pieces of
        unfinished recordings add: ``(rows, audio seconds, errors, share)``, less what
        the joined rows' pieces counted before (the whole rows' own counts are the caller's)."""
        if not self.tags:
            return out, (0, 0.0, 0, 0.0)
        ids = out.column("id").to_pylist()
        keep, joined = [], []
        audio, share = 0.0, 0.0
        rows = None
        for k, pid in enumerate(ids):
            tag = self.tags.pop(pid, None)
            if tag is None:
                keep.append(k)
                continue
            rows = rows if rows is not None else out.to_pylist()
            rid, p, n, s = tag
            self.done.setdefault(rid, {})[p] = rows[k]
            if n is not None:
                self.count[rid] = n
            seconds, part = rows[k].get("duration_s") or 0.0, s if n is None else 0.0
            had = self.counted.get(rid, (0.0, 0.0))
            self.counted[rid] = (had[0] + seconds, had[1] + part)
            audio, share = audio + seconds, share + part
            if rid in self.count and len(self.done[rid]) == self.count[rid]:
                joined.append(self._joined(rid))
                seconds, part = self.counted.pop(rid)
                audio, share = audio - seconds, share - part
        parts = [out.take(keep)] if keep else []
        if joined:
            parts.append(table(joined, OUTPUT_SCHEMA))
        return (pa.concat_tables(parts) if parts else None), (0, audio, 0, share)

    def _joined(self, rid: str) -> dict:
        done = self.done.pop(rid)
        pieces = [done[p] for p in sorted(done)]
        self.count.pop(rid)
        row = dict(pieces[-1])
        row["id"] = rid
        failed = next((r["error"] for r in pieces if r.get("error") and not r.get("segments")), None)
        row["prepare_error"] = failed
        row["segments"] = [] if failed else [sg for r in pieces for sg in (r.get("segments") or [])]
        row["duration_s"] = None if failed else sum(r.get("duration_s") or 0.0 for r in pieces)
        for key in TIMES:
            row[key] = sum(r.get(key) or 0.0 for r in pieces)
        finalize_row(row)
        row.pop("prepare_error")
        return self.finish(row) if self.finish is not None else row
