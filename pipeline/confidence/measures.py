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


def _entropies(lp: torch.Tensor, alpha: float, measures) -> dict[str, torch.Tensor]:
    """The entropies named in ``measures`` of normalised log-probs ``lp`` [..., V], from one
    pass over p^alpha."""
    if alpha == 1.0:
        h = -(lp.exp() * lp).nan_to_num(0.0).sum(-1)
        return {m: h for m in measures}
    p_a = (alpha * lp).exp()
    out = {}
    if "gibbs" in measures:
        out["gibbs"] = -(p_a * (alpha * lp)).nan_to_num(0.0).sum(-1)
    if "tsallis" in measures or "renyi" in measures:
        total = p_a.sum(-1)
        out["tsallis"] = (1.0 - total) / (alpha - 1.0)
        out["renyi"] = total.log() / (1.0 - alpha)
    for m in measures:
        if m not in out:
            raise ValueError(f"unknown entropy {m!r} (known: gibbs, tsallis, renyi)")
    return out


def entropy(log_probs: torch.Tensor, measure: str, alpha: float = 1.0) -> torch.Tensor:
    """The entropy [...] of distributions given as normalised ``log_probs`` [..., V]."""
    return _entropies(log_probs.double(), alpha, (measure,))[measure]


def _normalised(h: torch.Tensor, measure: str, alpha: float, v: int, norm: str) -> torch.Tensor:
    h_max = _max_entropy(measure, alpha, v)
    if norm == "lin":
        out = 1.0 - h / h_max
    elif norm == "exp":
        out = (torch.pow(torch.tensor(float(v), dtype=h.dtype), 1.0 - h / h_max) - 1.0) / (v - 1.0)
    else:
        raise ValueError(f"unknown normalisation {norm!r} (lin, exp)")
    return out.clamp(0.0, 1.0)


def confidence(log_probs: torch.Tensor, measure: str, alpha: float = 1.0, norm: str = "lin") -> torch.Tensor:
    """Confidence in [0, 1] per distribution of ``log_probs`` [..., V]."""
    lp = log_probs.double()
    if measure == "max_prob":
        return _max_prob_of(lp, alpha, lp.shape[-1])
    return _normalised(entropy(lp, measure, alpha), measure, alpha, lp.shape[-1], norm)


def token_measures(log_probs: torch.Tensor, chosen: torch.Tensor) -> dict[str, torch.Tensor]:
    """The confidence features of N tokens from their distributions ``log_probs`` [N, V] and
    the tokens emitted ``chosen`` [N]: ``prob`` (the decoder's probability of the emitted
    token: the max-probability baseline of greedy decoding), the normalised max probability
    and the three entropy measures at ``DEFAULT_ALPHA`` (float32: one pass over p^alpha
    serves all three)."""
    lp = log_probs.float()
    v, a = lp.shape[-1], DEFAULT_ALPHA
    prob = lp.gather(-1, chosen.long().unsqueeze(-1)).squeeze(-1).exp()
    h = {k: x.double() for k, x in _entropies(lp, a, ("gibbs", "tsallis", "renyi")).items()}
    return {"prob": prob.double(), "max_prob": _max_prob_of(lp, a, v),
            "gibbs": _normalised(h["gibbs"], "gibbs", a, v, "lin"),
            "tsallis": _normalised(h["tsallis"], "tsallis", a, v, "exp"),
            "renyi": _normalised(h["renyi"], "renyi", a, v, "exp")}


def _max_prob_of(lp: torch.Tensor, alpha: float, v: int) -> torch.Tensor:
    """(p_max^a - V^-a) / (1 - V^-a)."""
    floor = v ** -alpha
    return ((alpha * lp.amax(-1).double()).exp() - floor) / (1.0 - floor)
