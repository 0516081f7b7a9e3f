"""Drafters of greedy decoding: speculative rounds over CTC drafts ("Self-Speculative Decoding for LLM-based ASR with CTC Encoder Drafts", after eq. 6) and token-map drafting.

Token-map drafting is §III-A of "Model-free Speculative Decoding for Transformer-based ASR
with Token Map Drafting".

A drafter is the strategy ``greedy_decode`` (pipeline.decoding.ar.greedy) runs each pass
after the first with: what the alive rows feed beside their newest decided token, and how
the guesses are verified. All three keep the output plain greedy decoding's token for token
(except ``CTCLookahead``'s ``accept_prob`` rule, by design):

- ``NoDrafter`` (``NO_DRAFT``): each pass feeds the decided token alone (plain greedy).
- ``CTCLookahead``: speculative decoding with greedy verification, the CTC draft as the
  proposal source. After its first token a row feeds, with each decided token, up to K
  guesses read from its draft where ``draft_sync`` says the decoder now is, all in one
  pass. Guesses are kept up to the first one that is not the decoder's argmax (or, with
  ``accept_prob``, whose probability is not above it); the argmax there is the round's next
  decided token, so every round decides at least one token and, under the argmax rule,
  exactly the tokens plain greedy decoding decides. Rows keep different numbers of
  guesses, so rejected guesses are not cut out of the batched cache: they stay masked out
  (zero attention mask), and positions count only kept tokens.
- ``TokenMapDrafter``: after its first token a row looks up up to K continuations of its
  last N..1 decided tokens in a token map (pipeline.decoding.drafting.token_map), plus, with a
  ``CTCLookahead`` (SSD's fallback), the rest of its CTC draft. All rows' candidates go
  through the decoder in one pass as candidate trees over the KV cache
  (pipeline.decoding.drafting.draft_tree: a 4D attention mask lets each node see the past and its
  ancestors only); each row keeps the longest candidate prefix that is its own argmax,
  then the correction token. Nodes off the kept path stay in the cache, masked out, as
  rejected guesses do above. A policy (pipeline.decoding.drafting.token_map_policy) may switch
  drafting off pass by pass where it does not pay. The map may grow from the decoder's
  own committed transcripts (``learn``; pipeline.decoding.drafting.token_map_online).

The common interface: ``feeds_guesses`` (whether the drafter feeds guesses; they are
verified under the adapter's own token rules only), ``start(rows)`` before a call's first pass (it
checks the drafter against the batch and resets its per-call state) and ``step(d)``, one
pass over the alive rows of ``d`` (ar_greedy.DecodeState), whose newest decided tokens
(``d.next_tok``) are committed already: it feeds them, commits the accepted guesses to
``d.generated`` and leaves the next decided tokens, positions, mask and cache in ``d``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import torch

from .draft_sync import advance, proposal
from .draft_tree import build_trees, kept_columns, tree_inputs, walk_trees
from ...models.screened_argmax import greedy_tokens
from ...timing import synchronize

if TYPE_CHECKING:
    from ...models.base import ARDecoderModel

# Guess positions per chunk of a speculative round's output projection.
LOOKAHEAD_CHUNK = 4


class NoDrafter:
    """Plain greedy decoding: each pass feeds each row's decided token alone."""
    feeds_guesses = False

    def start(self, rows: int) -> None:
        pass

    def step(self, d) -> None:
        d.plain_step()


NO_DRAFT = NoDrafter()


@dataclass
class CTCLookahead:
    """Speculative rounds over each row's CTC draft in decoder tokens (``drafts``, one per
    row; see the module docstring): up to ``lookahead`` guesses per row and pass, read from
    the draft from ``starts[row]`` on (the row's draft position after its prefix; default
    0). ``accept_prob``: keep a guess whose probability is above it (SSD's tau_slm rule)
    instead of exactly the argmax. Holds its rows' places in their drafts: one per call."""
    drafts: list[list[int]]
    starts: list[int] | None = None
    lookahead: int = 4
    accept_prob: float | None = None
    verify_chunk: int = LOOKAHEAD_CHUNK
    ptrs: list[int] = field(default_factory=list, init=False, repr=False)
    feeds_guesses = True

    def __post_init__(self):
        if self.lookahead < 1:
            raise ValueError(f"lookahead must be >= 1, got {self.lookahead} (no lookahead: NO_DRAFT)")

    def start(self, rows: int) -> None:
        if len(self.drafts) != rows:
            raise ValueError("one draft per row")
        self.ptrs = list(self.starts) if self.starts is not None else [0] * rows

    def advance(self, d) -> None:
        """Each alive row's draft position after its newest committed token."""
        for r in d.alive:
            self.ptrs[r] = _advance_last(self.drafts[r], self.ptrs[r], d.prefixes[r], d.generated[r])

    def guess(self, r: int, room: int) -> list[int]:
        """Row ``r``'s next guesses: at most ``room`` tokens (and ``lookahead``)."""
        return proposal(self.drafts[r], self.ptrs[r], min(self.lookahead, room))

    def step(self, d) -> None:
        self.advance(d)
        # A guess never takes a row past its token limit (the decided token after the
        # guesses counts too), so the output is plain greedy's, truncated alike.
        guesses = [self.guess(r, d.room(r)) for r in d.alive]
        width = 1 + max(len(g) for g in guesses)
        if width == 1:
            d.plain_step()
            kept_sum = 0
        else:
            kept_sum = self._round(d, guesses, width)
        if d.timer is not None:
            d.timer["rounds"] = d.timer.get("rounds", 0) + len(d.alive)
            d.timer["guessed"] = d.timer.get("guessed", 0) + sum(len(g) for g in guesses)
            d.timer["kept"] = d.timer.get("kept", 0) + kept_sum

    def _round(self, d, guesses: list[list[int]], width: int) -> int:
        """One pass over (decided token, guesses) per row; returns the guesses kept."""
        A, device, eot = len(d.alive), d.next_tok.device, d.adapter.eot_id
        step_mask = torch.ones((A, width), dtype=torch.long, device=device)
        pad = torch.full((A, width - 1), eot, dtype=torch.long, device=device)
        for n, g in enumerate(guesses):
            if g:
                pad[n, :len(g)] = torch.tensor(g, device=device)
            step_mask[n, 1 + len(g):] = 0
        step_ids = torch.cat([d.next_tok.unsqueeze(-1), pad], 1)
        hidden = d.forward(step_ids, torch.cat([d.mask, step_mask], 1), d.pos + torch.arange(width, device=device))
        d.next_tok, kept = _verify_guesses(d.adapter, hidden, step_ids[:, 1:], [len(g) for g in guesses],
                                           self.verify_chunk, self.accept_prob)
        for n, (r, k) in enumerate(zip(d.alive, kept.tolist())):
            if k:
                d.generated[r].extend(guesses[n][:k])
                self.ptrs[r] += k
        # Rejected guesses stay in the cache, masked out; positions count kept tokens only.
        step_mask = (torch.arange(width, device=device) <= kept.unsqueeze(-1)).long()
        d.pos = d.pos + 1 + kept.unsqueeze(-1)
        d.mask = torch.cat([d.mask, step_mask], 1)
        return int(kept.sum())


@dataclass
class TokenMapDrafter:
    """Token-map drafting (see the module docstring): up to ``candidates`` continuations of
    at most ``max_draft`` tokens per row and pass, from ``token_map``
    (pipeline.decoding.drafting.token_map.TokenMap) and, with ``lookahead`` (a ``CTCLookahead``,
    greedy rule only: :meth:`with_lookahead`), from the CTC draft as one more candidate
    (``map_first``: the map's candidates rank first). ``policy``
    (pipeline.decoding.drafting.token_map_policy.DraftPolicy, kept across calls) decides pass by pass
    whether drafting pays; None drafts on every pass. ``totals``: the counts ``greedy_decode``
    keeps in its ``timer`` ("tm_*"), over every call (shared with :meth:`with_lookahead`'s
    copies)."""
    token_map: object
    candidates: int = 2
    max_draft: int = 8
    policy: object = None
    map_first: bool = True
    lookahead: CTCLookahead | None = None
    totals: dict = field(default_factory=dict, repr=False)
    feeds_guesses = True

    def with_lookahead(self, lookahead: CTCLookahead | None) -> "TokenMapDrafter":
        """This drafter (same map, same policy object) with the CTC drafts of one call."""
        if lookahead is not None and lookahead.accept_prob is not None:
            raise ValueError("token-map drafting verifies greedily: it cannot join an accept_prob rule")
        return replace(self, lookahead=lookahead)

    def learn(self, sequences: list[list[int]]) -> None:
        """The transcripts a call committed (token sequences, end-of-text excluded): an
        online map (pipeline.decoding.drafting.token_map_online) grows from them, so the next calls
        draft from them; a fixed map ignores them."""
        learn = getattr(self.token_map, "learn", None)
        if learn is not None:
            learn(sequences)

    def propose(self, history: list[int], room: int, eot: int, draft: list[int] | None) -> list[list[int]]:
        size = min(self.max_draft, room)
        if size <= 0:
            return []
        cands = self.token_map.candidates(history, self.candidates, size, eot)
        if draft:
            cands = cands + [draft] if self.map_first else [draft] + cands
            unique = []
            for c in cands:
                if c not in unique:
                    unique.append(c)
            cands = unique[:self.candidates]
        return cands

    def start(self, rows: int) -> None:
        if self.lookahead is not None:
            self.lookahead.start(rows)

    def step(self, d) -> None:
        """One pass over the alive rows: feed each row's candidate tree (or, where no row has
        a candidate or the policy says it does not pay, the decided token alone) and commit
        the accepted drafts."""
        ctc = self.lookahead
        if ctc is not None:
            ctc.advance(d)
        clock = self.policy.clock if self.policy is not None else time.perf_counter
        t0 = clock()
        device, eot, timer = d.next_tok.device, d.adapter.eot_id, d.timer
        draft_now = self.policy is None or self.policy.should_draft()
        cands = [[] for _ in d.alive]
        if draft_now:
            for n, r in enumerate(d.alive):
                room = d.room(r)
                own = ctc.guess(r, room) if ctc is not None else None
                cands[n] = self.propose(d.history(r), room, eot, own)
        A = len(d.alive)
        if not any(cands):
            d.plain_step()
            if self.policy is not None:
                synchronize(d.next_tok)  # a drafting pass waits for its tokens on the host too
                self.policy.observe(False, clock() - t0, A, A)
            for counts in (timer, self.totals):
                if counts is not None:
                    counts["tm_plain_passes"] = counts.get("tm_plain_passes", 0) + 1
            return
        trees = build_trees(d.next_tok.tolist(), cands)
        ids, mask4, step_pos, _ = tree_inputs(trees, d.mask, d.pos, eot, d.adapter.dtype)
        hidden = d.forward(ids, mask4, step_pos)
        paths, nxt, ends = walk_trees(d.adapter, hidden, trees, eot)
        for n, r in enumerate(d.alive):
            for tok in paths[n]:
                d.generated[r].append(tok)
                if ctc is not None:
                    ctc.ptrs[r] = _advance_last(ctc.drafts[r], ctc.ptrs[r], d.prefixes[r], d.generated[r])
        kept = torch.tensor([len(p) for p in paths], device=device)
        accepted = sum(len(p) for p in paths)
        if self.policy is not None:
            self.policy.observe(True, clock() - t0, A, A + accepted)
        added = {"tm_passes": 1, "tm_rounds": sum(1 for c in cands if c), "tm_drafted": trees.drafted,
                 "tm_accepted": accepted}
        for counts in (timer, self.totals):
            if counts is not None:
                for name, n in added.items():
                    counts[name] = counts.get(name, 0) + n
        # Nodes off the accepted paths stay in the cache, masked out; positions count kept tokens.
        d.next_tok = torch.tensor(nxt, dtype=torch.long, device=device)
        d.pos = d.pos + 1 + kept.unsqueeze(-1)
        d.mask = torch.cat([d.mask, kept_columns(trees, ends, device)], 1)


def _advance_last(draft: list[int], ptr: int, prefix: list[int], generated: list[int]) -> int:
    """The draft pointer after the newest committed token (pipeline.decoding.drafting.draft_sync)."""
    prev = generated[-2] if len(generated) > 1 else (prefix[-1] if prefix else None)
    return advance(draft, ptr, generated[-1], prev)


def _verify_guesses(adapter: ARDecoderModel, hidden: torch.Tensor, guesses: torch.Tensor, sizes: list[int], chunk: int,
                    accept_prob: float | None = None):
    """Greedy verification of a speculative round. ``hidden`` [A, 1+G, D] holds the pass
    over (decided token, guesses); position i predicts what follows input i. Returns the
    decoder's token after the longest run of guesses it agrees with, and that run's
    length ([A] tensor), per row. The output projection runs over chunks of positions and stops for a
    row at its first disagreement (most guesses after an error fail early)."""
    A, width = hidden.shape[0], hidden.shape[1]
    # Position i checks guess i; the last position (after every guess) has none.
    targets = torch.cat([guesses, guesses.new_zeros((A, 1))], 1)
    size = torch.tensor(sizes, device=hidden.device)
    kept = size.clone()
    next_tok = torch.zeros(A, dtype=torch.long, device=hidden.device)
    alive = torch.arange(A, device=hidden.device)
    for c0 in range(0, width, chunk):
        if alive.numel() == 0:
            break
        c1 = min(c0 + chunk, width)
        part = hidden[alive, c0:c1]
        cols = torch.arange(c0, c1, device=hidden.device)
        in_guess = cols.unsqueeze(0) < size[alive].unsqueeze(1)
        target = targets[alive, c0:c1]
        if accept_prob is None:
            pred = greedy_tokens(adapter, part.reshape(-1, part.shape[-1])).view(part.shape[:2])   # [a, c]
            miss = (pred != target) | ~in_guess
        else:
            logits = adapter.logits(part)
            logits.masked_fill_(adapter.suppress_mask, float("-inf"))
            pred = logits.argmax(-1)
            p = logits.log_softmax(-1).gather(-1, target.unsqueeze(-1)).squeeze(-1).exp()
            miss = (p <= accept_prob) | ~in_guess
        has_miss = miss.any(1)
        at = miss.float().argmax(1)
        rows = has_miss.nonzero().squeeze(-1)
        kept[alive[rows]] = at[rows] + c0
        next_tok[alive[rows]] = pred[rows, at[rows]]
        alive = alive[~has_miss]
    return next_tok, kept
