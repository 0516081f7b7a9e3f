"""The bfloat16-screened argmax (pipeline.decoding.screened_argmax) against the float32
product's argmax: on near-ties that bfloat16 alone gets wrong, with suppressed tokens,
and inside greedy decoding of the embedded Whisper on every bundled sample, where the
tokens must equal those of the full float32 logits."""
from __future__ import annotations

import pytest
import torch

from pipeline.decoding.screened_argmax import ScreenedArgmax


def _near_ties(V=2048, D=384, N=128, seed=0):
    """Weights where each hidden row's best token has a twin a hair below it in float32
    (ids: best V/2 + n, twin n), picked among random twins so that the bfloat16 product
    puts the twin strictly above the best where it can: there the screen's radius is
    what keeps the best one in."""
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(V, D, generator=g) * 0.05
    hidden = torch.randn(N, D, generator=g)
    for n in range(N):
        h = hidden[n]
        u = h / h.norm()
        best = u * 0.6
        for _ in range(200):
            nudge = torch.randn(D, generator=g) * 5e-2
            twin = best + nudge - (nudge @ u) * u - 1e-5 * u     # same logit but for -1e-5 |h|
            rough = torch.nn.functional.linear(h.bfloat16()[None], torch.stack([best, twin]).bfloat16())[0]
            if rough[1] > rough[0]:
                break
        weight[V // 2 + n], weight[n] = best, twin
    return weight, hidden


def test_screened_argmax_equals_the_float32_argmax_where_bfloat16_alone_does_not():
    weight, hidden = _near_ties()
    exact = torch.nn.functional.linear(hidden, weight).argmax(-1)
    rough = torch.nn.functional.linear(hidden.bfloat16(), weight.bfloat16()).float().argmax(-1)
    assert (rough != exact).sum() >= 10            # the inputs break a bfloat16-only choice
    # (a radius 16x too small, 2^-9, fails here: checked by hand)
    none = torch.zeros(weight.shape[0], dtype=torch.bool)
    assert torch.equal(ScreenedArgmax(weight, none)(hidden), exact)


def test_suppressed_tokens_are_never_chosen():
    weight, hidden = _near_ties(seed=1)
    logits = torch.nn.functional.linear(hidden, weight)
    suppress = torch.zeros(weight.shape[0], dtype=torch.bool)
    suppress[logits.argmax(-1)[:64]] = True         # the winners of 64 rows are off limits
    expected = logits.masked_fill(suppress, float("-inf")).argmax(-1)
    got = ScreenedArgmax(weight, suppress)(hidden)
    assert torch.equal(got, expected) and not suppress[got].any()


def test_float32_weights_only():
    with pytest.raises(ValueError, match="float32"):
        ScreenedArgmax(torch.zeros(4, 4, dtype=torch.bfloat16), torch.zeros(4, dtype=torch.bool))


def test_greedy_decoding_with_the_screen_equals_the_full_logits(whisper_adapter, sample_audio):
    from pipeline.decoding.ar_greedy import greedy_decode

    adapter = whisper_adapter
    screen = ScreenedArgmax(adapter.model.proj_out.weight, adapter.suppress_mask)
    calls = []

    def counted(hidden):
        calls.append(hidden.shape[0])
        return screen(hidden)

    states = adapter.encode(list(sample_audio.values())).states
    saved = adapter.next_tokens
    try:
        adapter.next_tokens = None
        full = greedy_decode(adapter, states)
        adapter.next_tokens = counted
        screened = greedy_decode(adapter, states)
    finally:
        adapter.next_tokens = saved
    assert screened == full and sum(len(t) for t in full) > 50
    assert len(calls) > 10       # the plain steps went through the screen


def test_the_screen_is_built_on_first_use_and_switched_off_by_config(monkeypatch, model_cache):
    from pipeline import device
    from pipeline.models.whisper.adapter import load_whisper_adapter

    monkeypatch.setattr(device, "cpu_bf16_native", lambda: True)
    on = load_whisper_adapter("embedded", cache_dir=model_cache)
    assert on._next_tokens is not None and not isinstance(on._next_tokens, ScreenedArgmax)   # not yet built
    assert isinstance(on.next_tokens, ScreenedArgmax)
    assert on.next_tokens.weight.data_ptr() == on.model.proj_out.weight.data_ptr()       # no float32 copy
    assert load_whisper_adapter("embedded", cache_dir=model_cache, screened_argmax=False).next_tokens is None
    monkeypatch.setattr(device, "cpu_bf16_native", lambda: False)
    assert load_whisper_adapter("embedded", cache_dir=model_cache).next_tokens is None     # emulated bf16: no
