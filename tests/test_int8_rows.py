"""models.int8_rows: int8 Linear layers with one activation scale per token. A row's output
is bitwise the same alone, in any batch and token by token (torch's own dynamic int8
Linear, one scale per call, is not: checked on the same inputs), it stays within a bound
of float32, and the Whisper int8 model's states and greedy tokens for a clip do not depend
on the clips batched with it."""
from __future__ import annotations

import warnings

import torch

from shardscribe.pipeline.models.int8_rows import RowScaledInt8Linear, quantize_rows


def _rows_of_mixed_magnitude(seed: int = 0) -> tuple[torch.nn.Linear, torch.Tensor]:
    """A Linear and an input [4, 6, 64] whose rows' magnitudes span 1000x: one scale per
    call resolves the small rows with a handful of levels."""
    gen = torch.Generator().manual_seed(seed)
    lin = torch.nn.Linear(64, 48)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(48, 64, generator=gen) * 0.1)
        lin.bias.copy_(torch.randn(48, generator=gen))
    x = torch.randn(4, 6, 64, generator=gen) * torch.logspace(-3, 0, 24).reshape(4, 6, 1)
    return lin, x


def _per_call_int8(lin: torch.nn.Linear) -> torch.nn.Module:
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return quantize_dynamic(torch.nn.Sequential(lin), {"0": per_channel_dynamic_qconfig})[0]


def _alone(module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each batch row in a call of its own, and each token in a call of its own."""
    rows = torch.cat([module(x[i:i + 1]) for i in range(x.shape[0])])
    tokens = torch.cat([module(x[:, t:t + 1]) for t in range(x.shape[1])], dim=1)
    return rows, tokens


@torch.inference_mode()
def test_a_rows_output_is_the_same_in_any_batch_and_call_shape():
    lin, x = _rows_of_mixed_magnitude()
    q = RowScaledInt8Linear.from_float(lin)
    full = q(x)
    rows, tokens = _alone(q, x)
    assert torch.equal(full, rows) and torch.equal(full, tokens)
    # torch's per-call scale: the same rows give other results alone than batched
    plain = _per_call_int8(lin)
    plain_rows, plain_tokens = _alone(plain, x)
    assert not torch.equal(plain(x), plain_rows) and not torch.equal(plain(x), plain_tokens)


@torch.inference_mode()
def test_chunked_calls_give_the_unchunked_result(monkeypatch):
    import shardscribe.pipeline.models.int8_rows as int8_rows

    lin, x = _rows_of_mixed_magnitude(2)
    q = RowScaledInt8Linear.from_float(lin)
    whole = q(x)
    monkeypatch.setattr(int8_rows, "CHUNK_ROWS", 5)     # 24 rows: chunks of 5 and a last of 4
    assert torch.equal(q(x), whole)
    assert q(torch.zeros(0, 64)).shape == (0, 48)


@torch.inference_mode()
def test_per_token_scales_stay_close_to_float32_where_one_scale_per_call_does_not():
    lin, x = _rows_of_mixed_magnitude(1)
    ref = lin(x) - lin.bias     # the product alone: the bias would hide the small rows' error
    ours = RowScaledInt8Linear.from_float(lin)(x) - lin.bias
    plain = _per_call_int8(lin)(x) - lin.bias

    def worst_row(y):
        return ((y - ref).norm(dim=-1) / ref.norm(dim=-1)).max().item()

    assert worst_row(ours) < 0.05
    assert worst_row(plain) > 5 * worst_row(ours)


@torch.inference_mode()
def test_a_zero_row_gives_the_bias_and_shapes_and_dtype_are_kept():
    lin, _ = _rows_of_mixed_magnitude()
    q = RowScaledInt8Linear.from_float(lin)
    out = q(torch.zeros(2, 3, 64))
    assert out.shape == (2, 3, 48) and torch.equal(out, lin.bias.expand(2, 3, 48))
    assert q(torch.randn(5, 64, dtype=torch.bfloat16)).dtype == torch.bfloat16


def test_quantize_rows_replaces_every_linear_but_the_skipped_names():
    net = torch.nn.ModuleDict({"a": torch.nn.Linear(8, 8), "b": torch.nn.Sequential(torch.nn.Linear(8, 8)),
                               "fc2": torch.nn.Linear(8, 8)})
    assert quantize_rows(net, skip=("fc2",)) == 2
    assert type(net["a"]) is RowScaledInt8Linear and type(net["b"][0]) is RowScaledInt8Linear
    assert type(net["fc2"]) is torch.nn.Linear


@torch.inference_mode()
def test_whisper_int8_gives_a_clip_the_same_states_and_tokens_in_any_batch(model_cache, sample_audio,
                                                                          sample_manifest):
    from shardscribe.pipeline.decoding.ar.greedy import greedy_decode
    from shardscribe.pipeline.models.whisper.adapter import load_whisper_adapter

    int8 = load_whisper_adapter("embedded", cache_dir=model_cache, quantize="int8")
    audios = [sample_audio[m["id"]] for m in sample_manifest[:4]]
    batched = int8.encode(audios)
    alone = [int8.encode([a]) for a in audios]
    assert all(torch.equal(batched.states[i], e.states[0]) for i, e in enumerate(alone))
    tokens = greedy_decode(int8, batched.states)
    assert tokens == [greedy_decode(int8, e.states)[0] for e in alone]
