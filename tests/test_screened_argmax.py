"""The screened argmax (pipeline.models.screened_argmax), bfloat16 and int8, against the
float32 product's argmax: on near-ties that the low precision alone gets wrong, on
heavy-tailed hidden rows like Whisper's (the int8 radius must hold there and still rule
out nearly every token), with suppressed tokens, and inside greedy decoding of the
embedded Whisper on every bundled sample, where the tokens must equal those of the full
float32 logits."""
from __future__ import annotations

import pytest
import torch

from shardscribe.pipeline.models import screened_argmax
from shardscribe.pipeline.models.screened_argmax import INT8_ENGINES, Int8ScreenedArgmax, ScreenedArgmax


needs_fbgemm = pytest.mark.skipif(torch.backends.quantized.engine not in INT8_ENGINES,
                                  reason="the int8 screen needs fbgemm's int8 product (x86)")
INT8 = pytest.param(Int8ScreenedArgmax, marks=needs_fbgemm, id="int8")


def _bf16_product(h, w):
    return torch.nn.functional.linear(h.bfloat16(), w.bfloat16()).float()


def _int8_product(h, w):
    """Each token's weights rounded to int8 on its own scale (max |w_v| / 127), the hidden
    row kept: what the int8 screen's weights alone do to a logit."""
    scale = w.abs().amax(1, keepdim=True) / 127
    return torch.nn.functional.linear(h, torch.round(w / scale) * scale)


def _near_ties(V=2048, D=384, N=128, seed=0, rough_product=_bf16_product):
    """Weights where each hidden row's best token has a twin a hair below it in float32
    (ids: best V/2 + n, twin n), picked among random twins so that the low-precision
    product puts the twin strictly above the best where it can: there the screen's radius
    is what keeps the best one in."""
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
            rough = rough_product(h[None], torch.stack([best, twin]))[0]
            if rough[1] > rough[0]:
                break
        weight[V // 2 + n], weight[n] = best, twin
    return weight, hidden


@pytest.mark.parametrize("screen, rough_product", [
    pytest.param(ScreenedArgmax, _bf16_product, id="bfloat16"),
    pytest.param(Int8ScreenedArgmax, _int8_product, marks=needs_fbgemm, id="int8")])
def test_screened_argmax_equals_the_float32_argmax_where_low_precision_alone_does_not(screen, rough_product):
    weight, hidden = _near_ties(rough_product=rough_product)
    exact = torch.nn.functional.linear(hidden, weight).argmax(-1)
    rough = rough_product(hidden, weight).argmax(-1)
    assert (rough != exact).sum() >= 10            # the inputs break a low-precision-only choice
    # (a bfloat16 radius 16x too small, 2^-9, fails here: checked by hand)
    none = torch.zeros(weight.shape[0], dtype=torch.bool)
    assert torch.equal(screen(weight, none)(hidden), exact)


def _whisper_like(V=8192, D=384, N=64, seed=2):
    """Output weights and hidden rows with the tails of Whisper tiny.en's: weights of rms
    ~0.023 with a few tokens up to ~0.5, hidden rows of rms ~11 with outlier dimensions
    near +-140."""
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(V, D, generator=g) * 0.023
    weight[torch.randint(0, V, (V // 50,), generator=g), torch.randint(0, D, (V // 50,), generator=g)] = 0.48
    hidden = torch.randn(N, D, generator=g) * 8
    hidden[:, :12] *= torch.rand(N, 12, generator=g) * 17
    return weight, hidden


def _second_level_residual(hidden):
    """h - h' for the two 7-bit levels the int8 screen's docstring specifies (each level's
    scale the largest magnitude it quantises over 63)."""
    s1 = hidden.abs().amax(1, keepdim=True) / 63
    rest = hidden - torch.round(hidden / s1) * s1
    s2 = rest.abs().amax(1, keepdim=True) / 63
    return rest - torch.round(rest / s2) * s2


@needs_fbgemm
def test_the_int8_radius_holds_on_heavy_tailed_rows_and_rules_out_nearly_every_token():
    weight, hidden = _whisper_like()
    # One token per row along the sign of that row's leftover after the two levels: it
    # takes the activation error at its largest, so the ||h - h'|| term must carry it.
    aligned = 0.05 * torch.sign(_second_level_residual(hidden))
    weight = torch.cat([weight, aligned])
    screen = Int8ScreenedArgmax(weight, torch.zeros(weight.shape[0], dtype=torch.bool))
    approx, radius = screen.screen(hidden)
    exact = torch.nn.functional.linear(hidden, weight)
    assert hidden.abs().max() > 100                # the tails that a one-level activation grid blurs
    assert bool(((approx - exact).abs() <= radius).all())
    rows = torch.arange(hidden.shape[0])
    own = weight.shape[0] - hidden.shape[0] + rows
    left = _second_level_residual(hidden).norm(dim=1) * aligned.norm(dim=1)
    assert bool(((approx - exact)[rows, own].abs() > 0.5 * left).all())    # the inputs reach that term
    # The radius is small enough to matter: a handful of candidates per row, not thousands.
    floor = (approx - radius).amax(-1, keepdim=True)
    assert (approx + radius >= floor).sum(-1).float().mean() < 20
    assert torch.equal(screen(hidden), exact.argmax(-1))


@needs_fbgemm
def test_an_int8_product_that_rounds_the_levels_is_refused(monkeypatch):
    weight, _ = _whisper_like(V=256, N=1)
    # An 8-bit activation grid (no reduce_range) puts the levels between its steps.
    monkeypatch.setattr(screened_argmax, "_int8_product",
                        lambda x, packed: torch.ops.quantized.linear_dynamic(x, packed, False))
    with pytest.raises(RuntimeError, match="exactly"):
        Int8ScreenedArgmax(weight, torch.zeros(256, dtype=torch.bool))


@pytest.mark.parametrize("screen", [pytest.param(ScreenedArgmax, id="bfloat16"), INT8])
def test_suppressed_tokens_are_never_chosen(screen):
    weight, hidden = _near_ties(seed=1)
    logits = torch.nn.functional.linear(hidden, weight)
    suppress = torch.zeros(weight.shape[0], dtype=torch.bool)
    suppress[logits.argmax(-1)[:64]] = True         # the winners of 64 rows are off limits
    expected = logits.masked_fill(suppress, float("-inf")).argmax(-1)
    got = screen(weight, suppress)(hidden)
    assert torch.equal(got, expected) and not suppress[got].any()


@pytest.mark.parametrize("screen", [pytest.param(ScreenedArgmax, id="bfloat16"), INT8])
def test_float32_weights_only(screen):
    with pytest.raises(ValueError, match="float32"):
        screen(torch.zeros(4, 4, dtype=torch.bfloat16), torch.zeros(4, dtype=torch.bool))


@pytest.mark.parametrize("kind", [pytest.param(ScreenedArgmax, id="bfloat16"), INT8])
def test_greedy_decoding_with_the_screen_equals_the_full_logits(whisper_adapter, sample_audio, kind):
    from shardscribe.pipeline.decoding.ar.greedy import greedy_decode

    adapter = whisper_adapter
    screen = kind(adapter.model.proj_out.weight, adapter.suppress_mask)
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


def test_the_screen_is_built_on_first_use_chosen_by_the_cpu_and_switched_off_by_config(monkeypatch, model_cache):
    from shardscribe.pipeline import device
    from shardscribe.pipeline.models.whisper.adapter import load_whisper_adapter

    monkeypatch.setattr(device, "cpu_bf16_native", lambda: True)
    on = load_whisper_adapter("embedded", cache_dir=model_cache)
    assert on._next_tokens is not None and not isinstance(on._next_tokens, ScreenedArgmax)   # not yet built
    assert isinstance(on.next_tokens, ScreenedArgmax)
    assert on.next_tokens.weight.data_ptr() == on.model.proj_out.weight.data_ptr()       # no float32 copy
    assert load_whisper_adapter("embedded", cache_dir=model_cache, screened_argmax=False).next_tokens is None
    # Emulated bfloat16 would be slower than float32: the int8 screen there, on fbgemm's product.
    monkeypatch.setattr(device, "cpu_bf16_native", lambda: False)
    fbgemm = torch.backends.quantized.engine in INT8_ENGINES
    pick = load_whisper_adapter("embedded", cache_dir=model_cache).next_tokens
    assert isinstance(pick, Int8ScreenedArgmax) if fbgemm else pick is None
    # Where fbgemm's product does not hold the levels exactly, no screen: the full product.
    monkeypatch.setattr(screened_argmax, "_int8_product",
                        lambda x, packed: torch.ops.quantized.linear_dynamic(x, packed, False))
    assert load_whisper_adapter("embedded", cache_dir=model_cache).next_tokens is None
