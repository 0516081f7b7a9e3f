"""`shardscribe bench transducer`: speed of ALSD++ ("Pushing the Limits of Beam Search
Decoding for Transducer-based ASR models", Table 2's full-model and decoder-only RTFx)
against batched greedy decoding, in one run on one machine.

Model: parakeet-tdt-0.6b's architecture (``ParakeetTDTConfig()``'s defaults: a 24-layer
FastConformer, a 2 x 640 LSTM predictor, 8192 tokens + blank, durations 0-4) with random
weights, so only speed is measured (no WER: a random model has none). Audio: the bundled
samples cut or tiled to ``--seconds``, ``--batch`` of them. Rows: the encoder once, then
greedy, ALSD++ at each beam, and ALSD++ run one utterance at a time (batch 1, the paper's
sequential baseline shape) at the widest beam. RTFx = audio seconds / seconds;
"full" adds the encoder's time to each decoder's.
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


def _clips(seconds: float, batch: int):
    import numpy as np

    from pipeline.audio import decode_audio
    from pipeline.models.transducer.adapter import SAMPLE_RATE

    root = Path(__file__).resolve().parents[1] / "pipeline" / "assets" / "samples"
    audio = [decode_audio(p.read_bytes())[0] for p in sorted(root.glob("*.flac"))]
    n = int(seconds * SAMPLE_RATE)
    return [np.resize(audio[i % len(audio)], n) for i in range(batch)]


def run(args) -> dict:
    import torch
    from transformers import ParakeetFeatureExtractor, ParakeetForTDT, ParakeetTDTConfig

    from pipeline.decoding.transducer.greedy import transducer_greedy
    from pipeline.decoding.transducer.search import TransducerBeamSearch
    from pipeline.models.transducer.adapter import TransducerAdapter
    from pipeline.timing import timed

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
        rows.append({"decoder": name, "beam": beam, "batch": args.batch if name != "alsd++ sequential" else 1,
                     "decoder_s": dec_s, "rtfx_decoder": n_audio_s / dec_s, "rtfx_full": n_audio_s / (enc_s + dec_s)})

    rows.append({"decoder": "encoder", "beam": None, "batch": args.batch, "decoder_s": None, "rtfx_decoder": None,
                 "rtfx_full": audio_s / t_enc})
    greedy = transducer_greedy(adapter, frames, lengths)
    row("greedy", 1, best(lambda: transducer_greedy(adapter, frames, lengths)), audio_s, t_enc)
    for k in beams:
        search = TransducerBeamSearch(adapter, k)
        row("alsd++", k, best(lambda: search(frames, lengths)), audio_s, t_enc)
    wide = TransducerBeamSearch(adapter, max(beams))
    part = [(frames[i:i + 1, :int(lengths[i])], lengths[i:i + 1]) for i in range(sequential)]
    seq_s = best(lambda: [wide(f, n) for f, n in part], reps=1)
    batched_part = best(lambda: wide(frames[:sequential], lengths[:sequential]), reps=1)
    row("alsd++ sequential", max(beams), seq_s, seconds * sequential, t_enc * sequential / len(clips))
    by = {(r["decoder"], r["beam"]): r for r in rows}
    summary = {
        "audio_seconds": audio_s, "tokens_per_utt_greedy": sum(map(len, greedy.tokens)) / len(clips),
        "threads": args.threads,
        "full_rtfx_beam4_over_greedy": by[("alsd++", 4)]["rtfx_full"] / by[("greedy", 1)]["rtfx_full"]
        if ("alsd++", 4) in by else None,
        "decoder_rtfx_beam4_over_greedy": by[("alsd++", 4)]["rtfx_decoder"] / by[("greedy", 1)]["rtfx_decoder"]
        if ("alsd++", 4) in by else None,
        f"batched_over_sequential_beam{max(beams)}": seq_s / batched_part,
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    _plot(rows, args)
    return {"rows": rows, "summary": summary}


def _plot(rows, args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from jobs.benchmark_data import save_figure

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
