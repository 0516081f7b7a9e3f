"""`shardscribe bench transducer`: speed of ALSD++ ("Pushing the Limits of Beam Search
Decoding for Transducer-based ASR models", Table 2's full-model and decoder-only RTFx)
against batched greedy decoding, in one run on one machine.

Model: parakeet-tdt-0.6b's architecture (``ParakeetTDTConfig()``'s defaults: a 24-layer
FastConformer, a 2 x 640 LSTM predictor, 8192 tokens + blank, durations 0-4) with random
weights, so only speed is measured (no WER: a random model has none). Audio: the bundled
samples cut or tiled to ``--seconds``, ``--batch`` of them. Rows: the encoder once, then
greedy, ALSD++ at each beam, and ALSD++ run one utterance at a time (batch 1, the paper's
sequential baseline shape) and the per-utterance ALSD baseline
(pipeline.training.references.transducer_alsd) at the widest beam; then parakeet-rnnt's predictor and joint
(random) on the same frames: greedy, ALSD++ and AES++. RTFx = audio seconds / seconds;
"full" adds the encoder's time to each decoder's.

``--manifest FILE`` measures WER instead, on the embedded TDT transducer (or ``--model
DIR``, a train-transducer output) over the manifest's recordings: greedy, the per-utterance
ALSD and ALSD++ at each beam without an LM and, with ``--lm-text`` (a character 6-gram built here from those lines
or the ``text`` of JSONL rows, weight ``--alpha``), ALSD++ (and AES++ on an RNN-T) under
all four fusion strategies (early/late pruning x blank scored by the ASR alone / eq. 3),
every row on the same encoder frames. Choose ``--alpha`` on one manifest and report on another.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=None, help="clip length (default 5, --quick 2)")
    parser.add_argument("--beams", default="4,8")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--sequential", type=int, default=None,
                        help="utterances decoded one at a time (default: --batch, --quick 4)")
    parser.add_argument("--plot", help="PNG path (default: beside --out, else transducer.png)")
    parser.add_argument("--model", default="embedded", help="WER mode: the transducer (embedded, or a directory)")
    parser.add_argument("--lm-text", nargs="*", default=[], help="WER mode: LM text files (lines or JSONL 'text')")
    parser.add_argument("--alpha", type=float, default=0.3, help="WER mode: LM weight")
    parser.add_argument("--limit", type=int, default=0, help="WER mode: first N recordings only")
    parser.add_argument("--gamma", type=float, default=2.3,
                        help="AES++ rows with mAES's expansion beam gamma as well (NeMo's default 2.3); "
                             "negative: none")


def _clips(seconds: float, batch: int):
    import numpy as np

    from ...pipeline.audio import decode_audio
    from ...pipeline.models.transducer.adapter import SAMPLE_RATE

    root = Path(__file__).resolve().parents[1] / "pipeline" / "assets" / "samples"
    audio = [decode_audio(p.read_bytes())[0] for p in sorted(root.glob("*.flac"))]
    n = int(seconds * SAMPLE_RATE)
    return [np.resize(audio[i % len(audio)], n) for i in range(batch)]


def run(args) -> dict:
    if args.manifest:
        return run_wer(args)
    return run_speed(args)


def _lm(paths: list[str], workdir: Path):
    from .data import read_lm_text
    from ...pipeline.lm.build import build_lm
    from ...pipeline.lm.ngpu_lm import NGramLM

    lines = [s for path in paths for s in read_lm_text(path)]
    text = workdir / "lm.txt"
    text.write_text("\n".join(lines) + "\n")
    info = build_lm([str(text)], order=6, tokenizer="chars", output_dir=workdir / "char")
    return NGramLM.load(info["tensors"]), len(lines)


def run_wer(args) -> dict:
    import tempfile

    import torch

    from .data import flat_segments, join_by_recording, load_recordings
    from ...pipeline.decoding.transducer.greedy import transducer_greedy
    from ...pipeline.decoding.transducer.search import TransducerBeamSearch
    from ...pipeline.metrics import corpus_cer, corpus_wer
    from ...pipeline.models.transducer.embedded import load_embedded_transducer_adapter
    from ...pipeline.timing import timed

    torch.set_num_threads(args.threads)
    adapter = load_embedded_transducer_adapter(args.model)
    recordings, refs = load_recordings(args.manifest, limit=args.limit)
    flat, audio_s = flat_segments(recordings)
    order = sorted(range(len(flat)), key=lambda i: len(flat[i][1]))
    batches = [order[i:i + args.batch] for i in range(0, len(order), args.batch)]
    encoded, t_enc = [], 0.0
    for idx in batches:
        enc, secs = timed(adapter.encode, [flat[i][1] for i in idx])
        encoded.append((idx, enc.states, enc.valid_frames))
        t_enc += secs

    def decode(fn):
        texts, secs = [""] * len(flat), 0.0
        for idx, frames, lengths in encoded:
            out, s = timed(fn, frames, lengths)
            secs += s
            for j, i in enumerate(idx):
                texts[i] = adapter.decode_text(out.tokens[j]).strip()
        hyps = join_by_recording(flat, texts, len(recordings))
        return {"wer": corpus_wer(refs, hyps), "cer": corpus_cer(refs, hyps), "decoder_s": secs,
                "rtfx_decoder": audio_s / secs, "rtfx_full": audio_s / (t_enc + secs)}

    rows = [{"decoder": "greedy", "beam": 1, "lm": False, "strategy": None}
            | decode(lambda f, n: transducer_greedy(adapter, f, n))]
    beams = [int(b) for b in args.beams.split(",")]
    from types import SimpleNamespace

    from ...pipeline.training.references.transducer_alsd import per_utterance_alsd

    for k in beams:
        one_by_one = lambda f, n, k=k: SimpleNamespace(tokens=[per_utterance_alsd(adapter, f[i], int(n[i]), k)[0]
                                                               for i in range(len(n))])
        rows.append({"decoder": "per-utterance alsd", "beam": k, "lm": False, "strategy": None} | decode(one_by_one))
    algorithms = ("alsd", "aes") if adapter.durations is None else ("alsd",)   # AES++ is RNN-T only
    gamma = args.gamma if args.gamma >= 0 and "aes" in algorithms else None
    for algorithm in algorithms:
        for k in beams:
            search = TransducerBeamSearch(adapter, k, algorithm=algorithm)
            rows.append({"decoder": f"{algorithm}++", "beam": k, "lm": False, "strategy": None} | decode(search))
    if gamma is not None:
        for k in beams:
            search = TransducerBeamSearch(adapter, k, algorithm="aes", expansion_gamma=gamma)
            rows.append({"decoder": f"aes++ gamma {gamma:g}", "beam": k, "lm": False, "strategy": None}
                        | decode(search))
    lm_lines = 0
    if args.lm_text:
        with tempfile.TemporaryDirectory() as tmp:
            lm, lm_lines = _lm(args.lm_text, Path(tmp))
        for algorithm in algorithms:
            for k in beams:
                for pruning in ("early", "late"):
                    for blank in ("asr", "lm"):
                        search = TransducerBeamSearch(adapter, k, algorithm=algorithm, lm=lm, alpha_lm=args.alpha,
                                                      blank_scoring=blank, pruning=pruning)
                        rows.append({"decoder": f"{algorithm}++", "beam": k, "lm": True,
                                     "strategy": f"{pruning}/{blank}"} | decode(search))
        if gamma is not None:
            for k in beams:
                search = TransducerBeamSearch(adapter, k, algorithm="aes", lm=lm, alpha_lm=args.alpha,
                                              expansion_gamma=gamma)
                rows.append({"decoder": f"aes++ gamma {gamma:g}", "beam": k, "lm": True, "strategy": "late/lm"}
                            | decode(search))
    greedy_wer = rows[0]["wer"]
    fused = sorted((r for r in rows if r["lm"] and r["beam"] == 4 and r["decoder"] == "alsd++"),
                   key=lambda r: r["wer"])
    summary = {"recordings": len(recordings), "segments": len(flat), "audio_seconds": audio_s,
               "model": args.model, "alpha": args.alpha, "lm_text_lines": lm_lines, "encoder_s": t_enc,
               "greedy_wer": greedy_wer,
               "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    by = {(r["beam"], r["lm"], r["strategy"]): r for r in rows if r["decoder"] == "alsd++"}
    if (4, False, None) in by:
        summary["beam4_wer_rel_reduction_no_lm"] = 1 - by[(4, False, None)]["wer"] / greedy_wer if greedy_wer else None
    if fused:
        summary["best_strategy_beam4"] = fused[0]["strategy"]
        summary["beam4_lm_wer_rel_reduction"] = 1 - fused[0]["wer"] / greedy_wer if greedy_wer else None
        summary["best_strategy_margin_wer"] = fused[1]["wer"] - fused[0]["wer"] if len(fused) > 1 else None
    return {"rows": rows, "summary": summary}


def run_speed(args) -> dict:
    import torch
    from transformers import ParakeetFeatureExtractor, ParakeetForTDT, ParakeetTDTConfig

    from ...pipeline.decoding.transducer.greedy import transducer_greedy
    from ...pipeline.decoding.transducer.search import TransducerBeamSearch
    from ...pipeline.models.transducer.adapter import TransducerAdapter
    from ...pipeline.timing import timed

    torch.set_num_threads(args.threads)
    seconds = args.seconds or (2.0 if args.quick else 5.0)
    sequential = args.sequential or (4 if args.quick else args.batch)
    beams = [int(b) for b in args.beams.split(",")]
    torch.manual_seed(0)
    model = ParakeetForTDT(ParakeetTDTConfig()).eval()
    adapter = TransducerAdapter(model, ParakeetFeatureExtractor(feature_size=model.config.encoder_config.num_mel_bins),
                                None)
    clips = _clips(seconds, args.batch)
    audio_s = seconds * len(clips)
    adapter.encode(clips[:2])                        # warm-up
    enc, t_enc = timed(adapter.encode, clips)
    frames, lengths = enc.states, enc.valid_frames

    def best(fn, reps=2):
        fn()
        return min(timed(fn)[1] for _ in range(reps))

    rows = []

    def row(name, beam, dec_s, n_audio_s, enc_s):
        rows.append({"decoder": name, "beam": beam,
                     "batch": 1 if name in ("alsd++ sequential", "per-utterance alsd") else args.batch,
                     "decoder_s": dec_s, "rtfx_decoder": n_audio_s / dec_s, "rtfx_full": n_audio_s / (enc_s + dec_s)})

    rows.append({"decoder": "encoder", "beam": None, "batch": args.batch, "decoder_s": None, "rtfx_decoder": None,
                 "rtfx_full": audio_s / t_enc})
    greedy = transducer_greedy(adapter, frames, lengths)
    row("greedy", 1, best(lambda: transducer_greedy(adapter, frames, lengths)), audio_s, t_enc)
    for k in beams:
        search = TransducerBeamSearch(adapter, k)
        row("alsd++", k, best(lambda: search(frames, lengths)), audio_s, t_enc)
    # RNN-T rows: parakeet-rnnt's predictor and joint (ParakeetRNNTConfig's defaults, the
    # TDT's sizes without durations) on the same frames; its encoder is not timed again.
    from transformers import ParakeetForRNNT, ParakeetRNNTConfig

    rnnt_cfg = ParakeetRNNTConfig(encoder_config={"num_hidden_layers": 1})
    rnnt = TransducerAdapter(ParakeetForRNNT(rnnt_cfg).eval(), adapter.feature_extractor, None)
    # A random joint emits max_symbols tokens per frame; raise its blank logit until greedy
    # emits no more tokens per clip than the random TDT, so both search the same load.
    per_clip = sum(map(len, greedy.tokens)) / len(clips)
    bias = rnnt.model.joint.head.bias
    with torch.no_grad():
        for _ in range(40):
            tokens = transducer_greedy(rnnt, frames[:4], lengths[:4]).tokens
            if sum(map(len, tokens)) / 4 <= per_clip:
                break
            bias[rnnt.blank] += 0.5
    row("rnnt greedy", 1, best(lambda: transducer_greedy(rnnt, frames, lengths)), audio_s, t_enc)
    for k in beams:
        for algorithm in ("alsd", "aes"):
            search = TransducerBeamSearch(rnnt, k, algorithm=algorithm)
            row(f"rnnt {algorithm}++", k, best(lambda: search(frames, lengths)), audio_s, t_enc)
        if args.gamma >= 0:
            search = TransducerBeamSearch(rnnt, k, algorithm="aes", expansion_gamma=args.gamma)
            row(f"rnnt aes++ gamma {args.gamma:g}", k, best(lambda: search(frames, lengths)), audio_s, t_enc)
    wide = TransducerBeamSearch(adapter, max(beams))
    part = [(frames[i:i + 1, :int(lengths[i])], lengths[i:i + 1]) for i in range(sequential)]
    seq_s = best(lambda: [wide(f, n) for f, n in part], reps=1)
    batched_part = best(lambda: wide(frames[:sequential], lengths[:sequential]), reps=1)
    row("alsd++ sequential", max(beams), seq_s, seconds * sequential, t_enc * sequential / len(clips))
    from ...pipeline.training.references.transducer_alsd import per_utterance_alsd

    base_s = best(lambda: [per_utterance_alsd(adapter, frames[i], int(lengths[i]), max(beams))
                           for i in range(sequential)], reps=1)
    row("per-utterance alsd", max(beams), base_s, seconds * sequential, t_enc * sequential / len(clips))
    by = {(r["decoder"], r["beam"]): r for r in rows}
    summary = {
        "audio_seconds": audio_s, "tokens_per_utt_greedy": sum(map(len, greedy.tokens)) / len(clips),
        "threads": args.threads,
        "full_rtfx_beam4_over_greedy": by[("alsd++", 4)]["rtfx_full"] / by[("greedy", 1)]["rtfx_full"]
        if ("alsd++", 4) in by else None,
        "decoder_rtfx_beam4_over_greedy": by[("alsd++", 4)]["rtfx_decoder"] / by[("greedy", 1)]["rtfx_decoder"]
        if ("alsd++", 4) in by else None,
        f"batched_over_sequential_beam{max(beams)}": seq_s / batched_part,
        f"alsd++_over_per_utterance_alsd_beam{max(beams)}": base_s / batched_part,
        "rnnt_full_rtfx_aes4_over_greedy": by[("rnnt aes++", 4)]["rtfx_full"] / by[("rnnt greedy", 1)]["rtfx_full"]
        if ("rnnt aes++", 4) in by else None,
        "rnnt_full_rtfx_alsd4_over_greedy": by[("rnnt alsd++", 4)]["rtfx_full"] / by[("rnnt greedy", 1)]["rtfx_full"]
        if ("rnnt alsd++", 4) in by else None,
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    _plot(rows, args)
    return {"rows": rows, "summary": summary}


def _plot(rows, args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from .data import save_figure

    path = args.plot or (str(Path(args.out).with_suffix(".png")) if getattr(args, "out", None) else "transducer.png")
    shown = [r for r in rows if r["decoder"] != "encoder"]
    names = [f'{r["decoder"]} b{r["beam"]}' for r in shown]
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.5))
    ax[0].bar(names, [r["rtfx_full"] for r in shown])
    ax[0].set_ylabel("full-model RTFx")
    ax[1].bar(names, [r["rtfx_decoder"] for r in shown])
    ax[1].set_ylabel("decoder-only RTFx")
    for a in ax:
        a.tick_params(axis="x", labelrotation=30, labelsize=7)
    fig.suptitle("ALSD++ vs greedy, parakeet-tdt-0.6b architecture (random weights), CPU")
    save_figure(fig, path, dpi=110)
