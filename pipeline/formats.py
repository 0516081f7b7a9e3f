"""Per-recording transcript files (SRT, WebVTT, JSON, TSV, plain text) and a NeMo manifest
with ``pred_text``, written from a finished output folder beside its parts: ``DST/__srt/``,
``DST/__vtt/``, ``DST/__json/``, ``DST/__tsv/``, ``DST/__txt/`` and
``DST/__nemo/manifest.nemo.jsonl``. The ``__`` keeps them out of every Parquet reader's
way (pipeline.output): a plain ``DST/srt/`` would be read as Parquet by pyarrow, pandas
and ``datasets`` alike, and fail.

Captions follow the usual subtitle limits: a cue is cut at segment boundaries and at word
boundaries (preferably where a sentence ends), holds at most ``MAX_LINES`` lines of at most ``MAX_CHARS`` characters and
lasts from ``MIN_CUE_S`` to ``MAX_CUE_S`` seconds; cues are in time order and never overlap.
Words are never dropped: a cue the next one leaves no time shows with it, over the limits.

Word times: a segment that carries timed ``words`` ([{word, start, end}], e.g. from a CTC
decoder's frame alignment, or Whisper's cross-attention with model.word_timestamps) is
cut at those times. A segment without them (or whose words have null times: Whisper's
words without model.word_timestamps carry confidences only) gets its words' times by
splitting each of its timed ``spans`` (Whisper's timestamp tokens, model.timestamps), else its span, in
proportion to each word's characters (the word plus one space): an approximation, good
to a fraction of a second on steady speech, which the JSON output marks with
``"word_times": "proportional"``.
"""
from __future__ import annotations

import hashlib
import html
import json
import posixpath
import re
from dataclasses import dataclass

FORMATS = ("srt", "vtt", "json", "tsv", "txt", "nemo")
MAX_CHARS = 42
MAX_LINES = 2
MAX_CUE_S = 7.0
MIN_SENTENCE_CUE = 16  # characters a cue needs before a sentence end closes it
# A word can come with no length (an attention decoder often gives the last word end ==
# start): its cue still needs some screen time, or players skip it and the words are lost.
MIN_CUE_S = 0.5
NAME_BYTES = 200  # of a per-recording file name's stem: file systems allow 255 bytes
NEMO_MANIFEST = "manifest.nemo.jsonl"


class FormatError(ValueError):
    """An unknown ``--format`` name."""


def parse_formats(spec: str | None) -> list[str]:
    names = [n.strip().lower() for n in (spec or "").split(",") if n.strip()]
    unknown = [n for n in names if n not in FORMATS]
    if unknown:
        raise FormatError(f"--format {unknown[0]}: expected a comma-separated list of {', '.join(FORMATS)}")
    return list(dict.fromkeys(names))


@dataclass
class Cue:
    start: float
    end: float
    lines: list[str]

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def segment_words(segment: dict) -> tuple[list[tuple[str, float, float]], bool]:
    """(word, start, end) of a segment and whether the times were measured (False: split
    in proportion to characters)."""
    words = [w for w in (segment.get("words") or []) if (w.get("word") or "").strip()]
    # Words with null times (an attention decoder's, which carry confidences only) are split
    # like a segment without words.
    if words and all(w.get("start") is not None and w.get("end") is not None for w in words):
        return [(w["word"].strip(), float(w["start"]), float(w["end"])) for w in words], True
    spans = segment.get("spans")
    if spans:  # Whisper's timestamp tokens: split each timed span alone
        return [w for sp in spans for w in _proportional(sp["text"], float(sp["start"]), float(sp["end"]))], False
    return _proportional(segment.get("text"), float(segment["start"]), float(segment["end"])), False


def _proportional(text: str | None, start: float, end: float) -> list[tuple[str, float, float]]:
    tokens = (text or "").split()
    if not tokens:
        return []
    total = sum(len(t) + 1 for t in tokens)
    out, t = [], start
    for tok in tokens:
        step = (end - start) * (len(tok) + 1) / total
        out.append((tok, t, t + step))
        t += step
    return out


def _sentence_end(lines: list[str], min_chars: int) -> bool:
    """A cue of at least ``min_chars`` that ends a sentence ends there (a new sentence
    reads better on a fresh caption than after a line break)."""
    return bool(lines) and sum(map(len, lines)) >= min_chars and lines[-1][-1:] in ".?!"


def _pieces(word: str, start: float, end: float):
    """A word longer than a line, cut into line-sized pieces with proportional times."""
    if len(word) <= MAX_CHARS:
        yield word, start, end
        return
    n = -(-len(word) // MAX_CHARS)
    step = (end - start) / n
    for i in range(n):
        yield word[i * MAX_CHARS:(i + 1) * MAX_CHARS], start + i * step, start + (i + 1) * step


def captions(segments: list[dict]) -> list[Cue]:
    """Cues of a recording's segments under the length limits, in time order, no overlap."""
    cues: list[Cue] = []
    for seg in sorted(segments or [], key=lambda s: s["start"]):
        if seg.get("error"):
            continue
        words, _ = segment_words(seg)
        lines: list[str] = []
        start = end = None

        def flush():
            nonlocal lines, start, end
            if lines:
                cues.append(Cue(start, min(end, start + MAX_CUE_S), lines))
            lines, start, end = [], None, None

        for word, ws, we in words:
            for piece, ps, pe in _pieces(word, ws, we):
                if start is not None and (pe - start > MAX_CUE_S or _sentence_end(lines, MIN_SENTENCE_CUE)):
                    flush()
                if lines and len(lines[-1]) + 1 + len(piece) <= MAX_CHARS:
                    lines[-1] += " " + piece
                elif len(lines) < MAX_LINES:
                    lines.append(piece)
                else:
                    flush()
                    lines.append(piece)
                if start is None:
                    start = ps
                end = pe
        flush()
    for cue in cues:
        cue.end = max(cue.end, cue.start + MIN_CUE_S)
    for cur, nxt in zip(cues, cues[1:]):
        cur.end = min(cur.end, nxt.start)
    # A cue left with no time (the next one starts with it) shows with the next one: its
    # words are kept, over the line limits if need be. The last cue always has time.
    kept: list[Cue] = []
    carry: list[str] = []
    for cue in cues:
        if cue.end <= cue.start:
            carry += cue.lines
            continue
        if carry:
            cue.lines, carry = carry + cue.lines, []
        kept.append(cue)
    return kept


def _stamp(seconds: float, sep: str) -> str:
    ms = int(round(max(seconds, 0.0) * 1000))
    h, rest = divmod(ms, 3_600_000)
    m, rest = divmod(rest, 60_000)
    s, ms = divmod(rest, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def to_srt(cues: list[Cue]) -> str:
    return "".join(f"{i}\n{_stamp(c.start, ',')} --> {_stamp(c.end, ',')}\n{c.text}\n\n"
                   for i, c in enumerate(cues, 1))


def to_vtt(cues: list[Cue]) -> str:
    # WebVTT cue text is markup: '&', '<' and '>' must be escaped or a player reads tags.
    return "WEBVTT\n\n" + "".join(f"{_stamp(c.start, '.')} --> {_stamp(c.end, '.')}\n{html.escape(c.text, quote=False)}\n\n"
                                  for c in cues)


def to_tsv(row: dict) -> str:
    """Segments as start and end in milliseconds and text, one per line, with a header."""
    lines = ["start\tend\ttext"]
    for seg in row.get("segments") or []:
        text = re.sub(r"\s+", " ", seg.get("text") or "").strip()
        lines.append(f"{int(round(seg['start'] * 1000))}\t{int(round(seg['end'] * 1000))}\t{text}")
    return "\n".join(lines) + "\n"


def to_txt(row: dict) -> str:
    """The recording's text on one line; empty for a row that failed or heard no speech, so
    that every recording still has its file."""
    text = re.sub(r"\s+", " ", row.get("text") or "").strip()
    return text + "\n" if text else ""


def to_json(row: dict) -> str:
    segments = []
    measured = True
    for seg in row.get("segments") or []:
        words, real = segment_words(seg)
        measured = measured and (real or not words)
        segments.append({"start": seg["start"], "end": seg["end"], "text": seg.get("text"),
                         "stage": seg.get("stage"),
                         "words": [{"word": w, "start": round(s, 3), "end": round(e, 3)} for w, s, e in words]})
    doc = {"id": row["id"], "audio": row.get("audio"), "duration_s": row.get("duration_s"),
           "text": row.get("text"), "error": row.get("error"), "language": row.get("language"),
           "language_prob": row.get("language_prob"), "segments": segments,
           "word_times": "measured" if measured else "proportional"}
    return json.dumps(doc, ensure_ascii=False, indent=1) + "\n"


def nemo_line(row: dict) -> str:
    """A NeMo manifest line: the audio, its duration, the reference as ``text`` and the
    transcript as ``pred_text`` (empty, with ``error``, where the row failed after its
    audio was read). ``write_formats`` leaves out rows without a duration."""
    line = {"audio_filepath": row.get("audio"), "duration": row.get("duration_s"),
            "text": row.get("reference") or "", "pred_text": row.get("text") or "", "id": row["id"]}
    if row.get("offset_s") is not None:    # a span of the file: NeMo reads from there
        line["offset"] = row["offset_s"]
    if row.get("error"):
        line["error"] = row["error"]
    return json.dumps(line, ensure_ascii=False)


def safe_name(row_id: str, taken: set[str]) -> str:
    """A file name for a recording id (ids may hold folders, '#offset' or any character),
    unique among ``taken``."""
    base = re.sub(r"[^\w.-]+", "_", row_id).strip("._") or "recording"
    if len(base.encode()) > NAME_BYTES:
        # Cut by bytes (a CJK character is 3), tagged with the whole id's hash so that two
        # long ids sharing a beginning keep names that do not depend on their order.
        tag = hashlib.sha1(row_id.encode()).hexdigest()[:10]
        base = base.encode()[:NAME_BYTES - 11].decode(errors="ignore") + "-" + tag
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}-{n}"
    taken.add(name)
    return name


def _rows(dst: str, options: dict | None):
    from .output import iter_output

    columns = ["id", "audio", "offset_s", "duration_s", "text", "reference", "segments", "error"]
    for rows in iter_output(dst, columns, options):
        yield from rows


def format_file(fmt: str) -> str:
    """Where the format ``fmt`` goes, relative to DST: a folder of per-recording files
    (``__srt/``), or the NeMo manifest (``__nemo/manifest.nemo.jsonl``); beside the parts,
    in a folder that no Parquet reader reads as rows (pipeline.output.export_dir)."""
    from .output import export_dir

    return f"{export_dir(fmt)}/{NEMO_MANIFEST}" if fmt == "nemo" else f"{export_dir(fmt)}/"


def _former_file(fmt: str) -> str:
    """Where an earlier version wrote ``fmt``: in the sidecar folder."""
    from .output import SIDECAR_DIR

    return f"{SIDECAR_DIR}/{NEMO_MANIFEST}" if fmt == "nemo" else f"{SIDECAR_DIR}/{fmt}"


def write_formats(dst: str, formats: list[str], options: dict | None = None) -> list[str]:
    """Write ``formats`` for every row of the output folder ``dst`` (opened with the job's
    storage ``options``) beside its parts (``format_file``); returns the folders and files
    written (relative to ``dst``). Everything is written under a temporary folder in the
    sidecar folder first and moved into place at the end, so an interrupted write leaves
    the previous formats (or none), never a partial set beside a finished job's _SUCCESS.
    A format an earlier version left in the sidecar folder goes once its new copy is in
    place: one copy of each, the current one."""
    import uuid

    from .output import SIDECAR_DIR, export_dir
    from .storage import url_to_fs

    fs, path = url_to_fs(dst, options)
    staging = posixpath.join(path, SIDECAR_DIR, f".tmp-formats-{uuid.uuid4().hex[:12]}")
    per_file = [f for f in formats if f != "nemo"]
    for fmt in per_file:
        fs.makedirs(posixpath.join(staging, fmt), exist_ok=True)
    fs.makedirs(staging, exist_ok=True)
    taken: set[str] = set()
    try:
        nemo = fs.open(posixpath.join(staging, NEMO_MANIFEST), "w", encoding="utf-8") if "nemo" in formats else None
        try:
            for row in _rows(dst, options):
                # NeMo's manifest readers add up and compare durations: one null stops them.
                if nemo is not None and row.get("duration_s") is not None:
                    nemo.write(nemo_line(row) + "\n")
                if not per_file:
                    continue
                name = safe_name(row["id"], taken)
                cues = captions(row.get("segments") or []) if not row.get("error") else []
                render = {"srt": lambda: to_srt(cues), "vtt": lambda: to_vtt(cues),
                          "json": lambda: to_json(row), "tsv": lambda: to_tsv(row), "txt": lambda: to_txt(row)}
                for fmt in per_file:
                    with fs.open(posixpath.join(staging, fmt, f"{name}.{fmt}"), "w", encoding="utf-8") as fh:
                        fh.write(render[fmt]())
        finally:
            if nemo is not None:
                nemo.close()
        done = per_file + (["nemo"] if nemo is not None else [])
        for fmt in done:
            staged = posixpath.join(staging, NEMO_MANIFEST if fmt == "nemo" else fmt)
            final = posixpath.join(path, format_file(fmt).rstrip("/"))
            if fs.exists(final):
                fs.rm(final, recursive=True)
            if fmt == "nemo":   # a file in its folder; a per-recording folder is moved whole
                fs.makedirs(posixpath.join(path, export_dir(fmt)), exist_ok=True)
            fs.mv(staged, final, recursive=fmt != "nemo")
            former = posixpath.join(path, _former_file(fmt))
            if fs.exists(former):
                fs.rm(former, recursive=True)
    finally:
        if fs.exists(staging):
            fs.rm(staging, recursive=True)
    return [format_file(f) for f in per_file] + ([format_file("nemo")] if "nemo" in formats else [])


def export_dirs() -> tuple[str, ...]:
    """Every export folder a job may write (``--overwrite`` removes them with the rows)."""
    from .output import PSEUDO_LABEL_EXPORT, export_dir

    return tuple(export_dir(name) for name in (*FORMATS, PSEUDO_LABEL_EXPORT))
