"""Greedy token choice over a large output projection: screened at low precision,
decided in float32.

Greedy AR decoding (the baseline every seed system falls back to; "Self-Speculative
Decoding ...", eq. 6: y_t = argmax_v p(v | y_<t, X)) needs only the argmax of the logits
h . w_v over the vocabulary, not the logits. On a CPU the float32 product for Whisper's
51,864 tokens reads 80 MB of weights per step, half of a tiny.en decoder step. A cheaper
product gives approximate logits a_v with a proven error radius r_v, |a_v - h . w_v| <= r_v;
a token v can be the best only if a_v + r_v >= max_u (a_u - r_u), and only the tokens
that pass that test are scored again in float32. The result equals the argmax of the
float32 logits, except where two tokens' float32 logits lie within float32 rounding of
each other (the rescoring sums in another order than the full product). Suppressed
tokens are left out of the product altogether. Two screens:

- ``ScreenedArgmax``: a bfloat16 copy of the weights (half the bytes, and AVX512-BF16 or
  AMX dot products), r_v = REL * ||h||_2 * ||w_v||_2 (Cauchy-Schwarz on sum_i |h_i w_vi|
  times the relative error of rounding h and w to bfloat16, 2 * 2^-8 (unit roundoff of
  an 8-bit significand), the rounding of a_v itself to bfloat16, 2^-8, and the float32
  accumulation over D terms, D * 2^-24: ~0.0117 at D = 384, 0.0120 at D = 4096; REL is 2.6
  times that). With R = max_v r_v, every candidate lies at or above the line
  max_u a_u - 2R, so the test runs on the few tokens above the line.
- ``Int8ScreenedArgmax``, for CPUs without native bfloat16: int8 weights with one scale
  per token, w'_v = s_v q_v (a quarter of the bytes, through fbgemm's int8 product), and
  the hidden row in two 7-bit integer levels of its own scales, h' = s_1 x_1 + s_2 x_2
  (x_2 quantises what x_1 leaves, so h' is ~2^-12 of ||h|| from h). Then
  h . w_v - h' . w'_v = h . (w_v - w'_v) + (h - h') . w'_v, and by Cauchy-Schwarz

      r_v = ||h|| ||w_v - w'_v|| + ||h - h'|| ||w'_v||   (+ float32 rounding terms),

  with ||w_v - w'_v|| and ||w'_v|| exact per token and ||h - h'|| exact per row. The
  integer levels reach fbgemm unchanged: a pinning row spans [-63, 64], so its dynamic
  activation quantisation (7 bits, [0, 127]) gets scale 1 and zero point 63 and rounds
  nothing; construction checks that on a probe and refuses the screen otherwise.
"""
from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .base import ARDecoderModel

# 2 * 2^-8 (inputs) + 2^-8 (bfloat16 output) + D * 2^-24 (D <= 4096) is ~0.012; with margin:
REL = 2.0 ** -5


class ScreenedArgmax:
    """``tokens = ScreenedArgmax(weight, suppress)(hidden)``: per row of ``hidden`` [N, D]
    (float32), the argmax over v of hidden . weight[v] (weight [V, D], float32, no bias)
    among the tokens ``suppress`` [V] (bool) leaves allowed."""

    def __init__(self, weight: torch.Tensor, suppress: torch.Tensor):
        if weight.dtype != torch.float32:
            raise ValueError(f"screening needs float32 weights, got {weight.dtype}")
        self.tokens = (~suppress.to(weight.device)).nonzero().squeeze(-1)   # allowed ids, ascending
        self.weight = weight.detach()               # the model's own tensor, not a copy
        allowed = self.weight.index_select(0, self.tokens)
        self.low = allowed.to(torch.bfloat16)
        self.radius = allowed.norm(dim=1) * REL    # r_v / ||h||
        self.reach = 2 * float(self.radius.max())

    @torch.inference_mode()
    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = hidden.float()
        approx = torch.nn.functional.linear(hidden.to(torch.bfloat16), self.low).float()
        norm = hidden.norm(dim=1)
        line = approx.amax(-1, keepdim=True) - self.reach * norm.unsqueeze(-1)
        rows, cols = (approx >= line).nonzero(as_tuple=True)
        a, r = approx[rows, cols], norm[rows] * self.radius[cols]
        floor = torch.full_like(norm, float("-inf")).scatter_reduce_(0, rows, a - r, "amax")
        keep = a + r >= floor[rows]
        return _rescored_argmax(hidden, approx, rows[keep], cols[keep], self.tokens, self.weight)


def greedy_tokens(adapter: ARDecoderModel, hidden: torch.Tensor) -> torch.Tensor:
    """The greedy token after each of ``hidden``'s rows [N, D] with the adapter's
    suppressed tokens masked: through its screened argmax (``adapter.next_tokens``) where it
    has one, else the argmax of its logits."""
    pick = adapter.next_tokens
    if pick is not None:
        return pick(hidden)
    logits = adapter.logits(hidden)
    logits.masked_fill_(adapter.suppress_mask, float("-inf"))
    return logits.argmax(-1)


def _rescored_argmax(hidden: torch.Tensor, approx: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor,
                     tokens: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The float32 argmax among the candidates (``rows``, ``cols``) of ``approx`` [N, V']:
    each candidate scored again in float32, every other column ruled out."""
    exact = (hidden[rows] * weight[tokens[cols]]).sum(-1)
    approx.fill_(float("-inf"))[rows, cols] = exact   # reuse the buffer for the rescored
    return tokens[approx.argmax(-1)]


# Integer levels of the hidden row: 7-bit signed, so that with the pinning row every value
# lies in [-63, 64] and fbgemm's unsigned 7-bit activation grid (reduce_range) holds it
# with scale 1 and zero point 63.
_LEVELS = 63
# torch's quantised engines whose dynamic int8 Linear is fbgemm's.
INT8_ENGINES = ("x86", "fbgemm")
# Rows with a larger norm (or a non-finite one) take the full product: the screen's
# products then stay far inside float32's range for any weights of norm < 1e8.
_LARGEST = 1e30


def _rounding(dim: int) -> float:
    """Float32 rounding outside the two Cauchy-Schwarz terms, as a multiple of
    ||h|| (||w'_v|| + ||w_v - w'_v||) >= ||h|| ||w_v||: the float32 product h . w_v itself
    (at most D * 2^-24 of that), fbgemm's and our rescaling of the integer sums and
    h - h' in float32 (a few 2^-24 each); twice that, with a floor."""
    return 2 * dim * 2.0 ** -24 + 1e-5


def _int8_product(levels: torch.Tensor, packed) -> torch.Tensor:
    """fbgemm's int8 product of float rows of integer levels with the packed weights
    (activations quantised dynamically on a 7-bit grid: reduce_range)."""
    return torch.ops.quantized.linear_dynamic(levels, packed, True)


class Int8ScreenedArgmax:
    """``tokens = Int8ScreenedArgmax(weight, suppress)(hidden)``: as :class:`ScreenedArgmax`,
    screened through fbgemm's int8 product (``torch.ops.quantized.linear_dynamic``);
    raises RuntimeError where this torch build has no such product or it does not
    multiply the integer levels exactly."""

    def __init__(self, weight: torch.Tensor, suppress: torch.Tensor):
        if weight.dtype != torch.float32:
            raise ValueError(f"screening needs float32 weights, got {weight.dtype}")
        if weight.device.type != "cpu" or torch.backends.quantized.engine not in INT8_ENGINES:
            raise RuntimeError("the int8 screen needs fbgemm's CPU int8 product (quantized engine x86/fbgemm)")
        self.suppressed = suppress.to(weight.device)
        self.tokens = (~self.suppressed).nonzero().squeeze(-1)
        self.weight = weight.detach()
        allowed = self.weight.index_select(0, self.tokens)
        largest = torch.linalg.vector_norm(allowed, float("inf"), dim=1)     # max |w_vi|, no |w| copy
        scales = (largest / 127).clamp_min(torch.finfo(torch.float32).tiny).double()
        with warnings.catch_warnings():     # torch marks its quantised tensors deprecated
            warnings.simplefilter("ignore")
            q = torch.quantize_per_channel(allowed, scales, torch.zeros_like(scales, dtype=torch.long), 0,
                                           torch.qint8)
            self.packed = torch.ops.quantized.linear_prepack(q, None)
        low = q.dequantize()
        self.low_norm = low.norm(dim=1)                        # ||w'_v||
        self.error_norm = (allowed - low).norm(dim=1)           # ||w_v - w'_v||
        self.weight_norm_bound = self.low_norm + self.error_norm   # >= ||w_v||
        self.rounding = _rounding(weight.shape[1])
        self.pin = torch.zeros(1, weight.shape[1])
        self.pin[0, 0], self.pin[0, -1] = -_LEVELS, _LEVELS + 1
        self._check_exact(q)

    def _check_exact(self, q) -> None:
        """fbgemm must return the integer levels' products with the dequantised weights
        (to float32 rounding): otherwise the radius would not hold. Probed on ~4k tokens
        spread over the vocabulary and the last one, not all of it: a kernel that rounds the
        levels rounds them for every token, and the probe runs at every model load."""
        g = torch.Generator().manual_seed(0)
        x = torch.randint(-_LEVELS, _LEVELS + 1, (3, self.pin.shape[1]), generator=g).float()
        V = q.shape[0]
        probe = torch.cat([torch.arange(0, V, max(1, V // 4096)), torch.tensor([V - 1])])
        got = _int8_product(torch.cat([x, self.pin]), self.packed)[:3, probe].double()
        low = q.int_repr()[probe].double() * q.q_per_channel_scales()[probe, None]
        want = x.double() @ low.t()
        bound = 1e-5 * (x.double().abs() @ low.abs().t())
        if not bool(((got - want).abs() <= bound + 1e-30).all()):
            raise RuntimeError("fbgemm's int8 product does not multiply integer levels exactly on this build")

    def _full(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = torch.nn.functional.linear(hidden, self.weight)
        logits.masked_fill_(self.suppressed, float("-inf"))
        return logits.argmax(-1)

    def screen(self, hidden: torch.Tensor, norm: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Approximate logits of the allowed tokens [N, V'] for float32 rows ``hidden``
        [N, D] of finite norms below _LARGEST (``norm``: those norms [N, 1], if at hand),
        and the radius [N, V'] each lies within of the float32 product's."""
        N = hidden.shape[0]
        norm = hidden.norm(dim=1, keepdim=True) if norm is None else norm
        # Scales stay normal floats, so a process that flushes denormals to zero still divides.
        tiny = torch.finfo(torch.float32).tiny
        s1 = (hidden.abs().amax(1, keepdim=True) / _LEVELS).clamp_min(tiny)
        x1 = torch.round(hidden / s1).clamp_(-_LEVELS, _LEVELS)
        rest = hidden - x1 * s1
        s2 = (rest.abs().amax(1, keepdim=True) / _LEVELS).clamp_min(tiny)
        x2 = torch.round(rest / s2).clamp_(-_LEVELS, _LEVELS)
        left = (rest - x2 * s2).norm(dim=1, keepdim=True)          # ||h - h'||, up to float32 rounding
        out = _int8_product(torch.cat([x1, x2, self.pin]), self.packed)
        approx = out[:N].mul_(s1).add_(out[N:2 * N] * s2)
        radius = (left * self.low_norm).addcmul_(norm, self.error_norm)
        return approx, radius.addcmul_(norm * self.rounding, self.weight_norm_bound)

    @torch.inference_mode()
    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = hidden.float()
        norm = hidden.norm(dim=1, keepdim=True)
        # A NaN or infinite entry makes its row's norm fail this too (a NaN compares false);
        # below it every product the screen forms is finite.
        if hidden.shape[0] == 0 or not bool((norm < _LARGEST).all()):
            return self._full(hidden)
        approx, radius = self.screen(hidden, norm)
        floor = (approx - radius).amax(-1, keepdim=True)
        rows, cols = (approx + radius >= floor).nonzero(as_tuple=True)
        return _rescored_argmax(hidden, approx, rows, cols, self.tokens, self.weight)
