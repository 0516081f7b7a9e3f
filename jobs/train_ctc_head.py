"""Train the character CTC draft head on the frozen Whisper tiny.en encoder.

    shardscribe train-ctc-head --manifest TRAIN.jsonl [...] --eval-manifest HELD.jsonl [...]
                               --output DIR [--cache DIR] [--epochs N] [--seed S]

Encoder states are computed once and cached under --cache (valid frames only, fp16;
training rows packed into 30-s windows unless --no-pack, held-out rows encoded alone with
Whisper's greedy AR text alongside). The head trains on the cached states (deterministic
given --seed on one CPU thread), logs its loss curve, and DIR receives head.safetensors,
config.json, metrics.json (curve, CER/WER per held-out split for CTC and AR, calibration
table) and MODEL_CARD.md. Uses CUDA when present.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import time

COMMAND = "train-ctc-head"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--manifest", nargs="+", required=True, help="training manifests (JSONL)")
    parser.add_argument("--eval-manifest", nargs="*", default=[],
                        help="held-out manifests (rows carry split=heldout_voice/heldout_text)")
    parser.add_argument("--single-manifest", nargs="*", default=[],
                        help="more training manifests, encoded one utterance per window as at "
                             "inference (slow; complements the packed --manifest rows)")
    parser.add_argument("--output", required=True, help="directory for the head files")
    parser.add_argument("--cache", default=".cache/ctc_features", help="encoder-state cache")
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--frame-budget", type=int, default=12000,
                        help="padded frames per training batch")
    parser.add_argument("--adapter-layers", type=int, default=2)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--frame-stack", type=int, default=2,
                        help="encoder frames per GRU step (2 halves CPU time; CTC stays 50/s)")
    parser.add_argument("--time-masks", type=int, default=2, help="masked spans per utterance")
    parser.add_argument("--max-train", type=int, default=None,
                        help="use only the first N training rows (smaller reproduction runs)")
    parser.add_argument("--no-pack", action="store_true",
                        help="encode training rows one per window (5x slower, like inference)")
    parser.add_argument("--max-minutes", type=float, default=None,
                        help="stop after the epoch that passes this training time")
    parser.add_argument("--stop-after-epoch", type=int, default=None,
                        help="stop after this epoch but keep the learning-rate schedule of "
                             "--epochs (reproduces the first epochs of a full run exactly)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--device", default=None, help="cpu/cuda (default: cuda if present)")


def run(args: argparse.Namespace) -> int:
    import torch

    from ..pipeline.training.ctc_features import cache_features, load_cached, read_manifest
    from ..pipeline.models.whisper.ctc_head import CTCHead, CTCHeadConfig, save_ctc_head
    from ..pipeline.training.ctc_head_card import model_card
    from ..pipeline.training.ctc_head_train import (calibration_table, evaluate, greedy_drafts,
                                                    train_head)

    torch.set_num_threads(args.threads)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")

    def log(msg: str) -> None:
        print(msg, flush=True)

    t_start = time.perf_counter()
    train_paths, remaining = [], args.max_train
    for m in args.manifest:
        if remaining is not None and remaining <= 0:
            break
        train_paths += cache_features(m, args.cache, device=device, pack=not args.no_pack,
                                      limit=remaining, log=log)
        if remaining is not None:
            remaining -= len(read_manifest(m)[:remaining])
    for m in args.single_manifest:
        train_paths += cache_features(m, args.cache, device=device, with_ar=False, log=log)
    eval_paths = []
    for m in args.eval_manifest:
        eval_paths += cache_features(m, args.cache, device=device, log=log)
    features_min = (time.perf_counter() - t_start) / 60
    train_rows = load_cached(train_paths)
    eval_rows = load_cached(eval_paths)
    log(f"features: {len(train_rows)} training and {len(eval_rows)} held-out rows "
        f"({features_min:.1f} min including encoding)")

    torch.manual_seed(args.seed)  # the initial weights are part of "deterministic given --seed"
    head = CTCHead(CTCHeadConfig(adapter_layers=args.adapter_layers, dropout=args.dropout,
                                 frame_stack=args.frame_stack)).to(device)
    t_train = time.perf_counter()
    curve = train_head(head, train_rows, eval_rows, epochs=args.epochs, lr=args.lr,
                       seed=args.seed, frame_budget=args.frame_budget, device=device,
                       time_masks=args.time_masks, max_minutes=args.max_minutes,
                       stop_after_epoch=args.stop_after_epoch, log=log)
    train_min = (time.perf_counter() - t_train) / 60

    texts, max_ent = greedy_drafts(head, eval_rows, device) if eval_rows else ([], [])
    metrics = {
        "command": "shardscribe train-ctc-head " + " ".join(shlex.quote(a) for a in sys.argv[2:]),
        "device": device, "threads": args.threads,
        "train_utterances": len(train_rows),
        "train_distinct_utterances": len({r["id"] for r in train_rows}),
        "train_hours": round(sum(r["states"].shape[0] for r in train_rows) * 0.02 / 3600, 3),
        "feature_minutes": round(features_min, 2), "train_minutes": round(train_min, 2),
        "parameters": head.num_parameters(), "curve": curve,
        "config": {"adapter_layers": args.adapter_layers, "frame_stack": args.frame_stack,
                   "dropout": args.dropout, "epochs": args.epochs, "lr": args.lr,
                   "frame_budget": args.frame_budget, "time_masks": args.time_masks,
                   "pack": not args.no_pack},
        "eval": evaluate(eval_rows, texts, max_ent) if eval_rows else {},
        # τ_CTC is read off the synthetic held-out splits (real clips are too few).
        "calibration": calibration_table(*zip(*calib)) if (calib := [
            (r, t, e) for r, t, e in zip(eval_rows, texts, max_ent)
            if r["split"].startswith("heldout")]) else [],
        "examples": [{"split": r["split"], "ref": r["text"], "ctc": t, "ar": r.get("ar_text"),
                      "max_entropy": round(e, 3)}
                     for r, t, e in list(zip(eval_rows, texts, max_ent))[:: max(1, len(eval_rows) // 12)]],
    }
    out = save_ctc_head(head, args.output, extra={"seed": args.seed, "epochs": args.epochs})
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    with open(out / "eval_drafts.jsonl", "w") as fh:
        for r, t, e in zip(eval_rows, texts, max_ent):
            fh.write(json.dumps({"id": r["id"], "split": r["split"], "voice": r["voice"],
                                 "text": r["text"], "ctc_text": t, "ar_text": r.get("ar_text"),
                                 "max_entropy": round(e, 4)}) + "\n")
    (out / "MODEL_CARD.md").write_text(model_card(metrics, args.manifest + args.single_manifest
                                                         + args.eval_manifest))
    log(json.dumps({k: metrics[k] for k in ("train_utterances", "train_minutes", "eval")}, indent=1))
    for row in metrics["calibration"]:
        log("calibration: " + json.dumps(row))
    return 0
