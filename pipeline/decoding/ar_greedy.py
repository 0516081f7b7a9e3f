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

Speculative rounds (``drafts`` + ``lookahead``; speculative decoding with greedy
verification, the draft as proposal source): after its first token a row feeds, with
each decided token, up to K guesses read from its draft where ``draft_sync`` says the
decoder now is, all in one pass. Guesses are kept up to the first one that is not the
decoder's argmax (or, with ``accept_prob``, whose probability is not above it); the
argmax there is the round's next decided token, so every round decides at least one token
and, under the argmax rule, exactly the tokens plain greedy decoding decides. Rows keep
different numbers of guesses, so rejected guesses are not cut out of the batched cache:
they stay masked out (zero attention mask), and positions count only kept tokens.

Token-map drafting (``map_drafting``; "Model-free Speculative Decoding for
Transformer-based ASR with Token Map Drafting", §III-A): after its first token a row looks
up up to K continuations of its last N..1 decided tokens in a token map
(pipeline.decoding.token_map), plus, in SSD's fallback, the rest of its CTC draft. All
rows' candidates go through the decoder in one pass as candidate trees over the KV cache
(pipeline.decoding.draft_tree: a 4D attention mask lets each node see the past and its
ancestors only); each row keeps the longest candidate prefix that is its own argmax, then
the correction token, so the output is plain greedy's token for token. Nodes off the kept
path stay in the cache, masked out, as rejected guesses do above. A policy
(pipeline.draft_policy) may switch drafting off pass by pass where it does not pay.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from pipeline.decoding.draft_sync import advance, proposal
from pipeline.decoding.draft_tree import build_trees, kept_columns, tree_inputs, walk_trees
from pipeline.decoding.screened_argmax import greedy_tokens
from pipeline.timing import synchronize

# Guess positions per chunk of a speculative round's output projection.
LOOKAHEAD_CHUNK = 4


@dataclass
class MapDrafting:
    """Token-map drafting in greedy decoding (see the module docstring): up to
    ``candidates`` continuations of at most ``max_draft`` tokens per row and pass, from
    ``token_map`` (pipeline.decoding.token_map.TokenMap) and, where the call also gives
    ``drafts`` and ``lookahead``, from the draft as one more candidate (``map_first``: the
    map's candidates rank first). ``policy`` (pipeline.draft_policy.DraftPolicy, kept
    across calls) decides pass by pass whether drafting pays; None drafts on every pass."""
    token_map: object
    candidates: int = 2
    max_draft: int = 8
    policy: object = None
    map_first: bool = True

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


def cache_of(kv: list[tuple[torch.Tensor, torch.Tensor]]):
    """A DynamicCache holding exactly these tensors (its constructor would copy them)."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    cache = DynamicCache()
    for k, v in kv:
        layer = DynamicLayer()
        layer.lazy_initialization(k, v)
        layer.keys, layer.values = k, v
        cache.layers.append(layer)
    return cache


def _cross_layers(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A decoder cache's cross-attention K/V per layer, or [] where it has none."""
    from transformers.cache_utils import EncoderDecoderCache

    if not isinstance(cache, EncoderDecoderCache):
        return []
    layers = [(layer.keys, layer.values) for layer in cache.cross_attention_cache.layers]
    if not layers or any(k is None or not k.numel() for k, _ in layers):
        return []      # not projected yet
    return layers


def _project_cross(adapter, encoder_states: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
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


def cross_attention_cache(cross_kv: list[tuple[torch.Tensor, torch.Tensor]]):
    """An encoder-decoder cache with no self-attention entries and ``cross_kv`` (per layer
    [B, H, T, d], as ``greedy_decode(cross_out=...)`` leaves them) as its cross-attention:
    a pass over the same rows then skips projecting the encoder states again."""
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache

    return EncoderDecoderCache(DynamicCache(), cache_of(cross_kv))


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


@torch.inference_mode()
def greedy_decode(adapter, encoder_states: torch.Tensor, prefixes: list[list[int]] | None = None,
                  max_new_tokens: int = 224, seeds: list[DecodeSeed] | None = None,
                  timer: dict | None = None, drafts: list[list[int]] | None = None,
                  draft_starts: list[int] | None = None, lookahead: int = 0,
                  verify_chunk: int = LOOKAHEAD_CHUNK, accept_prob: float | None = None,
                  map_drafting: MapDrafting | None = None, prompts: list[list[int]] | None = None,
                  rules=None, cross_out: list | None = None) -> list[list[int]]:
    """Return, per row, the generated tokens after its prefix (end-of-text excluded).

    With ``seeds`` (one per row, each for that row's prompt + prefix), the prefill pass is
    skipped: the first token is the seed's, the cache starts from the seeds' K/V.
    With ``drafts`` and ``lookahead`` > 0, each step after the first also feeds up to
    ``lookahead`` draft tokens per row (speculative rounds, see the module docstring);
    ``draft_starts`` gives each row's draft position after its prefix (default 0).
    With ``map_drafting``, each step after the first feeds a tree of candidate
    continuations per row (token-map drafting, see the module docstring); the draft, if
    given, is one of the candidates. ``timer`` (benchmarks) accumulates seconds under
    "prefill" (the first step) and "decode" (the rest); each step already waits for its
    tokens on the host. Drafting steps add counts: "tm_rounds" (row-steps with a
    candidate), "tm_drafted" (draft tokens fed), "tm_accepted", "tm_passes" and
    "tm_plain_passes".
    ``prompts`` (one per row) replace ``adapter.batch_prompts`` (Whisper's detected
    languages); ``rules(logits, generated_per_row)`` edits each step's suppressed logits
    in place from what each row has generated (Whisper's timestamp rules; plain steps
    only, not with drafting).
    ``cross_out`` (a list): filled with the cross-attention K/V the decoding used, per layer
    ([B, H, T, d], every row in call order), for a later pass over the same rows
    (:func:`cross_attention_cache`); left empty for a decoder without them. Seeds without
    them (from another process) get them projected before the first step, for every row."""
    t0 = time.perf_counter()
    B = encoder_states.shape[0]
    device = encoder_states.device
    prefixes = prefixes or [[] for _ in range(B)]
    prompts = prompts if prompts is not None else adapter.batch_prompts(encoder_states)
    seqs = [prompt + list(p) for prompt, p in zip(prompts, prefixes)]
    L = max(len(s) for s in seqs)
    limit = min(max_new_tokens, adapter.max_positions - L)
    eot = adapter.eot_id
    mask = torch.zeros((B, L), dtype=torch.long, device=device)
    for i, s in enumerate(seqs):
        mask[i, L - len(s):] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    empty = torch.tensor([len(p) == 0 for p in prefixes], device=device)
    use_draft = drafts is not None and lookahead > 0
    if use_draft and len(drafts) != B:
        raise ValueError("one draft per row")
    tree = map_drafting is not None
    if rules is not None and (use_draft or tree):
        raise ValueError("logit rules apply to plain greedy steps, not to drafting")
    speculate = use_draft and not tree  # linear rounds over the draft alone
    ptrs = list(draft_starts) if draft_starts is not None else [0] * B

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
            logits = adapter.logits(hidden[:, -1])
            logits.masked_fill_(adapter.suppress_mask, float("-inf"))
            if adapter.begin_suppress_ids.numel():
                rows = empty.nonzero().squeeze(-1)
                if rows.numel():
                    logits[rows.unsqueeze(-1), adapter.begin_suppress_ids] = float("-inf")
            if rules is not None:
                rules(logits, [list(p) for p in prefixes])
            next_tok = logits.argmax(-1)
    generated: list[list[int]] = [[] for _ in range(B)]
    if limit <= 0:
        return generated
    if timer is not None:
        t1 = time.perf_counter()
        timer["prefill"] = timer.get("prefill", 0.0) + t1 - t0
        t0 = t1
    alive = list(range(B))
    # Rows that end leave the cache in place (moved, not copied) once its tensors are this
    # call's alone: built here (the prefill, the seeds' gathered K/V) and not handed to the
    # caller through ``cross_out``. Otherwise the first drop copies the kept rows out.
    owned = cross_out is None and (seeds is None or own)
    enc, pos = encoder_states, positions[:, -1:] + 1
    while True:
        # next_tok holds each alive row's newest decided token: commit it, drop rows that
        # ended, feed the rest (with their draft guesses) in one pass.
        toks = next_tok.tolist()
        keep = []
        for n, (r, tok) in enumerate(zip(alive, toks)):
            if tok == eot:
                continue
            generated[r].append(tok)
            if len(generated[r]) < limit:
                keep.append(n)
        if not keep:
            break
        if len(keep) < len(alive):
            order = _move_rows(cache, keep) if owned else keep
            idx = torch.tensor(order, device=device)
            if not owned:
                # the tensors may be the caller's or a seed's: copy the kept rows out; after
                # that the cache's tensors are this call's alone
                cache.batch_select_indices(idx)
                owned = True
            alive = [alive[n] for n in order]
            next_tok, enc, mask, pos = next_tok[idx], enc[idx], mask[idx], pos[idx]
        guesses = [[] for _ in alive]
        if use_draft:
            for r in alive:
                ptrs[r] = _advance_last(drafts[r], ptrs[r], prefixes[r], generated[r])
        if tree:
            next_tok, pos, mask, cache = _tree_step(adapter, map_drafting, alive, next_tok, enc, cache, mask, pos,
                                                    prefixes, generated, limit, drafts if use_draft else None,
                                                    ptrs, lookahead, timer)
            continue
        if speculate:
            for n, r in enumerate(alive):
                # A guess never takes a row past its token limit (the decided token after
                # the guesses counts too), so the output is plain greedy's, truncated alike.
                guesses[n] = proposal(drafts[r], ptrs[r], min(lookahead, limit - len(generated[r]) - 1))
        width = 1 + max(len(g) for g in guesses)
        step_ids = next_tok.unsqueeze(-1)
        step_mask = torch.ones((len(alive), width), dtype=torch.long, device=device)
        if width > 1:
            pad = torch.full((len(alive), width - 1), eot, dtype=torch.long, device=device)
            for n, g in enumerate(guesses):
                if g:
                    pad[n, :len(g)] = torch.tensor(g, device=device)
                step_mask[n, 1 + len(g):] = 0
            step_ids = torch.cat([step_ids, pad], 1)
        step_pos = pos + torch.arange(width, device=device) if width > 1 else pos
        hidden, cache = adapter.decoder_hidden(step_ids, enc, cache, torch.cat([mask, step_mask], 1), step_pos)
        if width == 1:
            next_tok = _plain_step_tokens(adapter, hidden[:, -1], rules,
                                          lambda: [prefixes[r] + generated[r] for r in alive])
            pos = pos + 1
        else:
            next_tok, kept = _verify_guesses(adapter, hidden, step_ids[:, 1:], [len(g) for g in guesses],
                                             verify_chunk, accept_prob)
            for n, (r, k) in enumerate(zip(alive, kept.tolist())):
                if k:
                    generated[r].extend(guesses[n][:k])
                    ptrs[r] += k
            # Rejected guesses stay in the cache, masked out; positions count kept tokens only.
            step_mask = (torch.arange(width, device=device) <= kept.unsqueeze(-1)).long()
            pos = pos + 1 + kept.unsqueeze(-1)
        if speculate and timer is not None:
            timer["rounds"] = timer.get("rounds", 0) + len(alive)
            timer["guessed"] = timer.get("guessed", 0) + sum(len(g) for g in guesses)
            timer["kept"] = timer.get("kept", 0) + (int(kept.sum()) if width > 1 else 0)
        mask = torch.cat([mask, step_mask], 1)
    if timer is not None:
        timer["decode"] = timer.get("decode", 0.0) + time.perf_counter() - t0
    return generated


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


def _plain_step_tokens(adapter, hidden: torch.Tensor, rules=None, histories=None) -> torch.Tensor:
    """The greedy token after each row's newest position (``hidden`` [A, D]) with the
    suppressed tokens masked: through the adapter's ``next_tokens`` where it has one (no
    logits; pipeline.decoding.screened_argmax), else the logits' argmax, edited first by
    ``rules(logits, histories())`` where given."""
    if rules is None:
        return greedy_tokens(adapter, hidden)
    logits = adapter.logits(hidden)
    logits.masked_fill_(adapter.suppress_mask, float("-inf"))
    rules(logits, histories())
    return logits.argmax(-1)


def _advance_last(draft: list[int], ptr: int, prefix: list[int], generated: list[int]) -> int:
    """The draft pointer after the newest committed token (pipeline.decoding.draft_sync)."""
    prev = generated[-2] if len(generated) > 1 else (prefix[-1] if prefix else None)
    return advance(draft, ptr, generated[-1], prev)


def _tree_step(adapter, md: MapDrafting, alive, next_tok, enc, cache, mask, pos, prefixes, generated, limit,
               drafts, ptrs, lookahead, timer):
    """One pass of token-map drafting over the alive rows, whose newest decided tokens
    (``next_tok``) are committed already: feed each row's candidate tree (or, where no row
    has a candidate or the policy says it does not pay, the decided token alone), commit
    the accepted drafts, and return the next decided tokens with the grown mask, positions
    and cache."""
    clock = md.policy.clock if md.policy is not None else time.perf_counter
    t0 = clock()
    device, eot = next_tok.device, adapter.eot_id
    draft_now = md.policy is None or md.policy.should_draft()
    cands = [[] for _ in alive]
    if draft_now:
        for n, r in enumerate(alive):
            room = limit - len(generated[r]) - 1
            own = proposal(drafts[r], ptrs[r], min(lookahead, room)) if drafts is not None else None
            cands[n] = md.propose(prefixes[r] + generated[r], room, eot, own)
    if not any(cands):
        hidden, cache = adapter.decoder_hidden(next_tok.unsqueeze(-1), enc, cache,
                                               torch.cat([mask, torch.ones_like(pos)], 1), pos)
        nxt = _plain_step_tokens(adapter, hidden[:, -1])
        if md.policy is not None:
            synchronize(nxt)  # a drafting pass waits for its tokens on the host too
            md.policy.observe(False, clock() - t0, len(alive), len(alive))
        if timer is not None:
            timer["tm_plain_passes"] = timer.get("tm_plain_passes", 0) + 1
        return nxt, pos + 1, torch.cat([mask, torch.ones_like(pos)], 1), cache
    trees = build_trees(next_tok.tolist(), cands)
    ids, mask4, step_pos, _ = tree_inputs(trees, mask, pos, eot, adapter.dtype)
    hidden, cache = adapter.decoder_hidden(ids, enc, cache, mask4, step_pos)
    paths, nxt, ends = walk_trees(adapter, hidden, trees, eot)
    for n, r in enumerate(alive):
        for tok in paths[n]:
            generated[r].append(tok)
            if drafts is not None:
                ptrs[r] = _advance_last(drafts[r], ptrs[r], prefixes[r], generated[r])
    kept = torch.tensor([len(p) for p in paths], device=device)
    if md.policy is not None:
        md.policy.observe(True, clock() - t0, len(alive), len(alive) + int(kept.sum()))
    if timer is not None:
        timer["tm_passes"] = timer.get("tm_passes", 0) + 1
        timer["tm_rounds"] = timer.get("tm_rounds", 0) + sum(1 for c in cands if c)
        timer["tm_drafted"] = timer.get("tm_drafted", 0) + trees.drafted
        timer["tm_accepted"] = timer.get("tm_accepted", 0) + int(kept.sum())
    # Nodes off the accepted paths stay in the cache, masked out; positions count kept tokens.
    return (torch.tensor(nxt, dtype=torch.long, device=device), pos + 1 + kept.unsqueeze(-1),
            torch.cat([mask, kept_columns(trees, ends, device)], 1), cache)


def _verify_guesses(adapter, hidden: torch.Tensor, guesses: torch.Tensor, sizes: list[int], chunk: int,
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
