"""Frame preparation for the batched CTC beam search of "FlexCTC: GPU-powered CTC Beam
Decoding with advanced Contextual Abilities" (Algorithm 1's input D and lengths L), with
the per-frame token pruning of "FLToP CTC: Frame-Level Token Pruning via Relative
Threshold for Efficient and Memory-Saving Decoding on Diverse Platforms" (Algorithm 1,
lines 5-12, via :mod:`pipeline.decoding.ctc_beam.flop`).

Blank is moved to column 0, so the step can treat "label 0" as blank whatever the model's
blank id. Finished utterances (t >= length) are frozen: their padded frames become a frame
where blank has log-prob 0 and every other token -inf, with no pruning, so scores, fusion
states and hypotheses stay as they were (NeMo adds padded-frame scores; we do not).

FLToP does not depend on the hypotheses, so every frame is pruned up front and the
expansion and the fusion lookups use [B, beam, N] instead of [B, beam, V+1].

Frame compression (with FLToP, ``compress``): when a frame keeps a single token and the
frame before kept the same single token, the last label of every hypothesis is already
that token (blank included), so the frame only adds the same log-prob to every score: no
new token, no fusion step, no merge, and (max merge) no pruning. A run of such frames is
searched as ONE step whose score is the sum of the run's log-probs; a ``frame_map`` takes
emitted tokens back to their original frames (timestamps), and live-beam counts are
weighted by the frames a step stands for. With logsumexp merge the first step of a run
can raise the best score, so the second frame may still prune: runs keep their first two
steps apart. Results equal the frame-by-frame FLToP search up to float summation order.
Steps are left-aligned per utterance and the batched loop runs over the longest
compressed utterance; buffers keep the uncompressed shape (static for CUDA graphs).
"""
from __future__ import annotations

from typing import Protocol

import torch

from .state import NEG_INF, Frames
from .flop import prune_frame


class NativeFrames(Protocol):
    """A native implementation of the FLToP preparation (the native loop's library);
    either call returns None where it does not apply, and the torch code runs instead."""

    def flop_prune(self, log_probs: torch.Tensor, lengths: torch.Tensor, blank: int, top_n: int,
                   ratio: float | None): ...

    def flop_compress(self, values: torch.Tensor, tokens: torch.Tensor, lengths: torch.Tensor,
                      theta: float, v1: int): ...


def prepare_frames(log_probs: torch.Tensor, lengths: torch.Tensor, *, blank: int,
                   prune_threshold: float | None, flop_top_n: int | None, flop_ratio: float | None,
                   compress: bool, merge: str, native: NativeFrames | None = None) -> Frames:
    """Frames [T, B, V+1] of ``log_probs`` [B, T, V+1] with blank in column 0 and padded
    frames frozen; with FLToP (``flop_top_n``) every frame pruned and, with ``compress``,
    runs of frames that keep one and the same token folded into one step."""
    if isinstance(log_probs, torch.Tensor):
        b, t, v1 = log_probs.shape
        dev = log_probs.device
    else:   # each utterance's own [T_b, V+1] frames
        b, t, v1 = len(log_probs), max(int(r.shape[0]) for r in log_probs), int(log_probs[0].shape[-1])
        dev = log_probs[0].device
    valid = torch.arange(t, device=dev)[:, None] < lengths[None, :]       # [T, B]
    theta = float("inf") if prune_threshold is None else float(prune_threshold)
    inf = torch.tensor(float("inf"), device=dev)
    thresholds = torch.where(valid, torch.tensor(theta, device=dev), inf)
    pruned = None
    if flop_top_n is not None and native is not None:
        pruned = native.flop_prune(log_probs, lengths, blank, flop_top_n, flop_ratio)
    if pruned is None and not isinstance(log_probs, torch.Tensor):
        log_probs = pad_rows(log_probs)
    if pruned is None:
        lp = log_probs.float()
        if blank != 0:
            lp = torch.cat([lp[..., blank:blank + 1], lp[..., :blank], lp[..., blank + 1:]], dim=-1)
        frozen = torch.full((v1,), NEG_INF, device=dev)
        frozen[0] = 0.0
        frames = torch.where(valid[:, :, None], lp.transpose(0, 1), frozen)
        if flop_top_n is None:
            ids = torch.arange(v1, device=dev)
            lm_tokens = torch.where(ids == 0, v1 - 1, ids - 1)[None, :]
            return Frames(frames.contiguous(), None, lm_tokens, thresholds.contiguous(), valid.float(),
                          t, None, t)
        pruned = prune_frame(frames.view(t * b, v1), flop_top_n, flop_ratio)
    values, tokens = pruned
    values, tokens = values.view(t, b, -1), tokens.view(t, b, -1)
    frame_map, weights, steps = None, valid.float(), t
    if compress and t > 0 and merge == "max" and native is not None:
        done = native.flop_compress(values, tokens, lengths, theta, v1)
        if done is not None:
            return Frames(*done, t)
    if compress and t > 0:
        values, tokens, thresholds, weights, frame_map, steps = compress_runs(values, tokens, valid, theta, merge)
    lm_tokens = torch.where(tokens == 0, v1 - 1, tokens - 1)
    return Frames(values.contiguous(), tokens.contiguous(), lm_tokens.contiguous(),
                  thresholds.contiguous(), weights.contiguous(), steps, frame_map, t)


def pad_rows(rows: list[torch.Tensor]) -> torch.Tensor:
    """[B, T, V+1] from each utterance's [T_b, V+1] log-probs; padding at -inf (any
    value would do: padded frames are frozen by their length)."""
    t = max(int(r.shape[0]) for r in rows)
    out = torch.full((len(rows), t, int(rows[0].shape[-1])), float("-inf"), dtype=torch.float32,
                     device=rows[0].device)
    for i, r in enumerate(rows):
        out[i, :r.shape[0]] = r
    return out


def compress_runs(values: torch.Tensor, tokens: torch.Tensor, valid: torch.Tensor, theta: float, merge: str):
    """Fold runs of single-token FLToP frames (see the module docstring). Returns the
    step inputs (still [T, B, ...], steps and padding after them frozen), the thresholds,
    the weights, the frame map [B, T] and the number of steps."""
    t, b, n = values.shape
    dev = values.device
    single = valid & (torch.isinf(values[..., 1]) if n > 1 else torch.ones_like(valid))
    tok = torch.where(single, tokens[..., 0], -1)
    cont = single.clone()
    cont[0] = False
    cont[1:] &= tok[1:] == tok[:-1]
    if merge == "logsumexp":
        # the run's first frame merges, the second prunes against the merged best,
        # the rest only add: keep the first two steps apart
        second = torch.zeros_like(cont)
        second[1:] = cont[1:] & ~cont[:-1]
        cont &= ~second
    starts = valid & ~cont
    step_of = starts.long().cumsum(0) - 1                              # [T, B]
    counts = starts.sum(0)                                             # [B]
    steps = int(counts.max()) if b else 0
    cols = torch.arange(b, device=dev)
    dump = t * b  # padded frames scatter into a discarded row
    dest = torch.where(valid, step_of * b + cols, dump).reshape(-1)
    frozen_v = torch.full((n,), NEG_INF, device=dev)
    frozen_v[0] = 0.0
    out_v = frozen_v.expand(t * b + 1, n).clone()
    out_t = torch.zeros((t * b + 1, n), dtype=tokens.dtype, device=dev)
    src = torch.where(starts.reshape(-1), torch.arange(t * b, device=dev), dump)
    first = torch.full((t * b + 1,), dump, dtype=torch.int64, device=dev)
    first.index_copy_(0, torch.where(starts.reshape(-1), dest, dump), src)
    out_v[:dump] = values.reshape(t * b, n).index_select(0, first[:dump].clamp(max=dump - 1))
    out_t[:dump] = tokens.reshape(t * b, n).index_select(0, first[:dump].clamp(max=dump - 1))
    # a run's step scores the sum of its frames' log-probs of the one token it keeps
    total = torch.zeros(t * b + 1, device=dev).index_add_(0, dest, values[..., 0].reshape(-1).masked_fill(
        ~valid.reshape(-1), 0.0))
    live = torch.arange(t, device=dev)[:, None] < counts[None, :]      # [T, B] steps in use
    out_v = out_v[:dump].view(t, b, n)
    out_v[..., 0] = torch.where(live, total[:dump].view(t, b), 0.0)
    out_v = torch.where(live[:, :, None], out_v, frozen_v)
    out_t = torch.where(live[:, :, None], out_t[:dump].view(t, b, n), 0)
    weights = torch.zeros(t * b + 1, device=dev).index_add_(0, dest, valid.reshape(-1).float())[:dump].view(t, b)
    thresholds = torch.where(live, torch.tensor(theta, device=dev), torch.tensor(float("inf"), device=dev))
    frame_map = torch.where(valid, step_of, steps).transpose(0, 1).contiguous()
    return out_v, out_t, thresholds, weights, frame_map, steps
