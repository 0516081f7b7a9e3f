"""End-to-end benchmark: the job against its own model on the same clips and config, in one
run, and where the difference goes.

    shardscribe bench e2e [--manifest M] [--config NAME] [--model DIR] [--set KEY=VALUE]...
        [--runners local,ray] [--rounds 3] [--limit N] [--device cuda] [--quick] [--out R.json]

- **job, local**: the job through the in-process runner (actors.local_runner: audio
  decode, resampling and VAD, batching, the decoder kind's stages, Parquet parts), its
  actors built once (model loading is not timed), the fastest of ``--rounds`` runs.
- **job, ray**: the same config and clips through `shardscribe transcribe --runner ray` in a
  subprocess (a local Ray instance), the RTFx its summary states: Ray's start-up and the
  model's loading included (skipped where Ray is not installed).
- **model alone**: every call the local job made to its decoder kind (the first stage's
  ``decode`` on the segments it batched, the second stage's ``finish`` on the pending
  segments it pooled), recorded during one untimed run and replayed in the same order on
  the same inputs, already decoded and in memory: log-mel features, encoder and decoder at
  the job's own batch sizes, nothing else. Its RTFx is the ceiling the job can reach;
  ``job_over_model`` is the job's share of it.
- **where the rest goes**: seconds of the fastest local run spent inside the model's calls
  (its wall time less these is all the job adds to its model), in audio preparation
  (decoding and resampling, then VAD: measured apart on the same files), in the model
  stages outside the model's calls (batching, row assembly), and in the loop and the
  Parquet parts (the rest of the wall time); and, inside the model's calls, the log-mel
  features and (on CUDA) the host-to-device copies of the audio, timed apart on the
  job's own batches. Stages that overlap (audio prepared while the model runs) are counted
  where they run, so the shares need not add up to the wall time.

RTFx is the recordings' audio seconds over wall seconds. Default manifest: the held-out
mix of the golden set (tests/golden/heldout.jsonl: 20 held-out voices, 20 held-out texts).
"""
from __future__ import annotations

import copy
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HELDOUT_MIX = Path(__file__).resolve().parents[2] / "tests/golden/heldout.jsonl"


def add_arguments(parser) -> None:
    parser.add_argument("--config", default="default", help="the job's config (a name or a YAML path)")
    parser.add_argument("--model", default=None, help="a checkpoint DIR or id, as transcribe --model takes it")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key (as transcribe --set)")
    parser.add_argument("--runners", default="local,ray", help="job runners to time: local, ray or both")
    parser.add_argument("--rounds", type=int, default=0, help="timed rounds of the local job and the model "
                        "alone (0: 3, --quick: 1); the fastest counts")
    parser.add_argument("--limit", type=int, default=0, help="first N recordings (0: all; --quick: 12)")


class _Timed:
    """A stage object whose listed methods (and calls) add their seconds to ``spent[label]``."""

    def __init__(self, target, label: str, spent: dict, methods: tuple[str, ...] = ()):
        self._target, self._label, self._spent, self._methods = target, label, spent, methods

    def _timed(self, fn, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self._spent[self._label] = self._spent.get(self._label, 0.0) + time.perf_counter() - t0

    def __call__(self, *args, **kwargs):
        return self._timed(self._target, *args, **kwargs)

    def __getattr__(self, name):
        attr = getattr(self._target, name)
        if name in self._methods:
            return lambda *a, **k: self._timed(attr, *a, **k)
        return attr


class ModelCalls:
    """Records the decoder kind's model calls of a run (inputs copied before each call, so
    a call that updates its items in place replays on what it was given), times them
    while recording is off, and replays them."""

    def __init__(self, first_stage, second_stage, device):
        self.device = device
        self.calls: list[tuple[str, tuple, dict]] = []
        self.recording = False
        self.spent = 0.0
        self._depth = 0
        self.first, self.second = first_stage, second_stage
        self._decode = first_stage.decode
        first_stage.decode = self._wrap("decode", self._decode)
        self._finish = None
        if second_stage is not None:
            self._finish = second_stage.finish
            second_stage.finish = self._wrap("finish", self._finish)

    def _wrap(self, name, fn):
        def call(*args, **kwargs):
            # A call inside another (a first stage that hands a batch it did not draft to
            # the fallback in its own process) is part of the outer one: recorded and
            # timed once, or the replay would decode it twice.
            if self._depth:
                return fn(*args, **kwargs)
            if self.recording:
                self.calls.append((name, copy.deepcopy(args), copy.deepcopy(kwargs)))
            self._depth += 1
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.spent += time.perf_counter() - t0
                self._depth -= 1
        return call

    def replay(self, threads: int) -> float:
        """Seconds of every recorded call, on the job's intra-op threads (its model
        stages': pipeline.device.worker_threads); a second stage's items are copied before
        the clock starts (it writes its results into them)."""
        from ...pipeline.device import torch_threads
        from ...pipeline.timing import synchronize

        spent = 0.0
        # No inference_mode here: the job's model stages do not run under it either.
        with torch_threads(threads):
            for name, args, kwargs in self.calls:
                fn = self._decode if name == "decode" else self._finish
                args = copy.deepcopy(args) if name == "finish" else args
                synchronize(self.device)
                t0 = time.perf_counter()
                fn(*args, **kwargs)
                synchronize(self.device)
                spent += time.perf_counter() - t0
        return spent

    def decode_batches(self) -> list[list]:
        """The audio of each first-stage call, as the job batched it."""
        return [list(args[0]) for name, args, _ in self.calls if name == "decode"]

    def restore(self) -> None:
        self.first.decode = self._decode
        if self.second is not None:
            self.second.finish = self._finish


def _file_seconds(rows: list[dict]) -> tuple[float, float]:
    """(audio seconds of the files at 16 kHz, seconds spent decoding and resampling them)."""
    from ...pipeline.audio import SAMPLE_RATE, decode_stream
    from ...pipeline.sources import open_audio

    total, t0 = 0.0, time.perf_counter()
    for r in rows:
        with open_audio(r) as fh:
            total += len(decode_stream(fh)[0]) / SAMPLE_RATE
    return total, time.perf_counter() - t0


def _copy_seconds(adapter, batches: list[list], device) -> float:
    """Host-to-device seconds of the job's audio batches (0 on the CPU: nothing moves)."""
    import numpy as np
    import torch

    from ...pipeline.device import is_cuda
    from ...pipeline.timing import timed

    if not is_cuda(str(device)):
        return 0.0
    padded = []
    for batch in batches:
        width = max(len(a) for a in batch)
        host = torch.zeros(len(batch), width, dtype=torch.float32).pin_memory()
        for i, a in enumerate(batch):
            host[i, :len(a)] = torch.from_numpy(np.asarray(a, dtype=np.float32))
        padded.append(host)
    _, secs = timed(lambda: [p.to(device, non_blocking=True) for p in padded], device=device)
    return secs


def _ray_job(args, rows: list[dict], workdir: Path) -> dict | None:
    """The job through Ray in a subprocess: its summary's RTFx (start-up and model load
    included), or None where Ray is not installed."""
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        return None
    out = workdir / "ray_out"
    manifest = workdir / "clips.jsonl"
    manifest.write_text("".join(json.dumps({"id": r["id"], "audio": r["audio"]}) + "\n" for r in rows))
    cmd = [sys.executable, "-m", "shardscribe.jobs.cli", "transcribe", "--input", str(manifest), "--output", str(out),
           "--config", args.config, "--runner", "ray", "--progress-interval", "0"]
    if args.model:
        cmd += ["--model", args.model]
    for o in _overrides(args):
        cmd += ["--set", o]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"the Ray job failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
    summary = json.loads((out / "__shardscribe__/summary.json").read_text())
    return {"rtfx": summary.get("rtfx"), "wall_s": summary.get("wall_seconds"), "command_s": wall,
            "rows_out": summary.get("rows_out"), "errors": summary.get("errors")}


def _overrides(args) -> list[str]:
    sets = list(args.overrides)
    if args.device:
        sets.insert(0, f"model.device={args.device}")
    return sets


def run(args) -> dict:
    import torch

    from ...actors.local_runner import build_stages, run_local
    from ...pipeline.config import load_config
    from ...pipeline.device import torch_threads
    from ...pipeline.output import read_output
    from ...pipeline.sources import read_source
    from ...pipeline.timing import timed

    rounds = args.rounds or (1 if args.quick else 3)
    limit = args.limit or (12 if args.quick else 0)
    manifest = args.manifest or str(HELDOUT_MIX)
    rows = read_source(manifest)[:limit or None]
    runners = [r for r in args.runners.split(",") if r]
    unknown = set(runners) - {"local", "ray"}
    if unknown:
        raise SystemExit(f"--runners: unknown {sorted(unknown)} (local, ray)")
    config = None if args.config == "default" else args.config
    overrides = _overrides(args)
    cfg = load_config(config, overrides, model=args.model)
    # Steady state: the slow start (a first batch cut into growing pieces, for early
    # progress) is a one-off cost a long job does not feel.
    if not any(o.startswith("batching.first_batch=") for o in overrides):
        cfg = load_config(config, [*overrides, f"batching.first_batch={cfg.batching.recordings_per_batch}"],
                          model=args.model)
    audio_s, t_decode_resample = _file_seconds(rows)

    prep, model, second = build_stages(cfg)
    adapter = model.adapter
    device = getattr(adapter, "device", "cpu")
    calls = ModelCalls(model.decoder, second.stage if second is not None else None, device)
    spent: dict[str, float] = {}
    stages = (_Timed(prep, "prepare", spent), _Timed(model, "model_stage", spent, ("rows",)),
              _Timed(second, "second_stage", spent, ("finish_rows", "price_rows")) if second is not None else None)
    result_rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-e2e-") as tmp:
        work = Path(tmp)
        # Warm-up (first-call costs untimed), recording the model's calls on the way.
        calls.recording = True
        run_local(rows, cfg, str(work / "warm"), progress=False, stages=stages)
        calls.recording = False
        texts = {r["id"]: r["text"] for r in read_output(str(work / "warm"), ["id", "text"]).to_pylist()}
        # The job and the model alone in turn, round by round, so that load from other
        # processes falls on both alike; the fastest of each counts.
        best, model_s = None, float("inf")
        for n in range(rounds):
            spent.clear()
            calls.spent = 0.0
            _, wall = timed(run_local, rows, cfg, str(work / f"run{n}"), progress=False, stages=stages,
                            device=device)
            if best is None or wall < best[0]:
                best = (wall, dict(spent), calls.spent)
            model_s = min(model_s, calls.replay(model.threads))
        wall, spent_best, in_model = best
        batches = calls.decode_batches()
        feature_fn = getattr(adapter, "features", None)
        with torch_threads(model.threads):
            features_s = (min(timed(lambda: [feature_fn(b) for b in batches], device=device)[1]
                              for _ in range(rounds)) if feature_fn is not None and batches else 0.0)
        copies_s = _copy_seconds(adapter, batches, device) if batches else 0.0
        calls.restore()
        ray = _ray_job(args, rows, work) if "ray" in runners else None

    local_rtfx = audio_s / wall
    model_rtfx = audio_s / model_s
    stage_s = spent_best.get("model_stage", 0.0) + spent_best.get("second_stage", 0.0)
    prepare_s = spent_best.get("prepare", 0.0)
    result_rows.append({"what": "model alone (features + encoder + decoder, the job's batches)",
                        "seconds": model_s, "rtfx": model_rtfx, "share_of_job": model_s / wall})
    if "local" in runners:
        result_rows.append({"what": "job, local runner", "seconds": wall, "rtfx": local_rtfx,
                            "share_of_job": 1.0, "vs_model": local_rtfx / model_rtfx})
    if ray is not None:
        result_rows.append({"what": "job, ray runner (start-up + model load included)", "seconds": ray["wall_s"],
                            "rtfx": ray["rtfx"], "share_of_job": None,
                            "vs_model": ray["rtfx"] / model_rtfx if ray["rtfx"] else None})
    parts = [
        ("job: inside the model's calls", in_model),
        ("  in model: log-mel features", features_s),
        ("  in model: host-to-device copies", copies_s),
        ("audio prep (decode, resample, VAD)", prepare_s),
        ("  of it: decode + resample (apart)", t_decode_resample),
        ("model stages outside the model (batching, rows)", max(0.0, stage_s - in_model)),
        ("loop + Parquet parts (the rest)", max(0.0, wall - prepare_s - stage_s)),
    ]
    result_rows += [{"what": name, "seconds": secs, "rtfx": None, "share_of_job": secs / wall} for name, secs in parts]
    summary = {
        "manifest": manifest, "recordings": len(rows), "audio_s": audio_s, "config": args.config,
        "overrides": overrides, "model": args.model, "device": str(device), "rounds": rounds,
        "batches": len(batches), "segments_per_batch": (sum(len(b) for b in batches) / len(batches)) if batches else 0,
        "local_rtfx": local_rtfx, "model_rtfx": model_rtfx, "job_over_model": local_rtfx / model_rtfx,
        # The job's own time in the model's calls: the rest of its wall time is what the
        # job adds; a gap between these calls and the replay's is the calls' own variance.
        "job_in_model_s": in_model, "job_outside_model_share": 1.0 - in_model / wall,
        "ray_rtfx": ray["rtfx"] if ray else None, "ray": ray, "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(), "texts": texts,
    }
    return {"rows": result_rows, "summary": summary}
