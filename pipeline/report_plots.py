"""The PNG plots of `shardscribe report` (pipeline.report): throughput over the job's
time, stage shares, the duration histogram and WER by stage and duration bucket.

Throughput comes from the rows' own timings. A model actor stamps every row of a batch
with the same ``finished_at`` when the batch is done, so a short job is one batch and
its rows share one instant: plotted as they are, the rows jump from none to all. Each
group of rows sharing a ``finished_at`` is therefore spread back over the model time its
rows report (``t_encode_s + t_decode_s + t_fallback_s``), ending at that instant: the
curve rises while the batch is decoded, as the audio was.
"""
from __future__ import annotations

from itertools import accumulate

MODEL_TIMES = ("t_encode_s", "t_decode_s", "t_fallback_s")
UNIT_WORDS = {"s": "seconds", "min": "minutes", "h": "hours"}


def time_unit(seconds: float) -> tuple[float, str]:
    """(divisor, name) that shows ``seconds`` as a number a reader takes in at a glance."""
    if seconds < 120:
        return 1.0, "s"
    if seconds < 7200:
        return 60.0, "min"
    return 3600.0, "h"


def duration_text(seconds: float) -> str:
    div, name = time_unit(seconds)
    return f"{seconds / div:.{2 if name == 'h' else 1}f} {name}"


def spread_finishes(finished: list[tuple[float, float, float]]) -> list[tuple[float, float]]:
    """(finish time, audio seconds) of each row, in time order, from ``(finished_at,
    model seconds, audio seconds)`` in the order the rows were read: a group sharing a
    ``finished_at`` ends there, each row finishing its own model seconds after the one
    before it."""
    groups: dict[float, list[tuple[float, float]]] = {}
    for at, busy, audio in finished:
        groups.setdefault(at, []).append((busy, audio))
    out = []
    for at, rows in groups.items():
        ends = list(accumulate(busy for busy, _ in rows))
        out += [(at - ends[-1] + end, audio) for end, (_, audio) in zip(ends, rows)]
    return sorted(out)


def _throughput(data: dict, plt):
    started, wall = data.get("started_at"), data.get("wall_seconds") or 0.0
    finished = data["finished"]
    # A resumed output holds rows of earlier runs: the plot is the last run's, unless that
    # run found nothing left to do.
    last_run = [f for f in finished if started and f[0] >= started]
    if last_run:
        finished = last_run
    else:
        started, wall = None, 0.0
    points = spread_finishes(finished)
    if not points:
        return None, ""
    t0 = started or points[0][0]
    points = [(max(t, t0), a) for t, a in points]
    end = max(points[-1][0], t0 + wall)
    tdiv, tname = time_unit(end - t0)
    audio = list(accumulate(a for _, a in points))
    adiv, aname = time_unit(audio[-1])
    times = [0.0] + [(t - t0) / tdiv for t, _ in points] + [(end - t0) / tdiv]
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.step(times, list(range(len(points) + 1)) + [len(points)], where="post", color="tab:blue")
    since = "the start" if started else "the first row"
    ax.set_xlabel(f"{UNIT_WORDS[tname]} since {since}")
    ax.set_ylabel("recordings finished", color="tab:blue")
    ax.set_ylim(bottom=0)
    ax2 = ax.twinx()
    ax2.step(times, [0.0] + [a / adiv for a in audio] + [audio[-1] / adiv], where="post", color="tab:orange")
    ax2.set_ylabel(f"audio finished ({UNIT_WORDS[aname]})", color="tab:orange")
    ax2.set_ylim(bottom=0)
    first = (points[0][0] - t0) / tdiv
    if started and first > 0:
        ax.axvspan(0, first, color="0.92", zorder=0)
        ax.text(first / 2, 0.5, "start-up", ha="center", va="center", color="0.45",
                transform=ax.get_xaxis_transform())
    ax.set_title("Throughput over time")
    return fig, "the last run" if started else "all rows"


def plots(data: dict, save) -> list[tuple[str, str]]:
    """(file name, caption) of each PNG written through ``save(fig, name)``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = []
    fig, scope = _throughput(data, plt)
    if fig is not None:
        out.append((save(fig, "report_throughput.png"),
                    f"Recordings and audio finished over time ({scope}; rows finished together are "
                    "spread over the model time they report)"))
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(8, 3.2))
    stages = data["segment_stages"] or {"(none)": 0}
    a1.barh(list(stages), list(stages.values()), color="tab:green")
    a1.set_title("Segments by decoding stage")
    a1.invert_yaxis()
    steps = {k: v for k, v in data["step_seconds"].items() if v > 0} or {"(none)": 0}
    a2.barh(list(steps), list(steps.values()), color="tab:purple")
    a2.set_title("Time by pipeline step (s)")
    a2.invert_yaxis()
    fig.tight_layout()
    out.append((save(fig, "report_stages.png"), "Stage shares: segments per stage, seconds per step"))
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.hist(data["durations"] or [0.0], bins=30, color="tab:gray")
    ax.set_xlabel("recording duration (s)")
    ax.set_ylabel("recordings")
    ax.set_title("Duration histogram")
    out.append((save(fig, "report_durations.png"), "Recording durations (rows without an error)"))
    if data["wer_by_stage"] or data["wer_by_bucket"]:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(8, 3.2))
        for ax, table, title in ((a1, data["wer_by_stage"], "WER by stage (%)"),
                                 (a2, data["wer_by_bucket"], "WER by duration (%)")):
            names = list(table)
            ax.bar(names, [100 * (table[n][0] or 0.0) for n in names], color="tab:red")
            ax.set_title(title)
            ax.tick_params(axis="x", rotation=30)
        fig.tight_layout()
        out.append((save(fig, "report_wer.png"), "WER by recording stage and by duration bucket"))
    plt.close("all")
    return out
