"""What a transcription job shows a person: one progress bar, a log file for everything
else, and a short closing table.

- ``JobLog`` sends everything the process and its Ray workers print (Ray's own lines, the
  workers' forwarded output, C++ core-worker lines, warnings) to a log file in the output
  folder, by pointing file descriptors 1 and 2 at it, and hands the console a stream on
  the original terminal. ``verbose`` leaves the descriptors alone.
- ``Progress`` is a tqdm bar in recordings with audio hours, rows/s, RTFx, errors and an
  ETA in a terminal; elsewhere (a log, CI) it writes a line once the first rows finish,
  then one every ``interval_s``.
- ``summary_table`` is the closing table; ``output_lines`` says where each output is.
- ``committed_rows`` counts what an interrupted job left committed, for its last line.
"""
from __future__ import annotations

import math
import os
import shutil
import sys
import tempfile
import time

from ..pipeline.output import sidecar_path


class JobLog:
    """Context manager: inside it, fds 1 and 2 write to ``path`` (unless ``verbose``);
    ``console`` writes to the terminal either way. A remote DST gets the log copied to
    ``url`` on exit."""

    def __init__(self, dst: str, name: str, verbose: bool = False):
        import fsspec

        from ..pipeline.storage import redact_uri

        self.verbose = verbose
        # Where the log is, as printed and stored in the summary (no credentials); the raw
        # location, which the upload needs, stays private.
        self._target = sidecar_path(dst, name)
        self.url = sidecar_path(redact_uri(dst), name)
        fs, path = fsspec.core.url_to_fs(self._target)
        from fsspec.implementations.local import LocalFileSystem

        self.local = isinstance(fs, LocalFileSystem)
        if self.local:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            self.path = path
        else:
            self.path = os.path.join(tempfile.mkdtemp(prefix="shardscribe-log-"), name)
        self._fs, self._remote = fs, path
        self.console = sys.stderr
        self._saved: list[int] = []

    def __enter__(self) -> "JobLog":
        self._file = open(self.path, "a", buffering=1)
        if self.verbose:
            return self
        sys.stdout.flush()
        sys.stderr.flush()
        self._saved = [os.dup(1), os.dup(2)]
        self.console = os.fdopen(os.dup(self._saved[1]), "w", buffering=1)
        for fd in (1, 2):
            os.dup2(self._file.fileno(), fd)
        return self

    def __exit__(self, *exc) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        if self._saved:
            for fd, saved in zip((1, 2), self._saved):
                os.dup2(saved, fd)
                os.close(saved)
            self._saved = []
            self.console.flush()
            self.console.close()
            self.console = sys.stderr
        self._file.close()
        if not self.local:
            self._fs.put_file(self.path, self._remote)
            # uploaded: the local copy goes (a failed upload raises first and leaves it)
            shutil.rmtree(os.path.dirname(self.path), ignore_errors=True)

    def write(self, line: str) -> None:
        """A line for the log file only (the job's own record of what it did)."""
        self._file.write(line.rstrip("\n") + "\n")


def _hours(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.2f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}" if seconds >= 3600 \
        else f"{seconds // 60}:{seconds % 60:02d}"


# A log gets a line when rows were finished and interval_s has passed, and a line after
# this many intervals (at least HEARTBEAT_S) without a finished row (a model still
# loading, a long recording).
HEARTBEAT_INTERVALS = 6
HEARTBEAT_S = 60.0


class Progress:
    """Progress of ``total`` recordings, updated with running totals (rows, audio seconds,
    errors, and ``partial``: the shares done of recordings still in progress, so a long
    recording moves the bar as its pieces finish). A terminal gets a live tqdm bar; any other stream a line as soon as the first
    rows finish, then one at most every ``interval_s`` seconds while rows finish, and one
    at the end."""

    def __init__(self, total: int, stream, interval_s: float = 10.0, tty: bool | None = None):
        self.total = total
        self.stream = stream
        self.interval_s = interval_s
        self.tty = stream.isatty() if tty is None else tty
        self.start = time.monotonic()
        self._last_line = self.start
        self.state = (0, 0.0, 0)
        self.partial = 0.0
        self._printed = None  # the state of the last line written
        self.bar = None
        if self.tty:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="rec", file=stream, dynamic_ncols=True, smoothing=0.05,
                            bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} rec [{elapsed}<{remaining}, "
                                       "{rate_fmt}]{postfix}", desc="transcribe")

    def _stats(self) -> str:
        rows, audio_s, errors = self.state
        elapsed = max(time.monotonic() - self.start, 1e-9)
        parts = [f"{_hours(audio_s)} audio", f"RTFx {audio_s / elapsed:.1f}", f"{errors} errors"]
        return ", ".join(parts)

    def update(self, rows: int, audio_s: float, errors: int, partial: float = 0.0) -> None:
        rows = min(rows, self.total)
        # Shown to the hundredth of a recording: a 10-hour one moves every 6 minutes of it.
        partial = round(min(max(partial, 0.0), self.total - rows), 2)
        if (rows, audio_s, errors) == self.state and partial == self.partial:
            if self.bar is not None:
                self.bar.refresh()  # keeps the elapsed time moving
            elif time.monotonic() - self._last_line >= max(HEARTBEAT_S, HEARTBEAT_INTERVALS * self.interval_s):
                self._line()  # still alive, nothing finished
            return
        self.state, self.partial = (rows, audio_s, errors), partial
        if self.bar is not None:
            self.bar.n = round(rows + partial, 2) if partial else rows
            self.bar.set_postfix_str(self._stats(), refresh=False)
            self.bar.refresh()
        elif (rows and not (self._printed and self._printed[0])) or time.monotonic() - self._last_line >= self.interval_s:
            # The first finished rows at once: a piped job shows it is working without
            # waiting a whole interval; later lines keep the interval.
            self._line()

    def _line(self) -> None:
        rows = self.state[0]
        elapsed = time.monotonic() - self.start
        rate = rows / elapsed if elapsed > 0 else 0.0
        eta = f", ETA {_clock((self.total - rows) / rate)}" if 0 < rows < self.total and rate > 0 else ""
        pct = 100 * (rows + self.partial) / self.total if self.total else 100.0
        print(f"transcribe: {rows}/{self.total} rec ({pct:.0f}%), {rate:.2f} rec/s, {self._stats()}, "
              f"elapsed {_clock(elapsed)}{eta}", file=self.stream, flush=True)
        self._last_line = time.monotonic()
        self._printed = self.state

    def close(self, rows: int, audio_s: float, errors: int) -> None:
        """The final counts (from the written output, not the running tally)."""
        self.state, self.partial = (min(rows, self.total), audio_s, errors), 0.0
        if self.bar is not None:
            self.bar.n = self.state[0]
            self.bar.set_postfix_str(self._stats(), refresh=False)
            self.bar.close()
        elif not self._shown(self.state):
            self._line()

    def _shown(self, state) -> bool:
        """Whether the last line written showed ``state``: the final audio seconds, summed
        from the written rows, may differ from the running sum of the batches' in the last
        float digits."""
        return self._printed is not None and self._printed[0::2] == state[0::2] \
            and math.isclose(self._printed[1], state[1], rel_tol=1e-9, abs_tol=1e-6)


def _counts(mapping: dict, limit: int = 4) -> str:
    items = list(mapping.items())
    text = ", ".join(f"{k} {v}" for k, v in items[:limit])
    return text + (f", {len(items) - limit} more kinds" if len(items) > limit else "")


def summary_table(summary: dict) -> list[str]:
    """The job's closing table: rows, errors by kind, stages, audio, wall time, RTFx, a
    two-stage kind's second-stage batches and WER as a percentage, each only where it was
    measured."""
    rows = [("rows", f"{summary['rows_out']} of {summary['rows_in']}"
                     + (f" ({summary['run_rows']} this run, {summary['skipped_existing']} already there)"
                        if summary.get("skipped_existing") else ""))]
    errors = summary.get("errors", 0)
    rows.append(("errors", f"{errors}" + (f": {_counts(summary.get('errors_by_kind') or {})}" if errors else "")))
    rows.append(("stages", _counts(summary.get("stages") or {}, limit=6) or "-"))
    rows.append(("audio", _hours(summary.get("audio_seconds") or 0.0)))
    rows.append(("wall time", _clock(summary.get("wall_seconds") or 0.0)))
    if summary.get("run_rows") and summary.get("rtfx"):
        rows.append(("RTFx", f"{summary['rtfx']:.1f} (audio / wall time of this run)"))
    second = summary.get("second_stage") or {}
    if second.get("calls"):
        # A two-stage decoder kind's second stage (pipeline.pending_pool): its mean batch.
        rows.append(("second stage", f"{second['segments']} segments in {second['calls']} "
                                     f"call{'s' if second['calls'] != 1 else ''} "
                                     f"(mean {second['mean_segments_per_call']:.1f}, max "
                                     f"{second['max_segments_per_call']} a call; mean wait "
                                     f"{second.get('mean_wait_s', 0.0):.1f} s)"))
    online = summary.get("token_map_online") or {}
    if online.get("map"):
        # token_map.online, replayed on the job's text (pipeline.kinds.ar.token_map_report)
        rows.append(("token map", f"online, {online['map']['keys']} keys; replayed: {online['accepted_per_round']:.2f} "
                                  f"of {online['drafted_per_round']:.2f} drafted tokens accepted a round, bound "
                                  f"{online['pass_ratio']:.2f}x AR's decoder passes"))
    if summary.get("wer") is not None:
        rows.append(("WER", f"{100 * summary['wer']:.1f} % over {summary.get('wer_rows', 0)} rows with a reference"))
    width = max(len(k) for k, _ in rows)
    return [f"  {k:<{width}}  {v}" for k, v in rows]


def installed(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def readers(dst: str) -> list[str]:
    """How to read DST's rows, with only the libraries installed here (pyarrow always is)."""
    out = [f'pyarrow.parquet.read_table("{dst}")']
    if installed("pandas"):
        out.insert(0, f'pandas.read_parquet("{dst}")')
    if installed("datasets"):
        out.append(f'datasets.load_dataset("parquet", data_dir="{dst}")')
    return out


def output_lines(dst: str, log_url: str | None, written: list[str] | None = None) -> list[str]:
    """Where each output is (never with the credentials a URI may carry): the Parquet parts,
    the format files, the summary and log; then how to read the parts, naming only readers
    that are installed."""
    from ..pipeline.output import SUMMARY_NAME
    from ..pipeline.storage import redact_uri

    dst = redact_uri(dst).rstrip("/")
    lines = [f"Output: {dst}/  (the Parquet parts: one row per recording)"]
    for item in written or []:
        lines.append(f"  formats: {dst}/{item}")
    lines.append(f"  summary: {dst}/{SUMMARY_NAME}")
    if log_url:
        lines.append(f"  log:     {log_url}")
    lines.append("Read it: " + " or ".join(readers(dst)))
    return lines


def committed_rows(dst: str) -> int:
    """The rows committed in DST: what a rerun finds there (pipeline.output's parts),
    counted from the parts' footers; no column is read, so it is quick on any output."""
    from ..pipeline.output import iter_output

    return sum(len(rows) for rows in iter_output(dst, []))


def mismatch_warning(summary: dict) -> str | None:
    """The closing warning for the rows with the ``language_mismatch`` filter reason
    (speech its model could not transcribe, pipeline.filters), counted by the summary's
    pass over the rows; None where there are none."""
    n = summary.get("language_mismatch") or 0
    return (f"shardscribe: warning: {n} row{'' if n == 1 else 's'} with filter reason language_mismatch: speech "
            "in another language than the model's (an English-only model's decode failed, or the detected "
            "language differs from filters.language); for other languages use --model base --language auto"
            ) if n else None


# Transcripts longer than this are cut on the console (the rows keep them whole).
TRANSCRIPT_CHARS = 400


def transcript_lines(dst: str) -> list[str]:
    """One line per row of DST, sorted by id: the id and its text (or its error), for a job
    small enough to read on the console."""
    from ..pipeline.output import iter_output

    rows = [r for batch in iter_output(dst, ["id", "text", "error", "language"]) for r in batch]
    lines = []
    for r in sorted(rows, key=lambda r: r["id"]):
        text = f"[error] {r['error']}" if r["error"] else " ".join((r["text"] or "").split())
        if len(text) > TRANSCRIPT_CHARS:
            text = text[:TRANSCRIPT_CHARS - 3] + "..."
        lines.append(f"{r['id']}" + (f" [{r['language']}]" if r.get("language") else "") + f": {text}")
    return lines
