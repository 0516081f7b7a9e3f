"""Back-off graph tensors and the batched full-vocabulary ``advance`` of NGPU-LM, as
"FlexCTC: GPU-powered CTC Beam Decoding with advanced Contextual Abilities" describes it
(§II-D).

Both the n-gram LM and the phrase-boosting tree (GPU-PB, FlexCTC §III-B) are
weighted automata of one shape:

* states ``0..S-1``; every state either is a *root* or has a back-off arc
  (``backoff_to``, ``backoff_w``) to a shorter context, ending at a root in at most
  ``depth`` steps;
* explicit arcs ``(from, label) -> to`` with a weight, sorted by ``from * V + label``
  (CSR offsets ``arc_start`` per state);
* roots hold a dense row over the whole vocabulary (``root_w``, ``root_to`` [R, V]), so a
  lookup always ends there; ``root_row`` maps a state to the root its chain ends at.
  The LM has one root (the empty context); the boosting tree one per phrase list;
* ``final_w``: the end-of-sentence weight of each state, already resolved through its
  back-offs.

The score of label ``w`` from state ``s`` is the sum of back-off weights along the chain
``s = s_0, s_1, ... s_k`` plus the weight of the first arc ``(s_k, w)`` found (Katz
back-off). ``advance`` computes it for every label of N states at once: it fills the
[N, V] output from the roots, then overwrites it with the explicit arcs of each chain
level from the shortest context to the longest, so the longest context wins. The only
Python loop is over the ``depth`` levels; arcs of a level are gathered as one flat batch.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch

TENSOR_FIELDS = ("arc_key", "arc_label", "arc_w", "arc_to", "arc_start", "backoff_to",
                 "backoff_w", "final_w", "root_row", "is_root", "root_w", "root_to")


@dataclass
class BackoffGraph:
    vocab_size: int
    depth: int
    arc_key: torch.Tensor      # [A] int64, sorted: from * V + label
    arc_label: torch.Tensor    # [A] int32
    arc_w: torch.Tensor        # [A] float32
    arc_to: torch.Tensor       # [A] int32
    arc_start: torch.Tensor    # [S + 1] int64, CSR offsets into the arcs
    backoff_to: torch.Tensor   # [S] int32 (a root points to itself)
    backoff_w: torch.Tensor    # [S] float32 (0 at roots)
    final_w: torch.Tensor      # [S] float32
    root_row: torch.Tensor     # [S] int32, row of root_w/root_to the chain ends at
    is_root: torch.Tensor      # [S] bool
    root_w: torch.Tensor       # [R, V] float32
    root_to: torch.Tensor      # [R, V] int32

    @property
    def num_states(self) -> int:
        return int(self.backoff_to.numel())

    @property
    def device(self) -> torch.device:
        return self.arc_w.device

    def to(self, device) -> "BackoffGraph":
        kw = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in TENSOR_FIELDS:
            kw[name] = kw[name].to(device)
        return BackoffGraph(**kw)

    def tensors(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, name).contiguous() for name in TENSOR_FIELDS}

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors().values())

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor], vocab_size: int, depth: int) -> "BackoffGraph":
        return cls(vocab_size=vocab_size, depth=depth, **{n: tensors[n] for n in TENSOR_FIELDS})

    @classmethod
    def build(cls, *, vocab_size: int, depth: int, arcs_from, arcs_label, arcs_w, arcs_to,
              backoff_to, backoff_w, final_w, root_of, roots, root_w, root_to) -> "BackoffGraph":
        """Assemble from Python/numpy lists; sorts arcs and derives the CSR offsets.

        ``root_of[s]`` is the state id of the root that the chain of ``s`` ends at and
        ``roots`` the root state ids in the row order of ``root_w``/``root_to``.
        """
        num_states = len(backoff_to)
        frm = torch.as_tensor(arcs_from, dtype=torch.int64).reshape(-1)
        lab = torch.as_tensor(arcs_label, dtype=torch.int64).reshape(-1)
        key = frm * vocab_size + lab
        order = torch.argsort(key, stable=True)
        key = key[order]
        if key.numel() > 1 and bool((key[1:] == key[:-1]).any()):
            raise ValueError("duplicate arcs (same state and label)")
        counts = torch.bincount(frm, minlength=num_states)
        arc_start = torch.zeros(num_states + 1, dtype=torch.int64)
        arc_start[1:] = torch.cumsum(counts, 0)
        roots_t = torch.as_tensor(roots, dtype=torch.int64)
        row_of_root = torch.full((num_states,), -1, dtype=torch.int64)
        row_of_root[roots_t] = torch.arange(len(roots), dtype=torch.int64)
        is_root = torch.zeros(num_states, dtype=torch.bool)
        is_root[roots_t] = True
        if bool(counts[roots_t].any()):
            raise ValueError("roots keep their arcs in the dense root table, not as arcs")
        return cls(
            vocab_size=vocab_size, depth=depth, arc_key=key, arc_label=lab[order].to(torch.int32),
            arc_w=torch.as_tensor(arcs_w, dtype=torch.float32).reshape(-1)[order],
            arc_to=torch.as_tensor(arcs_to, dtype=torch.int64).reshape(-1)[order].to(torch.int32),
            arc_start=arc_start,
            backoff_to=torch.as_tensor(backoff_to, dtype=torch.int32),
            backoff_w=torch.as_tensor(backoff_w, dtype=torch.float32),
            final_w=torch.as_tensor(final_w, dtype=torch.float32),
            root_row=row_of_root[torch.as_tensor(root_of, dtype=torch.int64)].to(torch.int32),
            is_root=is_root,
            root_w=torch.as_tensor(root_w, dtype=torch.float32).reshape(len(roots), vocab_size),
            root_to=torch.as_tensor(root_to, dtype=torch.int32).reshape(len(roots), vocab_size),
        )

    # ----------------------------------------------------------------- queries
    def _chain(self, states: torch.Tensor):
        """Back-off chain levels: [(state_j, accumulated back-off before j)], total back-off."""
        levels = []
        cur = states
        acc = torch.zeros(states.shape, dtype=torch.float32, device=states.device)
        for _ in range(self.depth):
            levels.append((cur, acc))
            acc = acc + self.backoff_w[cur]
            cur = self.backoff_to[cur].long()
        return levels, acc

    def __post_init__(self) -> None:
        # Most explicit arcs leaving one state: sizes the padded path; read once, here,
        # so that no later call syncs with the device.
        counts = self.arc_start[1:] - self.arc_start[:-1]
        self.max_degree = int(counts.max()) if counts.numel() else 0

    def advance(self, states: torch.Tensor, sync_free: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Scores [N, V] (float32) and next states [N, V] (int64) for every label.

        Two equal implementations of the per-level arc scatter: the flat one gathers
        exactly the arcs of the N states (its size is data-dependent, so it reads one
        number back from the device per level); the sync-free one gathers a padded
        [N, max_degree] block per level, with no host sync, so a CUDA graph can capture
        it. Default: sync-free on CUDA, flat on CPU.
        """
        states = states.reshape(-1).to(self.device, torch.int64)
        n, v = states.numel(), self.vocab_size
        levels, acc_root = self._chain(states)
        rows = self.root_row[states]
        # One spare trailing element takes the padded path's masked-out writes.
        scores_buf = torch.empty(n * v + 1, dtype=torch.float32, device=states.device)
        next_buf = torch.empty(n * v + 1, dtype=torch.int64, device=states.device)
        scores, next_states = scores_buf[:-1].view(n, v), next_buf[:-1].view(n, v)
        torch.add(self.root_w[rows], acc_root[:, None], out=scores)
        next_states.copy_(self.root_to[rows])
        if sync_free is None:
            sync_free = states.device.type == "cuda"
        if self.arc_key.numel() == 0:
            return scores, next_states
        if sync_free:
            self._scatter_padded(levels, n, scores_buf, next_buf)
        else:
            self._scatter_flat(levels, n, scores_buf, next_buf)
        return scores, next_states

    def _scatter_padded(self, levels, n: int, flat_scores: torch.Tensor, flat_next: torch.Tensor) -> None:
        v, degree = self.vocab_size, self.max_degree
        offsets = torch.arange(degree, device=flat_scores.device)
        base = torch.arange(n, device=flat_scores.device)[:, None] * v
        for cur, acc in reversed(levels):
            start = self.arc_start[cur]
            valid = offsets[None, :] < (self.arc_start[cur + 1] - start)[:, None]
            arc = torch.where(valid, start[:, None] + offsets[None, :], 0)
            flat = torch.where(valid, base + self.arc_label[arc], n * v)
            flat_scores[flat.view(-1)] = (acc[:, None] + self.arc_w[arc]).view(-1)
            flat_next[flat.view(-1)] = self.arc_to[arc].view(-1).long()

    def _scatter_flat(self, levels, n: int, flat_scores: torch.Tensor, flat_next: torch.Tensor) -> None:
        v = self.vocab_size
        batch_index = torch.arange(n, device=flat_scores.device)
        for cur, acc in reversed(levels):
            start = self.arc_start[cur]
            counts = self.arc_start[cur + 1] - start
            total = int(counts.sum())
            if total == 0:
                continue
            row = torch.repeat_interleave(batch_index, counts, output_size=total)
            first = torch.cumsum(counts, 0) - counts
            arc = torch.arange(total, device=flat_scores.device) - first[row] + start[row]
            flat = row * v + self.arc_label[arc]
            flat_scores[flat] = acc[row] + self.arc_w[arc]
            flat_next[flat] = self.arc_to[arc].long()

    def advance_labels(self, states: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Score and next state of one given label per state (binary search in the arcs)."""
        states = states.to(self.device, torch.int64)
        labels = labels.to(self.device, torch.int64)
        levels, acc_root = self._chain(states)
        rows = self.root_row[states]
        scores = self.root_w[rows, labels] + acc_root
        next_states = self.root_to[rows, labels].long()
        num_arcs = self.arc_key.numel()
        if num_arcs == 0:
            return scores, next_states
        for cur, acc in reversed(levels):
            key = cur * self.vocab_size + labels
            pos = torch.searchsorted(self.arc_key, key).clamp_(max=num_arcs - 1)
            hit = self.arc_key[pos] == key
            scores = torch.where(hit, acc + self.arc_w[pos], scores)
            next_states = torch.where(hit, self.arc_to[pos].long(), next_states)
        return scores, next_states

    def final(self, states: torch.Tensor) -> torch.Tensor:
        return self.final_w[states.to(self.device, torch.int64)]

    def score_sequences(self, states: torch.Tensor, tokens: torch.Tensor, lengths: torch.Tensor,
                        eos: bool) -> torch.Tensor:
        """Per-token scores [B, L + 1] of padded sequences; column ``lengths[b]`` holds
        the end-of-sentence score when ``eos`` (0 otherwise), padding is 0."""
        tokens = tokens.to(self.device, torch.int64)
        lengths = lengths.to(self.device, torch.int64)
        b, length = tokens.shape
        out = torch.zeros(b, length + 1, dtype=torch.float32, device=self.device)
        state = states.to(self.device, torch.int64)
        for t in range(length):
            valid = t < lengths
            score, nxt = self.advance_labels(state, tokens[:, t].clamp(0, self.vocab_size - 1))
            out[:, t] = torch.where(valid, score, out[:, t])
            state = torch.where(valid, nxt, state)
        if eos:
            out.scatter_(1, lengths[:, None], self.final(state)[:, None])
        return out


class GraphScorer:
    """The decoder-facing API shared by the n-gram LM and the boosting tree."""

    graph: BackoffGraph

    @property
    def vocab_size(self) -> int:
        return self.graph.vocab_size

    @property
    def device(self) -> torch.device:
        return self.graph.device

    def advance(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Natural-log scores (LM) or bonuses (boosting) [N, V] of every next token, and
        the next states [N, V] (int64)."""
        return self.graph.advance(states)

    def advance_labels(self, states: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Score and next state of one token per state (for decoders that only need emitted ones)."""
        return self.graph.advance_labels(states, labels)

    def final(self, states: torch.Tensor) -> torch.Tensor:
        """End-of-sentence score of each state."""
        return self.graph.final(states)
