"""Word times of an attention decoder's output from its cross-attention ("Robust Speech
Recognition via Large-Scale Weak Supervision": word-level timestamps from the alignment
heads, the cross-attention heads whose weights follow the audio, aligned to the tokens by
dynamic time warping).

A teacher-forced decoder pass over prompt + tokens records, per alignment head (layer,
head), the softmax(q k^T / sqrt(d)) weights of the token positions over the segment's
valid encoder states. Each head's weights are standardised over the tokens, median
filtered over time, averaged over the heads; a monotonic path through minus that matrix
(dynamic time warping) gives each token the time of the frame where the path first
enters its row. Token i's time is that frame x 0.02 s; the last token's is repeated for
the token after it (the end of the last word). A word is a run of tokens starting at one
whose text begins with a space; it lasts from its first token's time to the next token's.
"""
from __future__ import annotations

import numpy as np
import torch

FRAME_S = 0.02  # seconds per encoder state


def median_filter(x: torch.Tensor, width: int) -> torch.Tensor:
    """Median over a window of ``width`` (odd) along the last axis, edges reflected."""
    half = width // 2
    if x.shape[-1] <= half:
        return x
    padded = torch.nn.functional.pad(x[None], (half, half, 0, 0), mode="reflect")[0]
    return padded.unfold(-1, width, 1).sort(-1).values[..., half]


def dtw_path(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row, column) indices of the cheapest monotonic path from (0, 0) to the last cell
    of ``cost`` [N, T] (steps: diagonal, down, right; ties go right, then down). The table
    is filled one anti-diagonal at a time: a cell needs only the two diagonals before it."""
    n, t = cost.shape
    acc = np.full((n + 1, t + 1), np.inf, dtype=np.float64)
    step = np.zeros((n + 1, t + 1), dtype=np.int8)
    acc[0, 0] = 0.0
    for d in range(2, n + t + 1):
        i = np.arange(max(1, d - t), min(n, d - 1) + 1)
        j = d - i
        diag, up, left = acc[i - 1, j - 1], acc[i - 1, j], acc[i, j - 1]
        choice = np.where((diag < up) & (diag < left), 0, np.where((up < diag) & (up < left), 1, 2))
        acc[i, j] = cost[i - 1, j - 1] + np.choose(choice, [diag, up, left])
        step[i, j] = choice
    step[0, :], step[:, 0] = 2, 1
    rows, cols = [], []
    i, j = n, t
    while i > 0 or j > 0:
        rows.append(i - 1)
        cols.append(j - 1)
        s = step[i, j]
        if s == 0:
            i, j = i - 1, j - 1
        elif s == 1:
            i -= 1
        else:
            j -= 1
    return np.array(rows[::-1]), np.array(cols[::-1])


class CrossAttentionRecorder:
    """Records the queries of the alignment heads' layers during one decoder pass (forward
    hooks on their cross-attention query projections), so the weights can be computed for
    those heads alone whatever attention kernel the model runs."""

    def __init__(self, decoder, heads: list[tuple[int, int]]):
        self.decoder, self.heads = decoder, heads
        self.queries: dict[int, torch.Tensor] = {}
        self._hooks = []

    def __enter__(self):
        for layer in sorted({h[0] for h in self.heads}):
            proj = self.decoder.layers[layer].encoder_attn.q_proj
            self._hooks.append(proj.register_forward_hook(self._keep(layer)))
        return self

    def _keep(self, layer):
        def hook(_module, _inputs, output):
            self.queries[layer] = output
        return hook

    def __exit__(self, *exc):
        for h in self._hooks:
            h.remove()

    def weights(self, encoder_states: torch.Tensor) -> torch.Tensor:
        """[B, heads, S, T] cross-attention weights of the recorded pass."""
        out = []
        for layer, head in self.heads:
            attn = self.decoder.layers[layer].encoder_attn
            d = attn.head_dim
            # Scaled before the product, as the model's own attention does.
            q = (self.queries[layer][..., head * d:(head + 1) * d] * attn.scaling).float()
            k = attn.k_proj(encoder_states)[..., head * d:(head + 1) * d].float()
            out.append(torch.softmax(q @ k.transpose(-1, -2), -1))
        return torch.stack(out, 1)


@torch.inference_mode()
def token_times(adapter, encoder_states: torch.Tensor, valid_frames: list[int], prompts: list[list[int]],
                tokens: list[list[int]], heads: list[tuple[int, int]], filter_width: int = 7) -> list[list[float]]:
    """Per row, the time (s from the segment's start) of each of ``tokens`` and one more
    for the end of the last token. One teacher-forced, left-padded pass over prompt +
    tokens: token i's row is the query at token i (as in a decode that ends with
    end-of-text, which is fed every token but the end)."""
    device = encoder_states.device
    seqs = [p + t for p, t in zip(prompts, tokens)]
    L = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), L), adapter.eot_id, dtype=torch.long, device=device)
    mask = torch.zeros_like(ids)
    for b, s in enumerate(seqs):
        ids[b, L - len(s):] = torch.tensor(s, device=device)
        mask[b, L - len(s):] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with CrossAttentionRecorder(adapter.model.model.decoder, heads) as rec:
        adapter.decoder_hidden(ids, encoder_states, None, mask, positions)
    weights = rec.weights(encoder_states)
    out = []
    for b, (prompt, toks) in enumerate(zip(prompts, tokens)):
        if not toks:
            out.append([0.0])
            continue
        first = L - len(seqs[b]) + len(prompt)  # the column of the first generated token
        w = weights[b, :, first:, :valid_frames[b]]
        w = (w - w.mean(-2, keepdim=True)) / w.std(-2, keepdim=True, unbiased=False)
        matrix = median_filter(w, filter_width).mean(0)
        rows, cols = dtw_path(-matrix.double().cpu().numpy())
        jumps = np.diff(rows, prepend=-1).astype(bool)
        times = (cols[jumps] * FRAME_S).tolist()
        out.append(times + [times[-1]])
    return out


def words_of(token_ids: list[int], times: list[float], decode, skip: set[int] | None = None) -> list[dict]:
    """[{word, start, end}] from tokens and their times (``times`` has one more entry than
    ``token_ids``: the end). A word starts at a token whose text begins with a space; its
    text is its tokens decoded together (a character may span tokens). Indices in
    ``skip`` (time tokens) belong to no word."""
    groups: list[list[int]] = []
    current = None
    for i, tok in enumerate(token_ids):
        if skip and i in skip:
            current = None
            continue
        if current is None or decode([tok]).startswith(" "):
            current = [i]
            groups.append(current)
        else:
            current.append(i)
    words = [{"word": decode([token_ids[i] for i in g]).strip(), "start": times[g[0]], "end": times[g[-1] + 1]}
             for g in groups]
    return [w for w in words if w["word"]]
