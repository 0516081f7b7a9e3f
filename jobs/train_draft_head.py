"""Train a CTC draft head for any Whisper checkpoint on the model's own transcripts.

    shardscribe train-draft-head --input SRC --output DIR [--model M] [--max-minutes T]
                                 [--from-output OUT] [--heldout-share F] [--min-confidence C] ...

The draft of "Self-Speculative Decoding for LLM-based ASR with CTC Encoder Drafts" is a CTC
output on the frozen encoder; SSD gains only where it agrees with the decoder. So the head
learns what the decoder writes: SRC is transcribed with the model's greedy AR (the
transcribe job, config ``ar``, confidence on, into DIR/transcripts unless --transcripts;
a rerun resumes there), or the rows of an earlier job of the same model are read
(--from-output). Rows with an error, a filter reason or a mean word confidence below C
are dropped; the kept segments are cut as the job cut them and encoded by the frozen
encoder; the head (the shipped tiny.en head's shape at the model's width, started from
its weights where they fit) is fitted on them for at most T minutes. A held-out share of
the recordings measures the draft's WER against the AR text. DIR gets head.safetensors and config.json
(use: --config ssd --set model.ctc_head=DIR), metrics.json and MODEL_CARD.md.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

COMMAND = "train-draft-head"
# The transcription pass: greedy AR with the job's confidence (the keep rule reads it).
AR_CONFIG = "ar"
# Learning rates: a head that starts whole from the shipped weights is fine-tuned gently
# (on 100 segments of unseen sentences, 1e-3 took tiny.en's held-out CTC WER against AR
# from 44.3% to 55.7%, 2e-4 to 48.9%: docs/ssd.md); a fresh head (another width) learns
# from scratch.
WARM_LR, FRESH_LR = 2e-4, 1e-3
# Families without a Whisper encoder to put a character CTC head on, and why.
NO_HEAD = {
    "granite_speech": "it carries its own CTC output (model.ctc_vocab) for SSD",
    "ctc": "a CTC model is its own draft: decode it with ctc_greedy or ctc_beam",
    "transducer": "a transducer has no attention decoder for a draft to save work in",
}


@dataclass
class DraftHeadOptions:
    """What ``train-draft-head`` is asked to do (its flags, as data)."""
    output: str
    input: str | None = None
    model: str = "tiny.en"
    from_output: str | None = None
    transcripts: str | None = None        # default: DIR/transcripts
    runner: str = "local"
    overrides: list[str] = field(default_factory=list)
    min_confidence: float | None = 0.5
    heldout_share: float = 0.1
    max_minutes: float = 20.0
    epochs: int = 10
    lr: float | None = None               # None: WARM_LR or FRESH_LR, as the head starts
    frame_budget: int = 12000
    seed: int = 0
    # torch CPU threads while the head trains: its GRU runs many small kernels, and on a
    # shared CPU a second thread's spinning costs more than it brings (as train-ctc-head).
    threads: int = 1
    overwrite: bool = False

    def command(self) -> str:
        """The command line that runs these options."""
        flags = {"input": "--input", "output": "--output", "model": "--model", "from_output": "--from-output",
                 "transcripts": "--transcripts", "runner": "--runner", "min_confidence": "--min-confidence",
                 "heldout_share": "--heldout-share", "max_minutes": "--max-minutes", "epochs": "--epochs",
                 "lr": "--lr", "frame_budget": "--frame-budget", "seed": "--seed", "threads": "--threads"}
        defaults = DraftHeadOptions(output="")
        parts = ["shardscribe", COMMAND]
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in flags and value is not None and (f.name == "output" or value != getattr(defaults, f.name)):
                parts += [flags[f.name], str(value)]
        parts += [a for o in self.overrides for a in ("--set", o)]
        return " ".join(shlex.quote(p) for p in parts) + (" --overwrite" if self.overwrite else "")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", default=None, help="audio to transcribe: folder/glob, JSONL manifest or Parquet")
    parser.add_argument("--output", required=True, metavar="DIR", help="the head directory to write")
    parser.add_argument("--model", default="tiny.en", metavar="NAME|DIR|ID",
                        help="the Whisper checkpoint the head drafts for (default: tiny.en)")
    parser.add_argument("--from-output", default=None, metavar="OUT",
                        help="learn from the rows of this earlier transcribe job (of the same model) instead of "
                             "transcribing --input")
    parser.add_argument("--transcripts", default=None, metavar="DST",
                        help="where the AR transcription pass writes its rows (default: DIR/transcripts)")
    parser.add_argument("--runner", choices=["local", "ray"], default="local",
                        help="runner of the transcription pass (default: local, in this process)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="a config key of the transcription pass (model.language, filters.*, ...)")
    parser.add_argument("--min-confidence", type=float, default=0.5, metavar="C",
                        help="drop rows whose mean word confidence is below C (default 0.5: text the audio does "
                             "not carry; the head learns the model's own text, its errors included)")
    parser.add_argument("--heldout-share", type=float, default=0.1, metavar="F",
                        help="share of recordings held out to measure the draft against AR (default 0.1)")
    parser.add_argument("--max-minutes", type=float, default=20.0, metavar="T",
                        help="stop training after T minutes (default 20)")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--lr", type=float, default=None,
                        help=f"learning rate (default: {WARM_LR} for a head that starts from the shipped one "
                             f"whole, {FRESH_LR} for a fresh head of another width)")
    parser.add_argument("--frame-budget", type=int, default=12000, help="padded frames per training batch")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads while the head trains")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a head already in DIR, and transcribe again into the transcripts folder")


def options_of(args: argparse.Namespace) -> DraftHeadOptions:
    return DraftHeadOptions(output=args.output, input=args.input, model=args.model, from_output=args.from_output,
                            transcripts=args.transcripts, runner=args.runner, overrides=list(args.overrides),
                            min_confidence=args.min_confidence, heldout_share=args.heldout_share,
                            max_minutes=args.max_minutes, epochs=args.epochs, lr=args.lr,
                            frame_budget=args.frame_budget, seed=args.seed, threads=args.threads,
                            overwrite=args.overwrite)


class Refused(Exception):
    """A one-line reason not to start (exit 2)."""


def run(args: argparse.Namespace) -> int:
    return train_draft_head(options_of(args))


def train_draft_head(opts: DraftHeadOptions, log=None) -> int:
    """Run ``opts``; the exit status (0 done, 2 refused before any work, 1 nothing to learn,
    or the transcription job's own)."""
    from ..actors.job.spec import JobError
    from ..pipeline.training.draft_head_card import worse_than_before

    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    t0 = time.perf_counter()
    try:
        cfg = preflight(opts)
    except Refused as exc:
        print(f"shardscribe: error: {exc}", file=sys.stderr, flush=True)
        return 2
    try:
        transcripts, how = transcribe(opts)
    except JobError as exc:
        print(f"shardscribe: {exc.label}: {exc}", file=sys.stderr, flush=True)
        return exc.code
    t_transcribed = time.perf_counter()
    learnt = learn(opts, cfg, transcripts, how, log)
    if learnt is None:
        return 1
    head, metrics = learnt
    metrics["minutes"]["transcribe"] = round((t_transcribed - t0) / 60, 2)
    metrics["minutes"]["total"] = round((time.perf_counter() - t0) / 60, 2)
    write(opts.output, head, metrics)
    held = metrics["heldout"]
    log(f"draft head: {opts.output} ({metrics['train_segments']} segments, {metrics['train_hours']} h; held-out "
        f"CTC WER vs AR {_pct(held['after']['wer'])}, before training {_pct(held['before']['wer'])})")
    if worse_than_before(held):
        log("shardscribe: warning: the trained head drafts worse than the one it started from on the held-out "
            "slice (MODEL_CARD.md): train on more audio, or keep the head you have")
    return 0


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def preflight(opts: DraftHeadOptions):
    """Every check before any work: the options, the head directory, the model's family and
    config, and for --from-output that its rows are this model's. Returns the
    transcription pass's config. Refused (one line) otherwise; the input's own checks
    are the transcribe job's, which refuses before its workers start."""
    from ..pipeline.config import ConfigError, load_config
    from ..pipeline.models.errors import ModelError
    from ..pipeline.models.preflight import check_model, family_of_checkpoint, shipped_model
    from ..pipeline.models.whisper.ctc_head import WEIGHTS_FILE

    if (opts.input is None) == (opts.from_output is None):
        raise Refused("give --input SRC (transcribe it) or --from-output OUT (an earlier job's rows), one of them")
    if not 0.0 <= opts.heldout_share < 1.0:
        raise Refused(f"--heldout-share: must be in [0, 1), got {opts.heldout_share}")
    if opts.min_confidence is not None and not 0.0 <= opts.min_confidence <= 1.0:
        raise Refused(f"--min-confidence: must be in [0, 1], got {opts.min_confidence}")
    if (not opts.max_minutes > 0 or opts.epochs < 1 or opts.frame_budget < 1 or opts.threads < 1
            or (opts.lr is not None and not opts.lr > 0)):
        raise Refused("--max-minutes, --lr: must be > 0; --epochs, --frame-budget, --threads: at least 1")
    if (Path(opts.output) / WEIGHTS_FILE).exists() and not opts.overwrite:
        raise Refused(f"{opts.output} already holds a head ({WEIGHTS_FILE}); --overwrite replaces it")
    try:
        named = shipped_model(opts.model)
        family = named[0] if named else family_of_checkpoint(opts.model)
    except ValueError as exc:
        raise Refused(str(exc)) from None
    if family != "whisper":
        why = NO_HEAD.get(family, "only Whisper encoders take this head")
        raise Refused(f"--model {opts.model} is a {family} model: a CTC draft head is trained for Whisper "
                      f"checkpoints only ({why})")
    try:
        cfg = load_config(AR_CONFIG, ["confidence.enabled=true", *opts.overrides], model=opts.model)
        check_model(cfg.model)
        if opts.from_output is not None:
            from ..pipeline.training.draft_head_origin import check_same_model

            check_same_model(opts.from_output, cfg.model, cfg.storage.options)
    except (ConfigError, ModelError) as exc:
        raise Refused(str(exc)) from None
    except OSError as exc:
        raise Refused(f"--from-output {opts.from_output}: {type(exc).__name__}: {exc}") from None
    return cfg


def transcribe(opts: DraftHeadOptions) -> tuple[str, str]:
    """The folder of AR transcripts to learn from, and how it was made (the job's console
    says what it transcribes, and a refusal of its input is its one line)."""
    if opts.from_output is not None:
        return opts.from_output, "an earlier job's rows (--from-output)"
    from .api import transcribe as run_transcribe

    dst = opts.transcripts or str(Path(opts.output) / "transcripts")
    # A rerun with the same options skips the recordings already transcribed there; one
    # with other options is refused by the job (naming the keys), unless --overwrite.
    run_transcribe(opts.input, dst, config=AR_CONFIG, runner=opts.runner, model=opts.model,
                   overwrite=opts.overwrite,
                   set=dict(o.split("=", 1) for o in ["confidence.enabled=true", *opts.overrides]))
    return dst, f"greedy AR, config {AR_CONFIG} with confidence, {opts.runner} runner, by this command"


def learn(opts: DraftHeadOptions, cfg, transcripts: str, how: str, log) -> tuple | None:
    """Select, encode, fit and measure: (the head, its metrics), or None where nothing is
    left to learn."""
    import torch

    from ..pipeline.device import resolve_device, torch_threads
    from ..pipeline.models.registry import load_model
    from ..pipeline.models.whisper.ctc_head import CTCHead, CTCHeadConfig, load_ctc_head, warm_start
    from ..pipeline.models.whisper.ctc_head_fit import FitOptions, examples, fit_ctc_head
    from ..pipeline.output import iter_output
    from ..pipeline.training.draft_head_select import COLUMNS, heldout_ids, select_rows
    from ..pipeline.training.draft_head_states import StatesTally, encode_segments, segment_audio

    rows = [r for batch in iter_output(transcripts, COLUMNS, cfg.storage.options) for r in batch]
    kept, selection = select_rows(rows, opts.min_confidence)
    log(f"train-draft-head: {selection.kept} of {selection.rows} rows kept ({selection.errors} errors, "
        f"{selection.filtered} filtered, {selection.low_confidence} below the confidence rule)")
    if not kept:
        print(f"shardscribe: error: no row of {transcripts} passed the keep rule (errors, filter reasons, "
              f"--min-confidence {opts.min_confidence}): nothing to learn", file=sys.stderr, flush=True)
        return None
    t_states = time.perf_counter()
    adapter = load_model(cfg.model)
    audio = _audio_settings(cfg, transcripts)
    tally, segments = StatesTally(), []
    for k in range(0, len(kept), 32):   # a chunk's audio at a time, not the corpus's
        segments += encode_segments(adapter, segment_audio(kept[k:k + 32], audio, tally), tally, log=log)
    states_min = (time.perf_counter() - t_states) / 60
    model_cfg, multilingual = adapter.model.config, bool(adapter.special.multilingual)
    del adapter     # the head trains on the cached states alone: free the model first
    held_ids = heldout_ids(sorted({s["row_id"] for s in segments}), opts.heldout_share)
    train = [s for s in segments if s["row_id"] not in held_ids]
    held = [s for s in segments if s["row_id"] in held_ids]
    if not train:
        print("shardscribe: error: no segment with text is left to train on", file=sys.stderr, flush=True)
        return None

    shipped = load_ctc_head().config
    device = resolve_device(cfg.model.device)
    torch.manual_seed(opts.seed)
    head = CTCHead(CTCHeadConfig(d_model=model_cfg.d_model, num_classes=shipped.num_classes,
                                 adapter_layers=shipped.adapter_layers, dropout=shipped.dropout,
                                 frame_stack=shipped.frame_stack, charset=shipped.charset,
                                 encoder=f"{cfg.model.source} (frozen, final layer)"))
    copied, total = warm_start(head)
    lr = opts.lr if opts.lr is not None else (WARM_LR if copied == total else FRESH_LR)
    head = head.to(device)
    before = measure(head, held, device)
    fit = FitOptions(epochs=opts.epochs, lr=lr, seed=opts.seed, frame_budget=opts.frame_budget,
                     device=device, max_minutes=opts.max_minutes, stop_within_epoch=True)
    t_train = time.perf_counter()
    with torch_threads(opts.threads):
        curve = fit_ctc_head(head, train, held, fit, log=log)
    train_min = (time.perf_counter() - t_train) / 60
    after = measure(head, held, device)
    return head, {
        "command": opts.command(),
        "model": {"source": cfg.model.source, "family": cfg.model.family, "d_model": model_cfg.d_model,
                  "encoder_layers": model_cfg.encoder_layers,
                  "multilingual": multilingual},
        "transcripts": {"folder": transcripts, "how": how},
        "selection": selection.as_dict(),
        "segments": tally.as_dict(),
        "train_segments": len(train),
        "too_short": len(train) - len(examples(train)),
        "train_hours": round(sum(s["seconds"] for s in train) / 3600, 4),
        "heldout_hours": round(sum(s["seconds"] for s in held) / 3600, 4),
        "heldout": {"share": opts.heldout_share, "rows": len(held_ids), "segments": len(held),
                    "before": before, "after": after, "ids": sorted(held_ids)},
        "init": {"from": "embedded", "tensors": copied, "of": total},
        "head": {k: v for k, v in vars(head.config).items()},
        "parameters": head.num_parameters(),
        "fit": {"epochs": opts.epochs, "lr": lr, "frame_budget": opts.frame_budget, "seed": opts.seed,
                "max_minutes": opts.max_minutes, "device": str(device), "threads": opts.threads},
        "curve": curve,
        "minutes": {"states": round(states_min, 2), "train": round(train_min, 2)},
    }


def _audio_settings(cfg, transcripts: str) -> dict:
    """How the job that wrote ``transcripts`` read and cut audio: its recorded config's
    audio section over this pass's."""
    from ..pipeline.config_record import recorded_config
    from ..pipeline.training.draft_head_origin import row_hashes

    audio = {k: getattr(cfg.audio, k) for k in ("max_segment_s", "vad_threshold", "vad_pad_s",
                                                 "resample_quality", "max_seconds")}
    for job_hash in sorted(row_hashes(transcripts, cfg.storage.options)):
        record = recorded_config(transcripts, job_hash, cfg.storage.options) or {}
        audio.update({k: v for k, v in (record.get("keys", {}).get("audio") or {}).items() if k in audio})
        break
    return audio


def measure(head, rows: list[dict], device) -> dict:
    """The greedy draft against the AR text of ``rows``: WER and CER (Whisper-normalised,
    jiwer) and the share of drafts equal to it after normalisation."""
    from ..pipeline.metrics import corpus_cer, corpus_wer, normalize
    from ..pipeline.models.whisper.ctc_head_fit import greedy_drafts

    if not rows:
        return {"wer": None, "cer": None, "exact": None}
    texts, _ = greedy_drafts(head, rows, device)
    refs = [r["text"] for r in rows]
    exact = sum(normalize(a) == normalize(b) for a, b in zip(refs, texts)) / len(rows)
    return {"wer": corpus_wer(refs, texts), "cer": corpus_cer(refs, texts), "exact": exact}


def write(out_dir: str, head, metrics: dict) -> None:
    """head.safetensors + config.json (what model.ctc_head loads), metrics.json, MODEL_CARD.md."""
    from ..pipeline.models.whisper.ctc_head import save_ctc_head
    from ..pipeline.training.draft_head_card import model_card

    out = save_ctc_head(head, out_dir, extra={"seed": metrics["fit"]["seed"], "epochs": len(metrics["curve"]),
                                              "trained_on": "the model's own greedy AR transcripts"})
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    (out / "MODEL_CARD.md").write_text(model_card(metrics))
