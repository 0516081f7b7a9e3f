"""`shardscribe report DST`: the page and its plots from an output folder, WER per stage and
duration bucket against jiwer on the same rows, the errors table, the transcript tables
(the first rows by id, the worst rows by WER), the audio total in a fitting unit, the
throughput spread of rows finished together; and, where Chromium is installed, the page
rendered headless: its DOM and a screenshot."""
from __future__ import annotations

import random
import shutil
import subprocess
from html.parser import HTMLParser

import jiwer
import pyarrow.parquet as pq
import pytest

from shardscribe.jobs.cli import main
from shardscribe.pipeline.output import SIDECAR_DIR
from shardscribe.pipeline.records import OUTPUT_SCHEMA, table
from shardscribe.pipeline.report_plots import duration_text, spread_finishes

VOCAB = "the pump valve tank was checked drained cleaned before after lunch".split()
PNG = b"\x89PNG\r\n\x1a\n"


def _rows(seed=0):
    rng = random.Random(seed)
    rows, t = [], 1_700_000_000.0
    for i in range(70):
        ref = " ".join(rng.choice(VOCAB) for _ in range(rng.randint(3, 9)))
        words = ref.split()
        if rng.random() < 0.4:
            words[rng.randrange(len(words))] = rng.choice(VOCAB)
        stage = rng.choice(["ctc_gate", "llm_verify", "ar_fallback"])
        duration = rng.choice([2.0, 7.0, 20.0, 45.0])
        t += rng.uniform(0.1, 2.0)
        row = {"id": f"r{i:02d}", "audio": f"/a/r{i}.wav", "duration_s": duration, "text": " ".join(words),
               "reference": ref, "stage": stage, "error": None, "t_prepare_s": 0.01, "t_encode_s": 0.1,
               "t_decode_s": 0.2, "t_fallback_s": 0.0, "finished_at": t,
               "segments": [{"start": 0.0, "end": duration, "text": " ".join(words), "stage": stage}]}
        rows.append(row)
    for i, message in enumerate(["file not found: /a/x.wav", "file not found: /a/y.wav",
                                 "cannot decode audio: Format not recognised"]):
        rows.append({"id": f"bad{i}", "audio": f"/a/bad{i}.wav", "stage": "error", "error": message,
                     "segments": [], "finished_at": t})
    return rows


class _Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.images, self.cells, self._cell = [], [], None

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.images.append(dict(attrs)["src"])
        if tag == "td":
            self._cell = ""

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data

    def handle_endtag(self, tag):
        if tag == "td":
            self.cells.append(self._cell)
            self._cell = None


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    dst = tmp_path_factory.mktemp("report") / "out"
    dst.mkdir()
    rows = _rows()
    pq.write_table(table(rows[:45], OUTPUT_SCHEMA), dst / "part-0.parquet")
    pq.write_table(table(rows[45:], OUTPUT_SCHEMA), dst / "part-1.parquet")
    assert main(["report", str(dst)]) == 0
    return dst, rows


def test_page_plots_and_tables(report):
    dst, rows = report
    side = dst / SIDECAR_DIR
    page = _Page()
    page.feed((side / "report.html").read_text())
    assert page.images == ["report_throughput.png", "report_stages.png", "report_durations.png", "report_wer.png"]
    for name in page.images:
        data = (side / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 5000
    cells = page.cells
    ok = [r for r in rows if not r["error"]]
    # WER per stage and per duration bucket, each against jiwer on that group alone.
    for stage in ("ctc_gate", "llm_verify", "ar_fallback"):
        group = [r for r in ok if r["stage"] == stage]
        wer = jiwer.wer([r["reference"] for r in group], [r["text"] for r in group])
        i = cells.index(stage)
        assert cells[i + 1] == f"{100 * wer:.1f} %" and cells[i + 2] == str(len(group))
    for name, low, high in (("0-5 s", 0, 5), ("5-10 s", 5, 10), ("10-30 s", 10, 30), ("30-60 s", 30, 60)):
        group = [r for r in ok if low <= r["duration_s"] < high]
        wer = jiwer.wer([r["reference"] for r in group], [r["text"] for r in group])
        i = cells.index(name)
        assert cells[i + 1] == f"{100 * wer:.1f} %" and cells[i + 2] == str(len(group))
    i = cells.index("missing")          # error kinds: pipeline.output.ERROR_KINDS
    assert cells[i + 1:i + 3] == ["2", "bad0, bad1"]
    i = cells.index("corrupt")
    assert cells[i + 1] == "1"
    assert cells[cells.index("rows") + 1] == str(len(rows))
    audio = sum(r["duration_s"] for r in ok)
    assert cells[cells.index("audio") + 1] == f"{audio / 60:.1f} min"


def _row_wer(r):
    return jiwer.wer(r["reference"], r["text"])


def test_transcript_tables(report):
    """The first 50 rows by id (error rows too, with their error), and the 20 rows with the
    highest WER (ties: more word errors, then the id), every WER in percent."""
    dst, rows = report
    page = (dst / SIDECAR_DIR / "report.html").read_text()
    worst_html, first_html = page.split("id=worst>")[1].split("id=transcripts>")
    first = sorted(rows, key=lambda r: r["id"])[:50]
    assert f"the first 50 of {len(rows)} rows by id" in first_html
    firsts = _Page()
    firsts.feed(first_html)
    ids = [c for c in firsts.cells if c in {r["id"] for r in rows}]
    assert ids == [r["id"] for r in first]
    assert "error: file not found: /a/x.wav" in firsts.cells
    wrong = [r for r in rows if not r["error"] and _row_wer(r) > 0]
    wrong.sort(key=lambda r: (-_row_wer(r), -jiwer.process_words(r["reference"], r["text"]).substitutions, r["id"]))
    worsts = _Page()
    worsts.feed(worst_html)
    ids = [c for c in worsts.cells if c in {r["id"] for r in rows}]
    assert ids == [r["id"] for r in wrong[:20]]
    i = worsts.cells.index(wrong[0]["id"])
    assert worsts.cells[i + 3] == f"{100 * _row_wer(wrong[0]):.1f} %"


def test_audio_units_and_throughput_spread():
    assert [duration_text(s) for s in (10.0, 600.0, 36000.0)] == ["10.0 s", "10.0 min", "10.00 h"]
    # Seven rows committed together (one batch) at t=100, each reporting 0.4 s of model
    # time, then one row alone: the batch's rows end 0.4 s apart, the last at t=100.
    batch = [(100.0, 0.4, 3.0)] * 7 + [(105.0, 0.5, 2.0)]
    times = [t for t, _ in spread_finishes(batch)]
    assert times == pytest.approx([97.6 + 0.4 * k for k in range(7)] + [105.0])


def test_not_an_output_folder_is_one_line(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "no Parquet parts" in capsys.readouterr().err


CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium (bash scripts/setup.sh --test installs it)")
def test_page_renders_in_headless_chromium(report, tmp_path):
    """One Chromium run gives both the rendered DOM and a screenshot."""
    dst, rows = report
    shot = tmp_path / "shot.png"
    done = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                           "--disable-background-networking", "--disable-component-update", "--disable-sync",
                           f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1000,1400",
                           f"--screenshot={shot}", "--dump-dom", (dst / SIDECAR_DIR / "report.html").as_uri()],
                          capture_output=True, text=True, timeout=120, check=True)
    dom = done.stdout
    assert '<img src="report_throughput.png"' in dom
    assert dom.count('<table class="transcripts">') == 2 and ">r00</td>" in dom
    from PIL import Image

    image = Image.open(shot).convert("L")
    assert image.size == (1000, 1400)
    # The plots rendered: a good share of the page is not white.
    dark = sum(image.histogram()[:200])
    assert dark > 0.02 * image.size[0] * image.size[1]


def test_report_of_an_output_on_an_s3_compatible_store(s3_endpoint, capsys):
    """An output on a store reached through storage.options (a moto server on loopback):
    `report` takes the job's --config/--set like the job did."""
    import fsspec

    from shardscribe.pipeline.output import write_part

    options = {"endpoint_url": s3_endpoint}
    fs = fsspec.filesystem("s3", skip_instance_cache=True, **options)
    fs.mkdir("report-bucket")
    write_part(table(_rows(), OUTPUT_SCHEMA), "s3://report-bucket/out", "job", options)
    assert main(["report", "s3://report-bucket/out", "--set", f"storage.options={{endpoint_url: '{s3_endpoint}'}}"]) == 0
    assert "report.html" in capsys.readouterr().out
    page = fs.cat(f"report-bucket/out/{SIDECAR_DIR}/report.html").decode()
    assert "<html" in page.lower() and fs.ls(f"report-bucket/out/{SIDECAR_DIR}")
