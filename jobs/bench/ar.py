"""AR baseline benchmark: our batched greedy Whisper against the ctranslate2 runtime
(faster-whisper's engine) on the same audio, in one process.

Both see the same 16-kHz segments and the same log-mel features; each is timed from audio
to text (feature extraction included) with its model already loaded. Rows: RTFx, WER and
the share of our time spent in the encoder's fixed 30-s window.
"""
from __future__ import annotations

from .data import flat_segments, join_by_recording, load_recordings
from ...pipeline.timing import timed


def add_arguments(parser) -> None:
    parser.add_argument("--batch", type=int, default=8, help="segments per model call")
    parser.add_argument("--threads", type=int, default=0, help="torch/ct2 threads (0: default)")


def run(args) -> dict:
    import ctranslate2
    import torch

    from ...pipeline.decoding.ar.greedy import greedy_decode
    from ...pipeline.metrics import corpus_wer
    from ...pipeline.models.whisper.adapter import load_whisper_adapter
    from ...pipeline.models.whisper.loader import embedded_ct2_dir

    if args.threads:
        torch.set_num_threads(args.threads)
    recordings, refs = load_recordings(args.manifest, 24 if args.quick else 0)
    flat, audio_s = flat_segments(recordings)
    adapter = load_whisper_adapter("embedded", device="cpu")
    runtime = ctranslate2.models.Whisper(str(embedded_ct2_dir()), device="cpu", compute_type="float32",
                                         intra_threads=args.threads or 0)
    # Warm both once so neither pays first-call costs inside the timing.
    warm = [flat[0][1]]
    greedy_decode(adapter, adapter.encode(warm).states)
    runtime.generate(ctranslate2.StorageView.from_array(adapter.features(warm).numpy()),
                     [adapter.prompt_ids], beam_size=1)

    batches = [[a for _, a in flat[i:i + args.batch]] for i in range(0, len(flat), args.batch)]

    def run_ours():
        texts, enc_time = [], 0.0
        for batch in batches:
            enc, secs = timed(adapter.encode, batch, device=adapter.device)
            enc_time += secs
            texts += [adapter.text(t) for t in greedy_decode(adapter, enc.states)]
        return texts, enc_time

    def run_ct2():
        texts = []
        for batch in batches:
            feats = ctranslate2.StorageView.from_array(adapter.features(batch).numpy())
            res = runtime.generate(feats, [adapter.prompt_ids] * len(batch), beam_size=1)
            texts += [adapter.text(r.sequences_ids[0]) for r in res]
        return texts

    (ours, enc_time), ours_s = timed(run_ours, device=adapter.device)
    ct2_texts, ct2_s = timed(run_ct2)

    ours_rec = join_by_recording(flat, ours, len(recordings))
    ct2_rec = join_by_recording(flat, ct2_texts, len(recordings))
    rows = [
        {"decoder": "shardscribe AR (torch)", "segments": len(flat), "audio_s": audio_s, "wall_s": ours_s,
         "rtfx": audio_s / ours_s, "wer": corpus_wer(refs, ours_rec), "encoder_share": enc_time / ours_s},
        {"decoder": "ctranslate2 runtime", "segments": len(flat), "audio_s": audio_s, "wall_s": ct2_s,
         "rtfx": audio_s / ct2_s, "wer": corpus_wer(refs, ct2_rec), "encoder_share": None},
    ]
    return {"rows": rows, "summary": {
        "ar_rtfx": rows[0]["rtfx"], "ct2_rtfx": rows[1]["rtfx"], "ar_wer": rows[0]["wer"],
        "ct2_wer": rows[1]["wer"], "speed_vs_ct2": ct2_s / ours_s, "encoder_share": enc_time / ours_s,
        "identical_texts": sum(a == b for a, b in zip(ours, ct2_texts)) / len(flat)}}
