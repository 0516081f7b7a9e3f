"""Greedy token choice over a large output projection: screened in bfloat16, decided in
float32.

Greedy AR decoding (the baseline every seed system falls back to; "Self-Speculative
Decoding ...", eq. 6: y_t = argmax_v p(v | y_<t, X)) needs only the argmax of the logits
h . w_v over the vocabulary, not the logits. On a CPU the float32 product for Whisper's
51,864 tokens reads 80 MB of weights per step, half of a tiny.en decoder step. Here a
bfloat16 copy of the weights (half the bytes, and AVX512-BF16 dot products) gives
approximate logits a_v with a proven error radius, and only the tokens the radius cannot
rule out are scored again in float32:

    |a_v - h . w_v| <= r_v = REL * ||h||_2 * ||w_v||_2

(Cauchy-Schwarz on sum_i |h_i w_vi| times the relative error of rounding h and w to
bfloat16, 2 * 2^-8 (unit roundoff of an 8-bit significand), the rounding of a_v itself to
bfloat16, 2^-8, and the float32 accumulation over D terms, D * 2^-24: ~0.0117 at D = 384,
0.0120 at D = 4096; REL is 2.6 times that). A token v can be the best only if a_v + r_v >=
max_u (a_u - r_u); with R = max_v r_v, every such token (and the u of that maximum) lies
at or above the line max_u a_u - 2R, so the test runs on the few tokens above the line,
and only those that pass it are scored again. The result equals the argmax of the float32 logits, except where two tokens'
float32 logits lie within float32 rounding of each other (the rescoring sums in another
order than the full product). Suppressed tokens are left out of the product altogether.
"""
from __future__ import annotations

import torch

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
        rows, cols = rows[keep], cols[keep]
        exact = (hidden[rows] * self.weight[self.tokens[cols]]).sum(-1)
        approx.fill_(float("-inf"))[rows, cols] = exact   # reuse the buffer for the rescored
        return self.tokens[approx.argmax(-1)]
