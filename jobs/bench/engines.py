"""Engines benchmark: our job against faster-whisper, the engine a CPU user runs today, on
the same weights and the same audio, in one process.

    shardscribe bench engines [--manifest M] [--quick] [--out R.json]
        [--configs ar,default,ctc_greedy,default+model.quantize=int8] [--rounds 3]

- faster-whisper (``pip install shardscribe[bench]``) on the embedded tiny.en weights
  themselves (they ship as a CTranslate2 model, pipeline.models.whisper.loader, so no
  conversion is needed), file by file, greedy at temperature 0 (no sampling fallback), no
  timestamps, in each ``--compute-types``.
  Where the package is missing, its engine (the ctranslate2 runtime, a dependency of the
  bench extra too) runs in its place, file by file with the same settings, and the row's
  name says so.
- ours: each ``--configs`` entry (a named config, ``+key=value`` overrides appended) end to
  end through the job's own path (actors.local_runner: audio prep, batching, the decoder
  kind's stages, Parquet parts), its actors built once (model loading is not timed).

Every engine is timed from the audio file to the text, in turn, for ``--rounds`` rounds
after a warm-up call; its fastest round counts (other jobs share this machine). Rows:
RTFx, WER and, for ours, where the time goes: audio prep (decode + VAD), log-mel
features, encoder, decoder, second stage and pipeline overhead (the rest of the wall
time: batching, Arrow rows, writing parts). The features are timed in a separate pass over
the same segments (the job counts them inside ``t_encode_s``) and subtracted from it.
"""
from __future__ import annotations

from pathlib import Path

DEFAULT_CONFIGS = "ar,default,ctc_greedy"
FEATURE_BATCH = 16  # segments per feature call, as the job's default token budget batches them


def add_arguments(parser) -> None:
    parser.add_argument("--configs", default=DEFAULT_CONFIGS,
                        help="our configs, comma-separated; NAME+key=value+... adds overrides")
    parser.add_argument("--compute-types", default="int8,float32", help="faster-whisper compute types")
    parser.add_argument("--rounds", type=int, default=0, help="timed rounds (0: 3, --quick: 1)")
    parser.add_argument("--threads", type=int, default=0, help="threads for every engine (0: the physical cores this process may use, "
                        "as the job's model stage takes them)")
    parser.add_argument("--limit", type=int, default=0, help="first N recordings (0: all; --quick: 8)")
    parser.add_argument("--long-form", type=float, default=0.0, metavar="SECONDS",
                        help="join the manifest's recordings into files of up to SECONDS (silences of 0.4 s "
                             "between them, references joined) and run every engine on those")
    parser.add_argument("--plot", default=None, help="PNG path (default: beside --out)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a key in every one of our configs (e.g. model.cache_dir=DIR)")


def parse_spec(spec: str) -> tuple[str, list[str]]:
    """``NAME+key=value+...`` -> (config name, overrides)."""
    name, *overrides = spec.strip().split("+")
    return name, overrides


class FasterWhisper:
    """faster-whisper (or its engine alone where the package is missing), file by file."""

    def __init__(self, compute_type: str, threads: int):
        from ...pipeline.models.whisper.loader import embedded_ct2_dir

        self.compute_type = compute_type
        path = str(embedded_ct2_dir())
        try:
            from faster_whisper import WhisperModel
        except ImportError:
            WhisperModel = None
        if WhisperModel is not None:
            self.name = f"faster-whisper {compute_type}"
            self.model = WhisperModel(path, device="cpu", compute_type=compute_type, cpu_threads=threads)
            self.engine = None
        else:
            import ctranslate2
            from transformers import WhisperFeatureExtractor, WhisperTokenizerFast

            self.name = f"ctranslate2 {compute_type} (faster-whisper not installed)"
            self.model = None
            self.engine = ctranslate2.models.Whisper(path, device="cpu", compute_type=compute_type,
                                                     intra_threads=threads)
            self.fe = WhisperFeatureExtractor(feature_size=self.engine.n_mels)
            self.tokenizer = WhisperTokenizerFast(tokenizer_file=str(Path(path) / "tokenizer.json"))
            self.prompt = self.tokenizer.convert_tokens_to_ids(["<|startoftranscript|>", "<|notimestamps|>"])

    def transcribe(self, row: dict) -> str:
        from ...pipeline.audio import SAMPLE_RATE, decode_stream
        from ...pipeline.sources import open_audio

        with open_audio(row) as fh:
            samples, _, _ = decode_stream(fh)
        if self.model is not None:
            # Greedy at temperature 0 only, as ours: faster-whisper's default would re-decode
            # a window by sampling at higher temperatures when its text looks repetitive.
            segments, _ = self.model.transcribe(samples, language="en", beam_size=1, temperature=0.0,
                                                without_timestamps=True, condition_on_previous_text=False,
                                                vad_filter=False)
            return " ".join(s.text.strip() for s in segments).strip()
        import ctranslate2

        window = 30 * SAMPLE_RATE
        texts = []
        for start in range(0, max(1, len(samples)), window):  # faster-whisper's sequential 30-s windows
            feats = self.fe(samples[start:start + window], sampling_rate=SAMPLE_RATE, return_tensors="np")
            res = self.engine.generate(ctranslate2.StorageView.from_array(feats.input_features),
                                       [self.prompt], beam_size=1)
            texts.append(self.tokenizer.decode(res[0].sequences_ids[0], skip_special_tokens=True).strip())
        return " ".join(t for t in texts if t)

    def run(self, rows: list[dict], workdir: Path) -> dict:
        return {"texts": {r["id"]: self.transcribe(r) for r in rows}}


class Ours:
    """A config of ours end to end through actors.local_runner, actors built once."""

    def __init__(self, spec: str, device: str | None, common: list[str]):
        from ...actors.local_runner import build_stages
        from ...pipeline.config import load_config

        name, overrides = parse_spec(spec)
        overrides = [*common, *overrides]
        if device:
            overrides = [f"model.device={device}", *overrides]
        self.name = f"ours {spec}"
        cfg = load_config(None if name == "default" else name, overrides)
        # Steady-state throughput: the job's slow start (a first batch cut into growing
        # pieces, for early progress) is a one-off cost that a long job does not feel.
        if not any(o.startswith("batching.first_batch=") for o in overrides):
            cfg = load_config(None if name == "default" else name,
                              [*overrides, f"batching.first_batch={cfg.batching.recordings_per_batch}"])
        self.cfg = cfg
        self.stages = build_stages(self.cfg)
        self.runs = 0

    @property
    def adapter(self):
        return self.stages[1].adapter

    def run(self, rows: list[dict], workdir: Path) -> dict:
        from ...actors.local_runner import run_local
        from ...pipeline.output import read_output

        self.runs += 1
        dst = workdir / f"{self.name.replace(' ', '_').replace('/', '_')}-{self.runs}"
        run_local(rows, self.cfg, str(dst), progress=False, stages=self.stages)
        out = read_output(str(dst), ["id", "text", "t_prepare_s", "t_encode_s", "t_decode_s", "t_fallback_s",
                                     "segments"]).to_pylist()
        stage = {k: sum(r[k] or 0.0 for r in out) for k in ("t_prepare_s", "t_encode_s", "t_decode_s", "t_fallback_s")}
        res = {"texts": {r["id"]: r["text"] or "" for r in out}, "stages": stage,
               "segments": segment_counts([s for r in out for s in r["segments"] or []])}
        policy = getattr(self.stages[1].decoder, "verify_policy", None)
        if policy is not None:
            # SSD's draft-or-skip decisions so far (its state carries over between rounds,
            # as it does between the batches of a long job)
            res["verify_policy"] = {"drafted_batches": policy.drafted_batches,
                                    "skipped_batches": policy.skipped_batches,
                                    "gain": policy.gain(), "cost": policy.cost()}
        return res


def segment_counts(segments: list[dict]) -> dict:
    """How a decoder kind decided its segments: the count per stage, and the share of the
    decoder tokens that a draft supplied (a verified draft's tokens, or an AR fallback's
    verified prefix), which is what speculative decoding saves."""
    counts: dict[str, int] = {}
    tokens = drafted = 0
    for seg in segments:
        counts[seg["stage"]] = counts.get(seg["stage"], 0) + 1
        n = seg["tokens"] or 0
        tokens += n
        drafted += n if seg["stage"] == "llm_verify" else min(n, seg["prefix_len"] or 0)
    return {"by_stage": counts, "tokens": tokens, "draft_token_share": drafted / tokens if tokens else 0.0}


def feature_seconds(adapter, recordings: list[list]) -> float:
    """Seconds of the log-mel features of every segment, in batches of FEATURE_BATCH (the
    fastest of two passes)."""
    from .data import best_of

    segs = [a for rec in recordings for a in rec]
    batches = [segs[i:i + FEATURE_BATCH] for i in range(0, len(segs), FEATURE_BATCH)]
    _, secs = best_of(2, lambda: [adapter.features(b) for b in batches])
    return secs


def run(args) -> dict:
    import tempfile

    import torch

    from .data import DEFAULT_MANIFEST, write_long_form
    from ...pipeline.device import worker_threads

    # Every engine gets the same threads: faster-whisper's cpu_threads, and our model
    # stages' model.num_threads (pipeline.device.worker_threads, which they default to).
    threads = worker_threads(args.threads)
    torch.set_num_threads(threads)
    limit = args.limit or (8 if args.quick else 0)
    rounds = args.rounds or (1 if args.quick else 3)
    source = args.manifest or str(DEFAULT_MANIFEST)
    with tempfile.TemporaryDirectory(prefix="bench-engines-long-") as long_dir:
        manifest = source
        if args.long_form:
            manifest, limit = write_long_form(source, args.long_form, long_dir, limit), 0
        return _run(args, source, manifest, limit, rounds, threads)


def _run(args, source: str, manifest: str, limit: int, rounds: int, threads: int) -> dict:
    """:func:`run` over ``manifest`` (``source`` itself, or its clips joined by
    ``--long-form``)."""
    import tempfile

    import torch

    from .data import load_recordings
    from ...pipeline.audio import SAMPLE_RATE, decode_stream
    from ...pipeline.device import cpu_bf16_native
    from ...pipeline.metrics import corpus_wer
    from ...pipeline.sources import open_audio, read_source
    from ...pipeline.timing import timed

    rows = read_source(manifest)[:limit or None]
    recordings, _ = load_recordings(manifest, limit)
    audio_s = sum(len(a) for rec in recordings for a in rec) / SAMPLE_RATE  # speech the job decodes
    durations = {}
    for r in rows:
        with open_audio(r) as fh:
            durations[r["id"]] = len(decode_stream(fh)[0]) / SAMPLE_RATE
    file_s = sum(durations.values())
    refs = {r["id"]: r.get("reference") or "" for r in rows}

    engines = [FasterWhisper(ct, threads) for ct in args.compute_types.split(",") if ct]
    ours_common = [f"model.num_threads={threads}", *args.overrides]
    engines += [Ours(spec, args.device, ours_common) for spec in args.configs.split(",") if spec]
    best: dict[str, float] = {}
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench-engines-") as tmp:
        work = Path(tmp)
        for engine in engines:  # warm-up: first-call costs (allocators, lazy imports) untimed
            engine.run(rows[:1], work)
        for _ in range(rounds):
            for engine in engines:
                res, secs = timed(engine.run, rows, work)
                if secs < best.get(engine.name, float("inf")):
                    best[engine.name], results[engine.name] = secs, res
    ids = [r["id"] for r in rows]
    out_rows = []
    baseline = best[engines[0].name]
    for engine in engines:
        wall, res = best[engine.name], results[engine.name]
        hyps = [res["texts"].get(i, "") for i in ids]
        row = {"engine": engine.name, "recordings": len(rows), "audio_s": file_s, "wall_s": wall,
               "rtfx": file_s / wall, "vs_first": baseline / wall,
               "wer": corpus_wer([refs[i] for i in ids], hyps), "texts": dict(zip(ids, hyps))}
        if "stages" in res:
            st = res["stages"]
            feats = feature_seconds(engine.adapter, recordings)
            row.update(prepare_s=st["t_prepare_s"], features_s=feats,
                       encoder_s=max(0.0, st["t_encode_s"] - feats), decoder_s=st["t_decode_s"],
                       fallback_s=st["t_fallback_s"], overhead_s=wall - sum(st.values()))
        if "segments" in res:
            row["segments"] = res["segments"]
        if "verify_policy" in res:
            row["verify_policy"] = res["verify_policy"]
        out_rows.append(row)
    summary = {"manifest": source, "long_form_s": args.long_form or None, "rounds": rounds, "threads": threads, "speech_s": audio_s,
               "cpu_bf16_native": cpu_bf16_native(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
               "baseline": engines[0].name,
               "speed_vs_baseline": {r["engine"]: r["vs_first"] for r in out_rows},
               "wer": {r["engine"]: r["wer"] for r in out_rows},
               "segments": {r["engine"]: r["segments"] for r in out_rows if "segments" in r}}
    plot = args.plot or (str(Path(args.out).with_suffix(".png")) if getattr(args, "out", None) else None)
    if plot:
        _plot(out_rows, plot)
        summary["plot"] = plot
    return {"rows": out_rows, "summary": summary}


def _plot(rows: list[dict], path: str) -> None:
    """RTFx per engine (WER on each bar), and our stage breakdown as stacked bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from .data import save_figure

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.5))
    names = [r["engine"] for r in rows]
    ax1.barh(names, [r["rtfx"] for r in rows], color=["#3a7" if "prepare_s" in r else "#888" for r in rows])
    for i, r in enumerate(rows):
        wer = r["wer"]
        ax1.text(r["rtfx"], i, f" WER {100 * wer:.1f}%" if wer is not None else "", va="center", fontsize=8)
    ax1.set_xlabel("RTFx (audio s / wall s)")
    ax1.invert_yaxis()
    ours = [r for r in rows if "prepare_s" in r]
    parts = ["prepare_s", "features_s", "encoder_s", "decoder_s", "fallback_s", "overhead_s"]
    left = [0.0] * len(ours)
    for part in parts:
        vals = [max(0.0, r[part]) for r in ours]
        ax2.barh([r["engine"] for r in ours], vals, left=left, label=part[:-2])
        left = [a + b for a, b in zip(left, vals)]
    ax2.set_xlabel("seconds (fastest round)")
    ax2.invert_yaxis()
    ax2.legend(fontsize=8)
    save_figure(fig, path, dpi=110)
