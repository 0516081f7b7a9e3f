"""Batched greedy autoregressive decoding with a KV cache (the AR baseline; SSD eq. 6).

Every row may start from its own forced prefix (SSD resumes from the verified prefix j),
and may have its own prompt (``adapter.batch_prompts``: granite-speech puts one audio
token per audio embedding in it; Whisper's is fixed), so rows are left-padded to a
common length with an attention mask and explicit positions. The begin-suppress rule
(no blank / end-of-text as the first token) applies only where a row's transcript is
still empty, i.e. not after a non-empty forced prefix: a prefix is text already decided,
so the next token is not the transcript's first.
Finished rows leave the batch (their cache rows are dropped), so the tail of a batch
costs only what its unfinished rows need; after the first drop, later ones move only the
rows past the new end into the freed places (see ``_move_rows``).

Seeded start (SSD eqs. 6-7, "reuse the verification pass's KV cache, cropped to the
prefix"): instead of a prefill over prompt + prefix, rows may start from a ``DecodeSeed``
taken from the verification pass: the self-attention K/V of prompt + prefix, the greedy
token after the prefix, and (Whisper, in-process) the cross-attention K/V. The seeds'
K/V are merged into the same left-padded layout the prefill would build (zeros under a
zero mask on the padding), at the same positions, so the continuation is the one greedy
decoding forced with the prefix produces.

Drafting: each pass after the first runs the call's drafter (pipeline.decoding.drafting.drafters),
the strategy that decides what a row feeds beside its decided token and how the guesses
are verified: none (plain greedy), speculative rounds over a CTC draft, or token-map
drafting (with the CTC draft as one more candidate in SSD's fallback). Under greedy
verification every drafter's output is plain greedy decoding's, token for token.

Static KV cache (``static``, decoder.use_cuda_graphs): after the prefill (or the seeds)
a plain greedy call may continue in pipeline.decoding.ar.static instead of this loop:
preallocated K/V buffers, end-of-text as a mask, the step replayed as a CUDA graph on a
GPU; the same tokens. Drafting and logit edits stay here.

Token rules (``TokenRules``): which tokens a step may not emit: the adapter's suppressed
tokens on every step, its begin-suppressed ones on a row's first token, and optional
edits that depend on what each row has generated so far (Whisper's timestamp rules, plain
steps only, not with drafting).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch

from .static import runs_static
from ..drafting.drafters import NO_DRAFT
from ...models.screened_argmax import greedy_tokens
from ...models.kv_cache import cache_of

if TYPE_CHECKING:
    from ...models.base import ARDecoderModel


@dataclass
class DecodeSeed:
    """One row's decoder state after prompt + prefix, taken from another pass."""
    self_kv: list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [H, S, d]; S = prompt + prefix
    next_token: int                                   # greedy token after the prefix (masks applied)
    encoder_decoder: bool = True                      # Whisper-style cache (self + cross attention)
    # The batched cross-attention K/V of the pass the seed comes from (per layer
    # [B, H, T, d]; None: the fallback recomputes them) and this row's index in it. Seeds of
    # one source batch are re-batched with one index_select, or none at all when they are
    # that whole batch in order (the cross K/V are ~18 MB per Whisper tiny row).
    cross_source: list[tuple[torch.Tensor, torch.Tensor]] | None = None
    cross_row: int = 0

    @property
    def length(self) -> int:
        return int(self.self_kv[0][0].shape[-2])

    @property
    def cross_kv(self) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
        """This row's cross-attention K/V per layer [H, T, d] (views), or None."""
        if self.cross_source is None:
            return None
        return [(k[self.cross_row], v[self.cross_row]) for k, v in self.cross_source]


def seeds_from_cache(cache, rows: list[int], starts: list[int], ends: list[int], next_tokens: list[int],
                     with_cross: bool = True) -> list[DecodeSeed]:
    """Seeds for batch rows ``rows`` of a batched decoder cache: row rows[n]'s
    self-attention K/V cropped to columns [starts[n], ends[n]) (prompt + verified prefix);
    its cross-attention K/V as is."""
    from transformers.cache_utils import EncoderDecoderCache

    enc_dec = isinstance(cache, EncoderDecoderCache)
    self_cache = cache.self_attention_cache if enc_dec else cache
    cross = cache.cross_attention_cache if enc_dec and with_cross else None
    source = [(layer.keys, layer.values) for layer in cross.layers] if cross is not None and \
        len(cross.layers) else None
    seeds = []
    for b, s, e, tok in zip(rows, starts, ends, next_tokens):
        kv = [(layer.keys[b, :, s:e], layer.values[b, :, s:e]) for layer in self_cache.layers]
        seeds.append(DecodeSeed(self_kv=kv, next_token=int(tok), encoder_decoder=enc_dec,
                                cross_source=source, cross_row=b))
    return seeds


def _cross_layers(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A decoder cache's cross-attention K/V per layer, or [] where it has none."""
    from transformers.cache_utils import EncoderDecoderCache

    if not isinstance(cache, EncoderDecoderCache):
        return []
    layers = [(layer.keys, layer.values) for layer in cache.cross_attention_cache.layers]
    if not layers or any(k is None or not k.numel() for k, _ in layers):
        return []      # not projected yet
    return layers


def _project_cross(adapter: ARDecoderModel, encoder_states: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every row's cross-attention K/V per layer, from one throwaway decoder step over a
    scratch cache (its self-attention entry is dropped with it)."""
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache

    B, device = encoder_states.shape[0], encoder_states.device
    ids = torch.full((B, 1), adapter.eot_id, dtype=torch.long, device=device)
    scratch = EncoderDecoderCache(DynamicCache(), DynamicCache())
    _, scratch = adapter.decoder_hidden(ids, encoder_states, scratch, torch.ones((B, 1), dtype=torch.long,
                                                                                  device=device),
                                        torch.zeros((B, 1), dtype=torch.long, device=device))
    return _cross_layers(scratch)


def _cross_kv(seeds: list[DecodeSeed]):
    """The seeds' cross-attention K/V as one batch, and whether it is a copy of this call's
    own (else it is the tensors of the batch the seeds came from)."""
    src = seeds[0].cross_source
    if src is not None and all(sd.cross_source is src for sd in seeds):
        rows = [sd.cross_row for sd in seeds]
        if rows == list(range(src[0][0].shape[0])):
            return src, False  # the source batch itself: nothing to copy
        idx = torch.tensor(rows, device=src[0][0].device)
        return [(k.index_select(0, idx), v.index_select(0, idx)) for k, v in src], True
    per_row = [sd.cross_kv for sd in seeds]
    return [(torch.stack([kv[li][0] for kv in per_row]), torch.stack([kv[li][1] for kv in per_row]))
            for li in range(len(per_row[0]))], True


def _seeded_cache(seeds: list[DecodeSeed], L: int, cross: list | None = None):
    """The left-padded batch cache of ``seeds`` (row b at columns [L - S_b, L)), and whether
    every tensor in it is this call's own; its cross-attention K/V: ``cross`` if given
    (the caller's own), else the seeds' own where they carry them (copied out of their
    batch, unless they are all of it, in order), else none yet (the first step projects
    them)."""
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache

    layers = []
    for li in range(len(seeds[0].self_kv)):
        k0 = seeds[0].self_kv[li][0]
        H, d = k0.shape[0], k0.shape[-1]
        keys = k0.new_zeros((len(seeds), H, L, d))
        values = torch.zeros_like(keys)
        for b, seed in enumerate(seeds):
            k, v = seed.self_kv[li]
            keys[b, :, L - k.shape[-2]:] = k
            values[b, :, L - v.shape[-2]:] = v
        layers.append((keys, values))
    self_cache = cache_of(layers)
    if not seeds[0].encoder_decoder:
        return self_cache, True
    own = True
    if cross is None and all(s.cross_source is not None for s in seeds):
        cross, own = _cross_kv(seeds)
    # without any, the first step computes them from the encoder states
    return EncoderDecoderCache(self_cache, cache_of(cross) if cross else DynamicCache()), own


@dataclass
class TokenRules:
    """The per-step token rules of greedy decoding: a step never emits a token of
    ``suppress_mask`` ([V] bool), a row whose transcript is still empty (no forced prefix)
    never starts it with one of ``begin_suppress_ids``, and ``edit(logits, histories)``,
    where given, edits each step's masked logits [A, V] in place from what each row holds
    so far (prefix + generated tokens; Whisper's timestamp rules,
    pipeline.models.whisper.prompting). :meth:`of` gives an adapter's own."""
    suppress_mask: torch.Tensor
    begin_suppress_ids: torch.Tensor
    edit: Callable[[torch.Tensor, list[list[int]]], None] | None = None

    @classmethod
    def of(cls, adapter: ARDecoderModel, edit: Callable | None = None) -> "TokenRules":
        """The adapter's suppressed and begin-suppressed tokens, and ``edit``."""
        return cls(adapter.suppress_mask, adapter.begin_suppress_ids, edit)

    def plain_for(self, adapter: ARDecoderModel) -> bool:
        """Whether these are the adapter's own masks with no edit: the rules drafted steps
        verify under, and that its screened argmax (``adapter.next_tokens``) applies."""
        return self.edit is None and self.suppress_mask is adapter.suppress_mask

    def first_tokens(self, adapter: ARDecoderModel, hidden: torch.Tensor, empty: torch.Tensor,
                     histories: list[list[int]]) -> torch.Tensor:
        """The first step's tokens (``hidden`` [B, D]; ``empty`` [B] bool: rows with no
        prefix), always from the full logits."""
        logits = adapter.logits(hidden)
        logits.masked_fill_(self.suppress_mask, float("-inf"))
        if self.begin_suppress_ids.numel():
            rows = empty.nonzero().squeeze(-1)
            if rows.numel():
                logits[rows.unsqueeze(-1), self.begin_suppress_ids] = float("-inf")
        if self.edit is not None:
            self.edit(logits, histories)
        return logits.argmax(-1)

    def next_tokens(self, adapter: ARDecoderModel, hidden: torch.Tensor,
                    histories: Callable[[], list[list[int]]]) -> torch.Tensor:
        """A later step's tokens (``hidden`` [A, D]): through the adapter's screened argmax
        where the rules are its own (no logits; pipeline.models.screened_argmax), else the
        argmax of the masked logits, edited first from ``histories()`` where ``edit``."""
        if self.plain_for(adapter):
            return greedy_tokens(adapter, hidden)
        logits = adapter.logits(hidden)
        logits.masked_fill_(self.suppress_mask, float("-inf"))
        if self.edit is not None:
            self.edit(logits, histories())
        return logits.argmax(-1)


@dataclass
class DecodeState:
    """A greedy decoding's alive rows between passes, as drafters (pipeline.decoding.drafting.drafters)
    see them: position n holds call row ``alive[n]``, whose newest decided token is
    ``next_tok[n]``; ``mask`` [A, columns] and ``pos`` [A, 1] (the next position) describe
    the decoder ``cache``. ``generated[r]`` are call row r's committed tokens after its
    ``prefixes[r]``, at most ``limit``."""
    adapter: object
    rules: TokenRules
    enc: torch.Tensor
    cache: object
    mask: torch.Tensor
    pos: torch.Tensor
    next_tok: torch.Tensor
    alive: list[int]
    prefixes: list[list[int]]
    generated: list[list[int]]
    limit: int
    timer: dict | None = None

    def history(self, r: int) -> list[int]:
        return self.prefixes[r] + self.generated[r]

    def room(self, r: int) -> int:
        """Guesses row r may still take: its decided token after them counts too."""
        return self.limit - len(self.generated[r]) - 1

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One decoder pass over ``ids`` [A, W] on the cache (which it grows); hidden states."""
        hidden, self.cache = self.adapter.decoder_hidden(ids, self.enc, self.cache, attention_mask, positions)
        return hidden

    def plain_step(self) -> None:
        """Feed each row's decided token alone; the next decided tokens under the rules."""
        step_mask = torch.ones_like(self.pos)
        hidden = self.forward(self.next_tok.unsqueeze(-1), torch.cat([self.mask, step_mask], 1), self.pos)
        self.next_tok = self.rules.next_tokens(self.adapter, hidden[:, -1],
                                               lambda: [self.history(r) for r in self.alive])
        self.pos = self.pos + 1
        self.mask = torch.cat([self.mask, step_mask], 1)


@torch.inference_mode()
def greedy_decode(adapter: ARDecoderModel, encoder_states: torch.Tensor, prefixes: list[list[int]] | None = None,
                  max_new_tokens: int = 224, *, prompts: list[list[int]] | None = None,
                  seeds: list[DecodeSeed] | None = None, drafter=NO_DRAFT, rules: TokenRules | None = None,
                  cross_out: list | None = None, timer: dict | None = None, static=None) -> list[list[int]]:
    """Return, per row, the generated tokens after its prefix (end-of-text excluded).

    ``prompts`` (one per row) replace ``adapter.batch_prompts`` (Whisper's detected
    languages). With ``seeds`` (one per row, each for that row's prompt + prefix), the
    prefill pass is skipped: the first token is the seed's, the cache starts from the
    seeds' K/V. ``drafter`` (pipeline.decoding.drafting.drafters: ``NO_DRAFT``, ``CTCLookahead``,
    ``TokenMapDrafter``) runs every pass after the first (see the module docstring).
    ``rules`` (default: the adapter's own, ``TokenRules.of(adapter)``) say which tokens each
    step may not emit; a drafter that feeds guesses takes the adapter's own only.
    ``cross_out`` (a list): filled with the cross-attention K/V the decoding used, per layer
    ([B, H, T, d], every row in call order), for a later pass over the same rows
    (pipeline.models.kv_cache.cross_attention_cache); left empty for a decoder without them. Seeds without
    them (from another process) get them projected before the first step, for every row.
    ``timer`` (benchmarks) accumulates seconds under "prefill" (the first step) and "decode"
    (the rest); each step already waits for its tokens on the host. Drafters add counts:
    "rounds", "guessed" and "kept" (CTCLookahead), "tm_rounds" (row-steps with a
    candidate), "tm_drafted" (draft tokens fed), "tm_accepted", "tm_passes" and
    "tm_plain_passes" (TokenMapDrafter).
    ``static`` (pipeline.decoding.ar.graphs.StaticDecoding, decoder.use_cuda_graphs):
    the loop after the first token runs over a static KV cache (CUDA graphs on a GPU) where
    the call allows it (``ar_static.runs_static``: no drafter, no logit edits), with the
    same tokens; None or elsewhere: this loop."""
    t0 = time.perf_counter()
    B = encoder_states.shape[0]
    device = encoder_states.device
    prefixes = prefixes or [[] for _ in range(B)]
    prompts = prompts if prompts is not None else adapter.batch_prompts(encoder_states)
    rules = rules if rules is not None else TokenRules.of(adapter)
    seqs = [prompt + list(p) for prompt, p in zip(prompts, prefixes)]
    L = max(len(s) for s in seqs)
    limit = min(max_new_tokens, adapter.max_positions - L)
    eot = adapter.eot_id
    mask = torch.zeros((B, L), dtype=torch.long, device=device)
    for i, s in enumerate(seqs):
        mask[i, L - len(s):] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    empty = torch.tensor([len(p) == 0 for p in prefixes], device=device)
    drafter.start(B)
    if drafter.feeds_guesses and not rules.plain_for(adapter):
        raise ValueError("logit rules apply to plain greedy steps, not to drafting")

    cache = None
    if seeds is not None:
        if len(seeds) != B or any(sd.length != len(s) for sd, s in zip(seeds, seqs)):
            raise ValueError("one seed per row, each covering that row's prompt + prefix")
        cross = None
        if cross_out is not None and seeds[0].encoder_decoder and \
                not all(sd.cross_source is not None for sd in seeds):
            # else the first step would project them lazily, for the rows still alive then;
            # projected here for every row, the step reads them from the cache
            cross = _project_cross(adapter, encoder_states)
        cache, own = _seeded_cache(seeds, L, cross)
        if cross_out is not None:
            cross_out[:] = _cross_layers(cache)
        next_tok = torch.tensor([sd.next_token for sd in seeds], dtype=torch.long, device=device)
    else:
        input_ids = torch.full((B, L), eot, dtype=torch.long, device=device)
        for i, s in enumerate(seqs):
            input_ids[i, L - len(s):] = torch.tensor(s, device=device)
        if limit > 0:
            hidden, cache = adapter.decoder_hidden(input_ids, encoder_states, cache, mask, positions)
            if cross_out is not None:
                cross_out[:] = _cross_layers(cache)
            next_tok = rules.first_tokens(adapter, hidden[:, -1], empty, [list(p) for p in prefixes])
    generated: list[list[int]] = [[] for _ in range(B)]
    if limit <= 0:
        return generated
    if timer is not None:
        t1 = time.perf_counter()
        timer["prefill"] = timer.get("prefill", 0.0) + t1 - t0
        t0 = t1
    if static is not None and static.applies(device) and runs_static(adapter, drafter, rules):
        out = _static_loop(static, adapter, encoder_states, cache, mask, positions[:, -1:] + 1, next_tok, limit,
                           timer)
        if out is not None:
            return out
    d = DecodeState(adapter, rules, encoder_states, cache, mask, positions[:, -1:] + 1, next_tok, list(range(B)),
                    prefixes, generated, limit, timer)
    # Rows that end leave the cache in place (moved, not copied) once its tensors are this
    # call's alone: built here (the prefill, the seeds' gathered K/V) and not handed to the
    # caller through ``cross_out``. Otherwise the first drop copies the kept rows out.
    owned = cross_out is None and (seeds is None or own)
    while True:
        # d.next_tok holds each alive row's newest decided token: commit it, drop rows that
        # ended, let the drafter feed the rest (with its guesses) in one pass.
        keep = []
        for n, (r, tok) in enumerate(zip(d.alive, d.next_tok.tolist())):
            if tok == eot:
                continue
            generated[r].append(tok)
            if len(generated[r]) < limit:
                keep.append(n)
        if not keep:
            break
        if len(keep) < len(d.alive):
            order = _move_rows(d.cache, keep) if owned else keep
            idx = torch.tensor(order, device=device)
            if not owned:
                # the tensors may be the caller's or a seed's: copy the kept rows out; after
                # that the cache's tensors are this call's alone
                d.cache.batch_select_indices(idx)
                owned = True
            d.alive = [d.alive[n] for n in order]
            d.next_tok, d.enc, d.mask, d.pos = d.next_tok[idx], d.enc[idx], d.mask[idx], d.pos[idx]
        drafter.step(d)
    if timer is not None:
        timer["decode"] = timer.get("decode", 0.0) + time.perf_counter() - t0
    return generated


def _static_loop(static, adapter, encoder_states, cache, mask, pos, next_tok, limit, timer):
    """The static loop from the prefill's (or the seeds') cache, or None where ``static``
    gives no runner for it; cross-attention K/V the cache lacks (seeds from another
    process) are projected first."""
    from transformers.cache_utils import EncoderDecoderCache

    from .static import layers_of, run_static_loop

    self_kv, cross_kv = layers_of(cache)
    if isinstance(cache, EncoderDecoderCache) and not cross_kv:
        cross_kv = _project_cross(adapter, encoder_states)
    runner = static.runner(adapter, mask, limit, self_kv, cross_kv)
    if runner is None:
        return None
    return run_static_loop(runner, adapter, self_kv, cross_kv, mask, pos, next_tok, limit, timer=timer)


def _cache_layers(cache) -> list:
    """The layers of a decoder cache that hold K/V (self and cross attention)."""
    from transformers.cache_utils import EncoderDecoderCache

    caches = [cache.self_attention_cache, cache.cross_attention_cache] if isinstance(cache, EncoderDecoderCache) \
        else [cache]
    return [layer for c in caches for layer in c.layers if layer.keys is not None and layer.keys.numel()]


def _move_rows(cache, keep: list[int]) -> list[int]:
    """Keep the batch rows ``keep`` (ascending positions) of ``cache``, whose tensors only
    this decoding holds, without copying every survivor's cross-attention K/V again (18 MB
    per Whisper tiny row): move the kept rows beyond the new end into the freed positions
    and narrow the batch. Returns, per new position, the old position whose row it now
    holds; the rows' order changes and the caller follows it."""
    n = len(keep)
    kept = set(keep)
    moves = list(zip([p for p in range(n) if p not in kept], [q for q in keep if q >= n]))
    order = list(range(n))
    for p, q in moves:
        order[p] = q
    for layer in _cache_layers(cache):
        for t in (layer.keys, layer.values):
            for p, q in moves:
                t[p].copy_(t[q])
        layer.keys, layer.values = layer.keys[:n], layer.values[:n]
    return order
