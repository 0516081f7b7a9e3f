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
bfloat16, 2 * 2^-9, the float32 accumulation over D terms, and the rounding of a_v itself
to bfloat16; REL holds twice their sum). With R = max_v r_v, no token below
max_u a_u - 2R can beat the best one, so only tokens at or above that line are scored
again. The result equals the argmax of the float32 logits, except where two tokens'
float32 logits lie within float32 rounding of each other (the rescoring sums in another
order than the full product). Suppressed tokens are left out of the product altogether.
"""
from __future__ import annotations

import torch

# 2 * 2^-9 (inputs) + 2^-9 (bfloat16 output) + D * 2^-24 (D <= 4096) is ~0.0064; with margin:
REL = 2.0 ** -6


class ScreenedArgmax:
    """``tokens = ScreenedArgmax(weight, suppress)(hidden)``: per row of ``hidden`` [N, D]
    (float32), the argmax over v of hidden . weight[v] (weight [V, D], float32, no bias)
    among the tokens ``suppress`` [V] (bool) leaves allowed."""

    def __init__(self, weight: torch.Tensor, suppress: torch.Tensor):
        if weight.dtype != torch.float32:
            raise ValueError(f"screening needs float32 weights, got {weight.dtype}")
        self.tokens = (~suppress.to(weight.device)).nonzero().squeeze(-1)   # allowed ids, ascending
        allowed = weight.detach().index_select(0, self.tokens)
        self.weight = allowed
        self.low = allowed.to(torch.bfloat16)
        self.reach = 2 * REL * float(allowed.norm(dim=1).max())

    @torch.inference_mode()
    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = hidden.float()
        approx = torch.nn.functional.linear(hidden.to(torch.bfloat16), self.low).float()
        line = approx.amax(-1, keepdim=True) - self.reach * hidden.norm(dim=1, keepdim=True)
        rows, cols = (approx >= line).nonzero(as_tuple=True)
        exact = (hidden[rows] * self.weight[cols]).sum(-1)
        approx.fill_(float("-inf"))[rows, cols] = exact   # reuse the buffer for the rescored
        return self.tokens[approx.argmax(-1)]
