"""Packed verification (beyond "Self-Speculative Decoding for LLM-based ASR with CTC Encoder Drafts"): eq. 5 for every clip of a packed encoder window
in one teacher-forced decoder pass over that window.

SSD's packed gate (pipeline.kinds.ssd.stages) drafts short clips on shared 30-s windows. The
decoder cannot check one clip against a shared window, since it reads all of it, but it
can check the window: the drafts of its clips, in the order they sit in the window, are
one transcript of the window. The pass scores every token of that joined transcript; clip
k is accepted when

- its draft is non-empty and each of its tokens has probability > tau (eq. 5), and
- the most likely token after its last one is the next token of the joined transcript
  (the next clip's first token, end-of-text after the window's last clip): eq. 5's
  completeness check, per clip, so a draft that drops the end of its clip fails.

Greedy decoding's suppress masks apply, and the begin-suppress set at the window's first
token. Clips whose drafts would push the joined transcript past the decoder's positions
are not scored (not accepted). The drafts before a clip are its context, right or wrong:
a wrong draft can make a later, similar error look likely, which is one reason the
threshold is a preset's choice and not fixed here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ...models.base import ARDecoderModel


@dataclass
class PackedVerification:
    accepted: torch.Tensor   # [N] bool, per clip
    min_prob: torch.Tensor   # [N] min draft-token probability (1.0 where nothing was scored)
    scored: torch.Tensor     # [N] bool: the clip's draft was part of a scored window


def joined_transcript(prompt: list[int], clips: list[int], drafts: list[list[int]],
                      max_positions: int) -> tuple[list[int], list[tuple[int, int, int]]]:
    """One window's prompt plus its clips' drafts in order, and per clip its (clip, first,
    end) columns; a clip that would not fit in ``max_positions`` (one column is kept for
    the token after the last draft) is left out with the clips after it. The last clip
    that fits is then checked against end-of-text although speech follows it, so it is
    usually rejected: conservative (it costs speed, not accuracy)."""
    seq, span = list(prompt), []
    for i in clips:
        if len(seq) + len(drafts[i]) + 1 > max_positions:
            break
        span.append((i, len(seq), len(seq) + len(drafts[i])))
        seq += drafts[i]
    return seq, span


@torch.inference_mode()
def verify_packed_drafts(adapter: ARDecoderModel, window_states: torch.Tensor, windows: list[list[int]],
                         drafts: list[list[int]], tau: float) -> PackedVerification:
    """``windows[w]``: the clip indices in window ``w`` (``window_states[w]``), in window
    order; ``drafts[i]``: clip i's draft in decoder tokens."""
    device = window_states.device
    n = len(drafts)
    accepted = torch.zeros(n, dtype=torch.bool, device=device)
    min_prob = torch.ones(n, device=device)
    scored = torch.zeros(n, dtype=torch.bool, device=device)
    if not windows:
        return PackedVerification(accepted, min_prob, scored)
    prompts = adapter.batch_prompts(window_states)
    eot = adapter.eot_id
    seqs, spans = zip(*(joined_transcript(prompts[w], clips, drafts, adapter.max_positions)
                        for w, clips in enumerate(windows)))
    L = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), L), eot, dtype=torch.long, device=device)
    mask = torch.zeros((len(seqs), L), dtype=torch.long, device=device)
    for w, s in enumerate(seqs):
        ids[w, :len(s)] = torch.tensor(s, dtype=torch.long, device=device)
        mask[w, :len(s)] = 1
    positions = torch.arange(L, device=device).unsqueeze(0).expand(len(seqs), -1)
    hidden, _ = adapter.decoder_hidden(ids, window_states, None, mask, positions)
    for w, (seq, span) in enumerate(zip(seqs, spans)):
        if not span:
            continue
        P = len(prompts[w])
        # Column c predicts token c + 1: from the prompt's last column to the last draft's.
        logits = adapter.logits(hidden[w, P - 1:len(seq)])
        logits.masked_fill_(adapter.suppress_mask, float("-inf"))
        if adapter.begin_suppress_ids.numel():
            logits[0, adapter.begin_suppress_ids] = float("-inf")
        targets = torch.tensor(seq[P:] + [eot], dtype=torch.long, device=device)
        probs = logits.log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1).exp()
        best = logits.argmax(-1)
        for i, first, end in span:
            scored[i] = True
            if end == first:
                continue
            p = probs[first - P:end - P]
            min_prob[i] = p.min()
            accepted[i] = bool((p > tau).all()) and int(best[end - P]) == int(targets[end - P])
    return PackedVerification(accepted, min_prob, scored)
