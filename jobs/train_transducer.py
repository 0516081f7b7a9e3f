"""Train the embedded TDT (or, with --rnnt, RNN-T) transducer on the frozen Whisper tiny.en encoder.

    shardscribe train-transducer --manifest TRAIN.jsonl [...] --eval-manifest HELD.jsonl [...]
                                 --output DIR [--cache DIR] [--epochs N] [--seed S]

Encoder states are cached as for train-ctc-head (same --cache layout: training rows packed
into 30-s windows, held-out rows encoded alone). The frozen CTC head's adapter
(``--ctc-head``, default the shipped one) runs over them once; then the frame projection,
the LSTM predictor and the joint train with transformers' TDT loss. DIR receives
transducer.safetensors, config.json and metrics.json (curve, greedy CER/WER per held-out
split); ``--model dir`` or ``model.source=DIR`` loads it. Deterministic given --seed on one
CPU thread.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import time

COMMAND = "train-transducer"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--manifest", nargs="+", required=True, help="training manifests (JSONL)")
    parser.add_argument("--eval-manifest", nargs="*", default=[], help="held-out manifests")
    parser.add_argument("--output", required=True, help="directory for the transducer files")
    parser.add_argument("--cache", default=".cache/ctc_features", help="encoder-state cache")
    parser.add_argument("--ctc-head", default="embedded", help="the frozen CTC head whose adapter feeds the joint")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cell-budget", type=int, default=400_000,
                        help="padded joint cells (batch x frames x (labels + 1)) per training batch")
    parser.add_argument("--d-model", type=int, default=320)
    parser.add_argument("--rnnt", action="store_true", help="an RNN-T (no durations) instead of a TDT")
    parser.add_argument("--max-minutes", type=float, default=None,
                        help="stop after the epoch that passes this training time")
    parser.add_argument("--stop-after-epoch", type=int, default=None,
                        help="stop after this epoch but keep the learning-rate schedule of --epochs")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")


def run(args: argparse.Namespace) -> int:
    import torch

    from ..pipeline.metrics import corpus_cer, corpus_wer
    from ..pipeline.models.transducer.embedded import (EmbeddedTransducer, EmbeddedTransducerConfig,
                                                       save_embedded_transducer)
    from ..pipeline.training.transducer_train import adapter_hidden, greedy_texts, train
    from ..pipeline.training.ctc_features import cache_features, load_cached
    from ..pipeline.models.whisper.ctc_head import load_ctc_head

    torch.set_num_threads(args.threads)

    def log(msg: str) -> None:
        print(msg, flush=True)

    t_start = time.perf_counter()
    train_paths = [p for m in args.manifest for p in cache_features(m, args.cache, pack=True, with_ar=False, log=log)]
    eval_paths = [p for m in args.eval_manifest for p in cache_features(m, args.cache, with_ar=False, log=log)]
    head = load_ctc_head(args.ctc_head)
    train_rows = adapter_hidden(head, load_cached(train_paths))
    eval_rows = adapter_hidden(head, load_cached(eval_paths))
    features_min = (time.perf_counter() - t_start) / 60
    log(f"features: {len(train_rows)} training and {len(eval_rows)} held-out rows ({features_min:.1f} min)")

    torch.manual_seed(args.seed)
    model = EmbeddedTransducer(EmbeddedTransducerConfig(d_model=args.d_model, **({"durations": []} if args.rnnt else {})))
    t_train = time.perf_counter()
    curve = train(model, train_rows, eval_rows, epochs=args.epochs, lr=args.lr, seed=args.seed,
                  cell_budget=args.cell_budget, max_minutes=args.max_minutes,
                  stop_after_epoch=args.stop_after_epoch, log=log)
    train_min = (time.perf_counter() - t_train) / 60

    texts = greedy_texts(model, eval_rows) if eval_rows else []
    splits = {}
    for split in sorted({r["split"] for r in eval_rows}):
        idx = [i for i, r in enumerate(eval_rows) if r["split"] == split]
        refs, hyps = [eval_rows[i]["text"] for i in idx], [texts[i] for i in idx]
        splits[split] = {"utterances": len(idx), "greedy_cer": round(corpus_cer(refs, hyps), 4),
                         "greedy_wer": round(corpus_wer(refs, hyps), 4)}
    metrics = {
        "command": "shardscribe train-transducer " + " ".join(shlex.quote(a) for a in sys.argv[2:]),
        "threads": args.threads, "train_utterances": len(train_rows),
        "train_hours": round(sum(r["hidden"].shape[0] for r in train_rows) * 0.04 / 3600, 3),
        "feature_minutes": round(features_min, 2), "train_minutes": round(train_min, 2),
        "parameters": model.num_parameters(), "curve": curve, "eval": splits,
        "config": {"epochs": args.epochs, "lr": args.lr, "cell_budget": args.cell_budget, "seed": args.seed,
                   "ctc_head": args.ctc_head, "rnnt": args.rnnt},
        "examples": [{"split": r["split"], "ref": r["text"], "greedy": t}
                     for r, t in list(zip(eval_rows, texts))[:: max(1, len(eval_rows) // 12)]],
    }
    out = save_embedded_transducer(model, args.output, extra={"seed": args.seed, "epochs": args.epochs})
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    log(json.dumps({k: metrics[k] for k in ("train_utterances", "train_minutes", "eval")}, indent=1))
    return 0
