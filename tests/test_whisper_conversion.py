"""The CTranslate2 -> transformers conversion, checked against the ctranslate2 runtime."""
from __future__ import annotations

from pathlib import Path

import ctranslate2

from shardscribe.pipeline.decoding.ar.greedy import greedy_decode
from shardscribe.pipeline.models.whisper.loader import embedded_ct2_dir


def test_greedy_tokens_match_ctranslate2(whisper_adapter, sample_audio):
    ids = sorted(sample_audio)
    audios = [sample_audio[i] for i in ids]
    feats = whisper_adapter.features(audios).numpy()
    runtime = ctranslate2.models.Whisper(str(embedded_ct2_dir()), device="cpu", compute_type="float32",
                                         intra_threads=1)
    ref = runtime.generate(ctranslate2.StorageView.from_array(feats),
                           [whisper_adapter.prompt_ids] * len(ids), beam_size=1, max_length=448)
    ours = greedy_decode(whisper_adapter, whisper_adapter.encode(audios).states)
    for i, r, o in zip(ids, ref, ours):
        assert o == r.sequences_ids[0], (i, whisper_adapter.text(o), whisper_adapter.text(r.sequences_ids[0]))
    # Not vacuous: real words came out.
    assert sum(len(o) for o in ours) > 40


def test_forced_prefix_continues_like_full_decode(whisper_adapter, sample_audio):
    audios = list(sample_audio.values())[:4]
    enc = whisper_adapter.encode(audios).states
    full = greedy_decode(whisper_adapter, enc)
    cut = [1, 3, 0, 5]
    resumed = greedy_decode(whisper_adapter, enc, prefixes=[f[:c] for f, c in zip(full, cut)])
    assert [f[c:] for f, c in zip(full, cut)] == resumed


def test_batched_equals_single(whisper_adapter, sample_audio):
    audios = list(sample_audio.values())
    enc = whisper_adapter.encode(audios).states
    batched = greedy_decode(whisper_adapter, enc)
    single = [greedy_decode(whisper_adapter, enc[i:i + 1])[0] for i in range(len(audios))]
    assert batched == single


def test_converted_checkpoint_is_cached(model_cache, whisper_adapter):
    from shardscribe.pipeline.models.whisper.loader import resolve_checkpoint

    path = resolve_checkpoint("embedded", model_cache)
    assert path.startswith(str(model_cache))
    assert (Path(path) / "model.safetensors").exists()
