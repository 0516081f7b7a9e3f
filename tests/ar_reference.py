"""An independent greedy-decoding reference for the SSD fallback tests: no KV cache, no
batching, no padding; the decoder runs over the whole sequence (prompt + forced prefix +
tokens so far) at every step."""
from __future__ import annotations

import torch


@torch.inference_mode()
def uncached_greedy(adapter, states: torch.Tensor, prefix: list[int], max_new_tokens: int = 224) -> list[int]:
    """Greedy tokens after ``prefix`` for ONE row (``states`` [1, T, D]), end-of-text
    excluded: the suppress mask on every step, the begin-suppress ids only while the
    transcript is empty (a non-empty forced prefix is text already decided); at most
    ``max_new_tokens`` tokens and never past the decoder's position limit."""
    seq = list(adapter.prompt_ids) + list(prefix)
    limit = min(max_new_tokens, adapter.max_positions - len(seq))
    out: list[int] = []
    while len(out) < limit:
        hidden, _ = adapter.decoder_hidden(torch.tensor([seq]), states, None, None, None)
        logits = adapter.logits(hidden[:, -1])[0]
        logits[adapter.suppress_mask] = float("-inf")
        if not prefix and not out and adapter.begin_suppress_ids.numel():
            logits[adapter.begin_suppress_ids] = float("-inf")
        tok = int(logits.argmax())
        if tok == adapter.eot_id:
            break
        out.append(tok)
        seq.append(tok)
    return out


@torch.inference_mode()
def next_token_probs(adapter, states: torch.Tensor, prefix: list[int]) -> torch.Tensor:
    """The decoder's distribution after prompt + ``prefix`` (suppress masks applied)."""
    seq = list(adapter.prompt_ids) + list(prefix)
    hidden, _ = adapter.decoder_hidden(torch.tensor([seq]), states, None, None, None)
    logits = adapter.logits(hidden[:, -1])[0]
    logits[adapter.suppress_mask] = float("-inf")
    if not prefix and adapter.begin_suppress_ids.numel():
        logits[adapter.begin_suppress_ids] = float("-inf")
    return logits.softmax(-1)
