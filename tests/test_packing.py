"""Window packing for CTC-only decoders: placement rules, packed signals, and the packed
encoder states against the unpacked encoder on real audio."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from shardscribe.pipeline.config import ConfigError, load_config
from shardscribe.pipeline.metrics import corpus_cer
from shardscribe.pipeline.packing import pack_signals, plan_windows


@pytest.mark.parametrize("seed", range(5))
def test_placements_fit_keep_order_gaps_and_grid(seed):
    rng = np.random.default_rng(seed)
    window, gap, grid = 1000, 35, 16
    lengths = rng.integers(1, window + 1, size=40).tolist()
    plan = plan_windows(lengths, window, gap, grid)
    assert [p.length for p in plan] == lengths
    for p in plan:
        assert p.start % grid == 0 and p.start + p.length <= window
    for a, b in zip(plan, plan[1:]):
        assert b.window in (a.window, a.window + 1)  # input order, windows filled in turn
        if b.window == a.window:
            assert b.start >= a.start + a.length + gap
        else:
            # A new window opens only when the clip did not fit after the gap.
            gap_end = -(-(a.start + a.length) // grid) * grid + (-(-gap // grid) * grid)
            assert gap_end + b.length > window and b.start == 0


def test_oversized_clip_is_refused():
    with pytest.raises(ValueError, match="exceeds"):
        plan_windows([10, 2000], 1000, 10, 10)


def test_packed_signals_hold_each_clip_at_its_place_scaled_to_the_window_level():
    rng = np.random.default_rng(0)
    audios = [rng.uniform(-a, a, n).astype(np.float32) for a, n in ((0.5, 300), (0.1, 200), (0.9, 600))]
    plan = plan_windows([len(a) for a in audios], 1000, 50, 10)
    signals = pack_signals(audios, plan, 1000)
    assert len(signals) == 2 and [p.window for p in plan] == [0, 0, 1]
    for a, p in zip(audios, plan):
        level = np.abs(audios[0 if p.window == 0 else 2]).max()
        got = signals[p.window][p.start:p.start + p.length]
        np.testing.assert_allclose(got, a * level / np.abs(a).max(), rtol=1e-6)
    # Everything outside the clips is silence.
    mask = np.zeros(1000, bool)
    for p in plan[:2]:
        mask[p.start:p.start + p.length] = True
    assert not signals[0][~mask].any()


@pytest.fixture(scope="module")
def head_adapter(model_cache):
    from shardscribe.pipeline.models.whisper.adapter import load_whisper_adapter

    torch.set_num_threads(1)
    return load_whisper_adapter("embedded", cache_dir=model_cache, ctc_head="embedded")


def test_a_clip_alone_in_its_window_gets_the_unpacked_states(head_adapter, sample_audio):
    clip = next(iter(sample_audio.values()))
    alone = head_adapter.encode([clip])
    packed = head_adapter.encode_packed([clip], keep_windows=True)
    n = int(alone.valid_frames[0])
    assert packed.valid_frames.tolist() == [n]
    torch.testing.assert_close(packed.states[0, :n], alone.states[0, :n])


def test_packed_ctc_drafts_match_the_unpacked_ones_on_real_audio(head_adapter, sample_audio, sample_manifest):
    audios = [sample_audio[m["id"]] for m in sample_manifest]
    refs = [m["text"] for m in sample_manifest]
    packed = head_adapter.encode_packed(audios, keep_windows=True)
    # Short clips really share windows, and every clip keeps its own frame count.
    windows = {p.window for p in head_adapter.plan_packing([len(a) for a in audios])}
    assert len(windows) < len(audios)
    assert packed.valid_frames.tolist() == head_adapter.encode(audios).valid_frames.tolist()
    alone = head_adapter.ctc_draft(head_adapter.encode(audios)).texts
    together = head_adapter.ctc_draft(packed).texts
    # Whisper's encoder attends across the whole window, so the states differ a little;
    # the head was trained on packed windows and must read them as well as clips alone.
    assert corpus_cer(refs, together) <= corpus_cer(refs, alone) + 0.02
    assert corpus_cer(alone, together) < 0.1


def test_isolated_packing_makes_a_clips_states_its_own(head_adapter, sample_audio, sample_manifest):
    """decoder.pack_windows: several clips share one encoder pass, yet a clip's states are
    the same beside other neighbours, in another place of the sequence; the shared-window
    layout of the same clips changes them (the reference that this would catch). Its
    accuracy: docs/ctc_greedy.md."""
    from shardscribe.pipeline.packing import plan_sequences

    audios = [sample_audio[m["id"]] for m in sample_manifest][:4]
    clip, others = audios[0], audios[1:]
    lengths = [head_adapter.valid_frames(len(a)) for a in audios]
    assert len({s for s, _ in plan_sequences(lengths, 1500)}) == 1   # one shared pass
    first = head_adapter.encode_packed([clip] + others)
    last = head_adapter.encode_packed(others[::-1] + [clip])
    n = lengths[0]
    assert first.valid_frames[0] == last.valid_frames[-1] == n
    torch.testing.assert_close(last.states[-1, :n], first.states[0, :n], atol=1e-4, rtol=1e-4)
    shared_first = head_adapter.encode_packed([clip] + others, keep_windows=True).states[0, :n]
    shared_last = head_adapter.encode_packed(others[::-1] + [clip], keep_windows=True).states[-1, :n]
    assert (shared_first - shared_last).abs().max() > 1e-2


def test_packing_is_refused_for_decoders_that_read_the_whole_window():
    # No shipped config packs (for accuracy: docs/ctc_greedy.md); it is a switch away.
    assert load_config("ctc_greedy").decoder.pack_windows is False
    assert load_config("ctc_greedy", ["decoder.pack_windows=true"]).decoder.pack_windows is True
    for kind in ("ar", "ssd"):
        with pytest.raises(ConfigError, match="decoder.pack_windows"):
            load_config(kind, ["decoder.pack_windows=true"])


@pytest.mark.parametrize("micro", [1, 3])
def test_encoder_micro_batches_give_the_whole_batch_states(head_adapter, sample_audio, sample_manifest, micro):
    """model.encoder_micro_batch changes only how many segments one encoder call takes."""
    audios = [sample_audio[m["id"]] for m in sample_manifest]
    saved = head_adapter.encoder_micro_batch
    try:
        head_adapter.encoder_micro_batch = 0
        whole, whole_packed = head_adapter.encode(audios), head_adapter.encode_packed(audios[:4] * 3, keep_windows=True)
        head_adapter.encoder_micro_batch = micro
        sliced, sliced_packed = head_adapter.encode(audios), head_adapter.encode_packed(audios[:4] * 3, keep_windows=True)
    finally:
        head_adapter.encoder_micro_batch = saved
    assert torch.allclose(sliced.states, whole.states, atol=1e-4)
    assert sliced.valid_frames.tolist() == whole.valid_frames.tolist()
    assert torch.allclose(sliced_packed.states, whole_packed.states, atol=1e-4)


def test_encoder_micro_batch_defaults_to_two_on_cpu_and_is_validated(model_cache):
    from shardscribe.pipeline.models import load_model
    from shardscribe.pipeline.models.whisper import CPU_ENCODER_MICRO_BATCH

    assert load_config("ctc_greedy").model.encoder_micro_batch is None
    adapter = load_model(load_config("ctc_greedy", ["model.device=cpu", f"model.cache_dir={model_cache}"]).model)
    assert adapter.encoder_micro_batch == CPU_ENCODER_MICRO_BATCH == 2
    with pytest.raises(ConfigError, match=r"model\.encoder_micro_batch"):
        load_config("ctc_greedy", ["model.encoder_micro_batch=-1"])
