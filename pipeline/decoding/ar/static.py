"""Greedy AR decoding over a preallocated (static) KV cache, the step free of host
synchronisation: the static-cache decoding loop of "Accelerating Generative AI with
PyTorch II: GPT, Fast" (static KV cache, fixed shapes, one graph of the decoding step),
applied to the greedy baseline of "Self-Speculative Decoding for LLM-based ASR with CTC
Encoder Drafts" (eq. 6: y_t = argmax_v p(v | y_<t, X)).

The algorithm, per ``greedy_decode`` call given ``static`` (``run_static_loop``):

1. The prefill (or the SSD seeds, eqs. 6-7) is the eager loop's own pass
   (pipeline.decoding.ar.greedy), so the first token and the K/V of prompt + prefix are
   the same tensors; they are copied into buffers [B, H, S, d] per layer, S = L + limit.
2. Every later step feeds one token per row at column L + t, position p_b + t, and attends
   over all S columns under a mask ``valid & column <= L + t``: shapes never change, so
   the step can be captured once as a CUDA graph and replayed
   (pipeline.decoding.ar.graphs).
3. End-of-text is a mask: a row that emitted it keeps feeding end-of-text and its later
   tokens are ignored. The host reads ``done.all()`` only every ``check_every`` steps.
   Rows do not leave the batch (the eager loop drops them): the price of fixed shapes.

The token after each step is the argmax of the float32 logits with the adapter's
suppressed tokens masked; on a CPU without a graph it goes through the adapter's
screened argmax as the eager loop does (pipeline.models.screened_argmax), so the
tokens are the eager loop's. What the static loop does not run (the eager loop does):
drafters, per-row logit edits (Whisper's timestamp rules), decoders without a static
step (the adapter's ``static_step``, pipeline.models.whisper.static_step and
pipeline.models.granite_speech.static_step; other decoders have none).
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from ..drafting.drafters import NO_DRAFT
from ...models.screened_argmax import greedy_tokens

if TYPE_CHECKING:
    from ...models.base import ARDecoderModel

# Steps between the host's checks that every row has ended: each check waits for the
# device; between them finished rows decode end-of-text for nothing.
CHECK_EVERY = 8


def runs_static(adapter: ARDecoderModel, drafter, rules) -> bool:
    """Whether a ``greedy_decode`` call can take the static loop: plain greedy steps (no
    drafter), the adapter's own masks with no per-row edit, a decoder with a static step
    (the adapter's ``static_step``)."""
    if drafter is not NO_DRAFT or rules.edit is not None or rules.suppress_mask is not adapter.suppress_mask:
        return False
    return adapter.static_step() is not None


def layers_of(cache) -> tuple[list, list]:
    """A decoder cache's self- and cross-attention K/V per layer (no cross-attention: [])."""
    from transformers.cache_utils import EncoderDecoderCache

    if not isinstance(cache, EncoderDecoderCache):
        return [(la.keys, la.values) for la in cache.layers], []
    self_cache, cross_cache = cache.self_attention_cache, cache.cross_attention_cache
    return ([(la.keys, la.values) for la in self_cache.layers],
            [(la.keys, la.values) for la in cross_cache.layers if la.keys is not None and la.keys.numel()])


def pick_tokens(adapter: ARDecoderModel, hidden: torch.Tensor, screened: bool) -> torch.Tensor:
    """The greedy tokens after ``hidden`` [B, D]: the adapter's screened argmax where
    ``screened`` (a CPU without a graph: the eager loop's choice), else the argmax of the
    masked float32 logits, which a graph can hold."""
    if screened:
        return greedy_tokens(adapter, hidden)
    return adapter.logits(hidden).masked_fill_(adapter.suppress_mask, float("-inf")).argmax(-1)


class StepState:
    """The loop's device state, every tensor updated in place (a graph replays the same
    addresses): ``tok`` [B] (each row's newest token; end-of-text once ``done``), ``pos``
    [B] (its position), ``col`` and ``t`` ([1]: the cache column it is written to, and its
    index in ``out`` [B, W]), ``valid`` [B, 1, 1, S] (columns a row may attend to, those
    past ``col`` aside), the K/V per layer (self-attention [B, H, S, d], cross-attention
    [B, H, T, d])."""

    def __init__(self, B: int, S: int, W: int, self_like, cross_kv, device, own_cross: bool):
        long = dict(dtype=torch.long, device=device)
        self.tok, self.pos = torch.zeros(B, **long), torch.zeros(B, **long)
        self.done = torch.ones(B, dtype=torch.bool, device=device)
        self.col, self.t = torch.zeros(1, **long), torch.zeros(1, **long)
        self.columns = torch.arange(S, device=device)
        self.valid = torch.ones((B, 1, 1, S), dtype=torch.bool, device=device)
        self.out = torch.zeros((B, W), **long)
        k0 = self_like[0][0]
        self.self_kv = [(k0.new_zeros((B, k0.shape[1], S, k0.shape[-1])),
                         k0.new_zeros((B, k0.shape[1], S, k0.shape[-1]))) for _ in self_like]
        # without a graph the call's own cross K/V serve as they are: no copy
        self.cross_kv = [(k.new_zeros((B, *k.shape[1:])), v.new_zeros((B, *v.shape[1:]))) for k, v in cross_kv] \
            if own_cross else list(cross_kv)

    def load(self, self_kv, cross_kv, mask: torch.Tensor, pos: torch.Tensor, first: torch.Tensor,
             eot: int, copy_cross: bool) -> None:
        """Rows [0, B) from a prefill (``self_kv`` [B, H, L, d], ``mask`` [B, L], ``pos`` [B]:
        the next position, ``first`` [B]: the first token); rows past B are finished
        padding."""
        B, L = mask.shape
        for (K, V), (k, v) in zip(self.self_kv, self_kv):
            K[:B, :, :L].copy_(k)
            V[:B, :, :L].copy_(v)
        if copy_cross:
            for (K, V), (k, v) in zip(self.cross_kv, cross_kv):
                K[:B].copy_(k)
                V[:B].copy_(v)
        self.valid.fill_(True)
        self.valid[:B, 0, 0, :L] = mask.bool()
        self.tok.fill_(eot)
        self.tok[:B] = first
        self.done.fill_(True)
        self.done[:B] = first == eot
        self.pos.zero_()
        self.pos[:B] = pos
        self.col.fill_(L)
        self.t.fill_(1)
        self.out.fill_(eot)
        self.out[:, 0] = self.tok


def advance(step, adapter: ARDecoderModel, st: StepState, screened: bool) -> None:
    """One step of every row, in place: feed ``tok`` at ``col``, decide the next token
    (end-of-text again for finished rows), record it."""
    hidden = step(st.tok, st.pos, st.col, st.valid & (st.columns <= st.col), st.self_kv, st.cross_kv)
    st.tok.copy_(pick_tokens(adapter, hidden, screened).masked_fill_(st.done, adapter.eot_id))
    st.out.index_copy_(1, st.t, st.tok.unsqueeze(1))
    st.done.logical_or_(st.tok == adapter.eot_id)
    st.pos.add_(1)
    st.col.add_(1)
    st.t.add_(1)


class EagerRunner:
    """The static step run op by op on per-call buffers (no graph): the CPU's static loop
    and the reference a graph replay must equal."""

    def __init__(self, adapter: ARDecoderModel, screened: bool = True):
        self.adapter, self.step, self.screened = adapter, adapter.static_step(), screened
        # the screened argmax already waits for each step's tokens: checking is free
        self.check_every = 1 if screened else CHECK_EVERY
        self.state = None

    def load(self, self_kv, cross_kv, mask, pos, first, limit: int) -> StepState:
        B, L = mask.shape
        self.state = StepState(B, L + limit, limit, self_kv, cross_kv, mask.device, own_cross=False)
        self.state.load(self_kv, cross_kv, mask, pos, first, self.adapter.eot_id, copy_cross=False)
        return self.state

    def advance(self) -> None:
        advance(self.step, self.adapter, self.state, self.screened)

    def finish(self) -> None:
        self.state = None


def run_static_loop(runner, adapter: ARDecoderModel, self_kv, cross_kv, mask: torch.Tensor, pos: torch.Tensor,
                    first: torch.Tensor, limit: int, timer: dict | None = None) -> list[list[int]]:
    """Steps 2-3 of the module docstring from the eager prefill's state: its K/V per layer
    (``self_kv`` [B, H, L, d], ``cross_kv`` [B, H, T, d]; none without cross-attention),
    ``mask`` [B, L], ``pos`` [B, 1] (the next position), ``first`` [B] (the first token).
    Returns each row's tokens, end-of-text excluded, at most ``limit``."""
    t0 = time.perf_counter()
    B, eot = mask.shape[0], adapter.eot_id
    try:
        st = runner.load(self_kv, cross_kv, mask, pos[:, 0], first, limit)
        t = 1    # tokens decided: the first is the prefill's
        while t < limit:
            if (t - 1) % runner.check_every == 0 and bool(st.done.all()):
                break
            runner.advance()
            t += 1
        rows = st.out[:B, :limit].tolist()
    finally:
        runner.finish()
    if timer is not None:
        timer["decode"] = timer.get("decode", 0.0) + time.perf_counter() - t0
    return [r[:r.index(eot)] if eot in r else r for r in rows]
