"""Per-token confidence measures of "Fast Entropy-Based Methods of Word-Level Confidence
Estimation for End-to-End Automatic Speech Recognition" (Laptev and Ginsburg), from their
definitions, over a distribution p of V outcomes and a parameter alpha > 0:

- max probability: (p_max^a - V^-a) / (1 - V^-a): 0 for the uniform distribution, 1 for a
  certain one;
- Gibbs entropy of p^a: H = -sum p^a log p^a, at most a V^(1-a) log V (uniform p);
- Tsallis entropy: H = (1 - sum p^a) / (a - 1), at most (1 - V^(1-a)) / (a - 1);
- Rényi entropy: H = log(sum p^a) / (1 - a), at most log V;

each entropy mapped to a confidence in [0, 1] linearly, 1 - H / H_max, or exponentially
with a linear shift, (V^(1 - H / H_max) - 1) / (V - 1), which for Shannon's entropy is
(V exp(-H) - 1) / (V - 1). alpha -> 1 is Shannon's entropy for all three. Natural
logarithms throughout.
"""
from __future__ import annotations

import math

import torch

MEASURES = ("max_prob", "gibbs", "tsallis", "renyi")
# The measures the confidence features use: the paper's best per family (alpha = 1/3,
# exponential normalisation for Tsallis and Rényi, linear for Gibbs).
DEFAULT_ALPHA = 1.0 / 3.0


def _max_entropy(measure: str, alpha: float, v: int) -> float:
    if measure == "gibbs":
        return alpha * v ** (1.0 - alpha) * math.log(v)
    if measure == "tsallis":
        return math.log(v) if alpha == 1.0 else (1.0 - v ** (1.0 - alpha)) / (alpha - 1.0)
    return math.log(v)


def entropy(log_probs: torch.Tensor, measure: str, alpha: float = 1.0) -> torch.Tensor:
    """The entropy [...] of distributions given as normalised ``log_probs`` [..., V]."""
    lp = log_probs.double()
    p_a = (alpha * lp).exp()
    if measure == "gibbs" or alpha == 1.0:
        return -(p_a * (alpha * lp)).nan_to_num(0.0).sum(-1)
    if measure == "tsallis":
        return (1.0 - p_a.sum(-1)) / (alpha - 1.0)
    if measure == "renyi":
        return p_a.sum(-1).log() / (1.0 - alpha)
    raise ValueError(f"unknown entropy {measure!r} (known: gibbs, tsallis, renyi)")


def confidence(log_probs: torch.Tensor, measure: str, alpha: float = 1.0, norm: str = "lin") -> torch.Tensor:
    """Confidence in [0, 1] per distribution of ``log_probs`` [..., V]."""
    v = log_probs.shape[-1]
    if measure == "max_prob":
        floor = v ** -alpha
        return ((alpha * log_probs.double().amax(-1)).exp() - floor) / (1.0 - floor)
    h = entropy(log_probs, measure, alpha)
    h_max = _max_entropy(measure, alpha, v)
    if norm == "lin":
        out = 1.0 - h / h_max
    elif norm == "exp":
        out = (torch.pow(torch.tensor(float(v), dtype=h.dtype), 1.0 - h / h_max) - 1.0) / (v - 1.0)
    else:
        raise ValueError(f"unknown normalisation {norm!r} (lin, exp)")
    return out.clamp(0.0, 1.0)


def token_measures(log_probs: torch.Tensor, chosen: torch.Tensor) -> dict[str, torch.Tensor]:
    """The confidence features of N tokens from their distributions ``log_probs`` [N, V] and
    the tokens emitted ``chosen`` [N]: ``prob`` (the decoder's probability of the emitted
    token: the max-probability baseline of greedy decoding), the normalised max probability
    and the three entropy measures at ``DEFAULT_ALPHA``."""
    lp = log_probs.float()
    prob = lp.gather(-1, chosen.long().unsqueeze(-1)).squeeze(-1).exp()
    return {"prob": prob.double(),
            "max_prob": confidence(lp, "max_prob", DEFAULT_ALPHA),
            "gibbs": confidence(lp, "gibbs", DEFAULT_ALPHA, "lin"),
            "tsallis": confidence(lp, "tsallis", DEFAULT_ALPHA, "exp"),
            "renyi": confidence(lp, "renyi", DEFAULT_ALPHA, "exp")}
