"""Decoder kind ``ssd``: "Self-Speculative Decoding for LLM-based ASR with CTC Encoder
Drafts" as two stages.

First pass (``SSDFirstPassDecoder``): encode, greedy CTC draft, gate (eq. 3), one-pass
verification (eq. 5); with ``ssd.pack_gate`` the gate reads drafts of packed encoder
windows, and with ``ssd.gate_verify_tau`` the drafts it accepts are verified too
(pipeline.decoding.ssd: decoder, packed_verify). Segments that fail come back pending with an
``SSDPending``: their encoder states as CPU arrays (the paper's CPU offload), the verified
prefix and the draft. Second pass (``SSDFallback``): AR fallback from the verified prefix
(eqs. 6-7), re-batched by token budget, in the same process or another actor pool.
"""
from __future__ import annotations

import time
import uuid
from collections import Counter, OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

from ..ar.stage import map_drafting
from ...audio import SAMPLE_RATE
from ..base import PENDING, PendingState, SegmentResult
from ...decoding.ar.greedy import DecodeSeed
from ...decoding.ssd.decoder import AR_UNDRAFTED, CTC_GATE, SelfSpeculativeDecoder, SSDRow
from ...decoding.ssd.gate_calibration import GateCalibration
from ...decoding.ssd.pack_gate_policy import PackGatePolicy
from ...decoding.ssd.packed_verify import verify_packed_drafts
from ...decoding.ssd.verify_policy import VerifyPolicy
from ...models.base import PACKABLE, ARDecoderModel, require
from ...timing import synchronize, timed


@dataclass
class SSDPending(PendingState):
    """A segment waiting for the AR fallback."""
    # [T, D] encoder states (decoder input): float32 numpy, or in-process a host tensor
    # (packed as float32 if it must travel after all)
    states: np.ndarray | torch.Tensor
    prefix: list[int]                 # verified prefix (tokens < j)
    draft: list[int]                  # the whole re-tokenised draft (speculative rounds)
    # State the first pass kept in its own process (the verification KV cache); a fallback
    # in the same process picks it up by this handle, one in another process ignores it.
    handle: str | None = None
    # Shipped to another process: the verification pass's self-attention K/V cropped to
    # prompt + prefix ([layers, 2, heads, tokens, head_dim]) and the greedy token after
    # the prefix, so that fallback skips its prefill.
    kv: np.ndarray | None = None
    next_token: int | None = None
    draft_text: str | None = None     # the CTC draft, for the confidence's agreement feature
    undrafted: bool = False           # no draft, no verification (pipeline.decoding.ssd.verify_policy): plain AR


class SeedStore:
    """Verification KV caches kept for a fallback in the same process, by handle, oldest
    dropped first beyond ``budget_bytes`` (a dropped row is prefilled as usual)."""

    def __init__(self, budget_bytes: int):
        self.budget_bytes = budget_bytes
        self._seeds: OrderedDict[str, tuple[DecodeSeed, int]] = OrderedDict()
        self._bytes = 0
        self._prefix = uuid.uuid4().hex[:12]
        self._count = 0

    def keep(self, seed: DecodeSeed) -> str:
        size = sum(t.numel() * t.element_size() for kv in seed.self_kv + (seed.cross_kv or []) for t in kv)
        while self._seeds and self._bytes + size > self.budget_bytes:
            self._bytes -= self._seeds.popitem(last=False)[1][1]
        self._count += 1
        handle = f"{self._prefix}:{self._count}"
        self._seeds[handle] = (seed, size)
        self._bytes += size
        return handle

    def take(self, handle: str | None) -> DecodeSeed | None:
        kept = self._seeds.pop(handle, None) if handle else None
        if kept is None:
            return None
        self._bytes -= kept[1]
        return kept[0]


class SSDFirstPassDecoder:
    """Encode, draft, gate and verify; rows that fail come back pending with CPU states.

    When the fallback runs in this same process (``share_seeds``, called by
    ``build_fallback``), each pending row's verification KV cache, cropped to its prefix (with
    the cross-attention K/V), stays here under a handle that travels in the row, so the
    fallback skips its prefill and the cross-attention projections. To a fallback pool in
    another process (the two-pool Ray plan) only the cropped self-attention K/V (prompt +
    prefix, ~4 tokens: ~45 KB, 2% of the 2.3-MB encoder states of a Whisper tiny segment)
    and the next token travel: they spare that pool its prefill step (docs/ssd.md has its
    measured share). The cross-attention K/V stay behind: ~8x the encoder states (18 MB
    per segment) and, from the states that travel anyway, one batched projection away.
    Decoder-only models (granite) ship nothing extra: their self-attention K/V hold the
    audio embeddings, more bytes than the states themselves."""

    name = "ssd"
    # The packed gate takes clips up to a third of the encoder window, so that at least three
    # share one encoder pass: a gated clip then saves >= 2/3 of a pass and a rejected one
    # costs <= 1/3 more (its solo encode), so packing pays once the gate accepts > 1/3 of
    # them. Two 15-s clips per window would need > 1/2, which long-form speech does not reach.
    PACK_GATE_WINDOW_DIVISOR = 3
    # Seeds kept for an in-process fallback, oldest dropped first beyond this (a dropped
    # row is prefilled as usual). ~18 MB per Whisper tiny segment, mostly cross K/V.
    SEED_BUDGET_BYTES = 1 << 30

    def __init__(self, adapter: ARDecoderModel, tau_ctc: float, tau_slm: float, max_new_tokens: int = 224,
                 reuse_kv: bool = True, verify_max_entropy: float | None = None, lookahead: int = 0,
                 lookahead_rule: str = "greedy", pack_gate: bool = False,
                 gate_verify_tau: float | None = None, adaptive_pack_gate: bool = False, map_drafting=None,
                 max_draft_error: float | None = None, adaptive_verify: bool = False,
                 verify_break_even: float | None = None, confidence: bool = False, use_cuda_graphs: bool = True,
                 verify_rule: str = "tau_slm"):
        self.confidence = confidence
        # Adaptive: a batch gets the draft and its verification only while they pay for
        # themselves (pipeline.decoding.ssd.verify_policy); otherwise every batch does.
        self.verify_policy = VerifyPolicy(break_even=verify_break_even) if adaptive_verify else None
        if pack_gate:
            require(adapter, PACKABLE, what="ssd.pack_gate")
        self.adapter = adapter
        self.pack_gate = pack_gate
        # Adaptive: a batch is packed only while packing pays (pipeline.decoding.ssd.pack_gate_policy);
        # otherwise every batch with two short clips or more is.
        self.pack_policy = PackGatePolicy() if pack_gate and adaptive_pack_gate else None
        self.ssd = SelfSpeculativeDecoder(adapter, tau_ctc, tau_slm, max_new_tokens, reuse_kv=reuse_kv,
                                          verify_max_entropy=verify_max_entropy, lookahead=lookahead,
                                          lookahead_rule=lookahead_rule, gate_verify_tau=gate_verify_tau,
                                          map_drafting=map_drafting, use_cuda_graphs=use_cuda_graphs,
                                          verify_rule=verify_rule, gate_calibration=None if max_draft_error is None else
                                          GateCalibration(max_draft_error, cap=tau_ctc))
        self.seeds: SeedStore | None = None
        # ssd.adapt (pipeline.kinds.ssd.adapt): the head fitted on this actor's first
        # slice, and the in-process AR that decodes that slice where the fallback runs elsewhere
        self.adaptation = None
        self.adapt_fallback: SSDFallback | None = None
        self._valid_frames = None
        # The fallback of this same process (set by build_fallback): it finishes a batch
        # the verify policy skipped right here, without the pending states' round trip.
        self.local_fallback: SSDFallback | None = None
        # Where the fallback runs elsewhere (a Ray first pool): an unseeded fallback on this
        # stage's model that decodes the skipped batches the policy samples to measure
        # what a fallback token costs (set by build_first_pass while the policy is on).
        self.cost_sampler: SSDFallback | None = None
        # An English-only model's failed-decode check (pipeline.models.whisper.language_check;
        # set by build_first_pass): the language of each segment final after this pass.
        self.english_check = None

    def share_seeds(self) -> SeedStore:
        """Keep each pending row's verification cache for a fallback in this process."""
        if self.seeds is None:
            self.seeds = SeedStore(self.SEED_BUDGET_BYTES)
        return self.seeds

    def segment_cost(self, audio: np.ndarray) -> int:
        return self.adapter.segment_cost(len(audio))

    def _first_pass(self, audios: list[np.ndarray]):
        """Rows, the decoder's encoder states of the rows that still need the decoder
        (``states[k]`` belongs to ``rows[needs[k]]``), and encoder seconds."""
        enc, t_enc = timed(self.adapter.encode, audios, device=self.adapter.device)
        draft = self.adapter.ctc_draft(enc)
        rows = self.ssd.first_pass(enc.states, draft.texts, draft.max_entropy)
        return rows, enc.states, list(range(len(rows))), t_enc

    def _undrafted_first_pass(self, audios: list[np.ndarray]):
        """Encode only: every row pending, for the fallback to decode as plain AR."""
        enc, t_enc = timed(self.adapter.encode, audios, device=self.adapter.device)
        self._valid_frames = enc.valid_frames    # what ssd.adapt learns from (the batch's own)
        rows = [SSDRow(stage=None, text="", max_entropy=float("nan"), draft_text="") for _ in audios]
        return rows, enc.states, list(range(len(rows))), t_enc

    def _decided(self, rows: list[SSDRow]) -> int:
        """Tokens the first pass decided: final drafts whole, pending rows' verified prefixes."""
        ad = self.adapter
        return sum(len(r.prefix) if r.stage is None else
                   len(r.tokens) if r.tokens else len(ad.tokenize(r.text)) if r.text.strip() else 0
                   for r in rows)

    def _gate_first_pass(self, audios: list[np.ndarray]):
        """The packed gate for clips of at most a third of the encoder window (where the policy says it
        pays), the plain first pass for the others; the same (rows, states, needs, encoder
        seconds) as either. The short clips' gate decisions feed the policy either way."""
        short_samples = self.adapter.window_samples // self.PACK_GATE_WINDOW_DIVISOR if self.pack_gate else 0
        short = [i for i, a in enumerate(audios) if len(a) <= short_samples]
        result = self._route_first_pass(audios, short)
        if self.pack_policy is not None and short:
            rows = result[0]
            self.pack_policy.observe(sum(rows[i].stage == CTC_GATE for i in short), len(short))
        return result

    def _packs(self, audios: list[np.ndarray], short: list[int]) -> bool:
        if not self.pack_gate or len(short) < 2:
            return False
        if self.pack_policy is None:
            return True
        plan = self.adapter.plan_packing([len(audios[i]) for i in short])
        return self.pack_policy.should_pack(len(short), 1 + max(p.window for p in plan))

    def _route_first_pass(self, audios: list[np.ndarray], short: list[int]):
        if not self._packs(audios, short):
            return self._first_pass(audios)
        if len(short) == len(audios):
            return self._packed_first_pass(audios)
        taken = set(short)
        longer = [i for i in range(len(audios)) if i not in taken]
        rows: list[SSDRow | None] = [None] * len(audios)
        states, needs, t_enc = [], [], 0.0
        for index, part in ((short, self._packed_first_pass), (longer, self._first_pass)):
            part_rows, part_states, part_needs, seconds = part([audios[i] for i in index])
            for i, row in zip(index, part_rows):
                rows[i] = row
            if part_states is not None:
                states.append(part_states)
                needs += [index[k] for k in part_needs]
            t_enc += seconds
        return rows, torch.cat(states) if states else None, needs, t_enc

    def _packed_first_pass(self, audios: list[np.ndarray]):
        """The packed gate (beyond the paper). Short clips share encoder windows
        (pipeline.packing) for the CTC draft and the gate, as conf/ctc_greedy.yaml does:
        one encoder pass per window, not per clip. Only rows the gate rejects need a
        window of their own, because the decoder reads a clip's whole window: a clip that
        shares a window is encoded again alone, and its solo draft is what verification
        scores; a clip alone in its window already has its solo states. So with tau_ctc =
        +inf the text is the packed CTC greedy text, and with tau_ctc = 0 every row is
        decoded exactly as without packing. The row's max entropy is the gate's (packed).
        With ``gate_verify_tau`` a draft the gate accepts must also pass packed
        verification (pipeline.decoding.ssd.packed_verify); one that fails is treated as
        rejected by the gate; its packed min token probability stays as evidence only where
        it is not verified again alone."""
        ad, ssd = self.adapter, self.ssd
        packed, t_enc = timed(ad.encode_packed, audios, keep_windows=True, device=ad.device)
        draft = ad.ctc_draft(packed)
        rows = ssd.gate_rows(draft.texts, draft.max_entropy)
        if ssd.gate_verify_tau is not None:
            self._verify_packed(packed, rows)
        needs = [i for i, row in enumerate(rows) if row.stage is None]
        if not needs:
            return rows, None, [], t_enc
        per_window = Counter(p.window for p in packed.placements)
        shared = [i for i in needs if per_window[packed.placements[i].window] > 1]
        states = packed.window_states[[packed.placements[i].window for i in needs]]
        if shared:
            solo, seconds = timed(ad.encode, [audios[i] for i in shared], device=ad.device)
            t_enc += seconds
            states[[needs.index(i) for i in shared]] = solo.states
            for i, text in zip(shared, ad.ctc_draft(solo).texts):
                # The packed draft's tokens (from packed verification) no longer apply.
                rows[i].draft_text, rows[i].draft_tokens = text, []
        ssd.verify_rows(states, [rows[i] for i in needs])
        return rows, states, needs, t_enc

    def _verify_packed(self, packed, rows: list[SSDRow]) -> None:
        """Packed verification of the gated rows, in place: one decoder pass over each
        window that holds a gated clip, with every draft of that window as context."""
        gated = {i for i, row in enumerate(rows) if row.stage is not None}
        if not gated:
            return
        order = sorted(range(len(rows)), key=lambda i: (packed.placements[i].window, packed.placements[i].start))
        windows: dict[int, list[int]] = {}
        for i in order:
            windows.setdefault(packed.placements[i].window, []).append(i)
        checked = [w for w, clips in windows.items() if gated.intersection(clips)]
        drafts = [self.adapter.tokenize(row.draft_text) if row.draft_text.strip() else [] for row in rows]
        ver = verify_packed_drafts(self.adapter, packed.window_states[checked], [windows[w] for w in checked],
                                   drafts, self.ssd.gate_verify_tau)
        accepted, min_prob, scored = ver.accepted.tolist(), ver.min_prob.tolist(), ver.scored.tolist()
        for i in gated:
            row = rows[i]
            # A clip past the decoder's positions was not scored: no evidence, not 1.0.
            row.draft_tokens, row.min_prob = drafts[i], min_prob[i] if scored[i] else None
            if not accepted[i]:
                row.stage, row.text = None, ""

    def _ship_kv(self, pending: list) -> dict[int, np.ndarray]:
        """Host copies [layers, 2, H, S, d] of the pending rows' cropped self-attention K/V,
        for a fallback pool in another process; keyed by id(row). Rows differ in S, so they
        are zero-padded to the longest and moved in one device-to-host copy (one sync per
        batch, not per row), then cropped back on the host."""
        if self.seeds is not None:
            return {}
        rows = [r for r in pending if r.seed is not None and r.seed.encoder_decoder]
        if not rows:
            return {}
        stacks = [torch.stack([torch.stack(kv) for kv in r.seed.self_kv]) for r in rows]
        longest = max(s.shape[-2] for s in stacks)
        padded = torch.stack([torch.nn.functional.pad(s, (0, 0, 0, longest - s.shape[-2])) for s in stacks])
        host = padded.float().cpu().numpy()
        return {id(r): np.ascontiguousarray(host[n, ..., :s.shape[-2], :])
                for n, (r, s) in enumerate(zip(rows, stacks))}

    def decode(self, audios: list[np.ndarray]) -> list[SegmentResult]:
        t0 = time.perf_counter()
        policy = self.verify_policy
        # ssd.adapt's slice: plain AR in this process, its states and texts kept to fit the head
        adapting = self.adaptation is not None and self.adaptation.collecting
        drafted = not adapting and (policy is None or policy.should_draft())
        rows, states, needs, t_enc = (self._gate_first_pass if drafted else self._undrafted_first_pass)(audios)
        if states is not None:
            synchronize(states)
        if policy is not None and drafted:
            policy.observe_first_pass(len(rows), self._decided(rows), time.perf_counter() - t0 - t_enc)
        t_enc, t_dec = t_enc / len(audios), (time.perf_counter() - t0 - t_enc) / len(audios)
        pending = [k for k, i in enumerate(needs) if rows[i].stage is None]
        if self.ssd.map_drafting is not None:
            # verified drafts are committed transcripts too (token_map.online learns them)
            self.ssd.map_drafting.learn([row.tokens for row in rows if row.stage is not None and row.tokens])
        # One device-to-host copy for all pending rows (the CPU offload), not one per row.
        # A skipped batch with the fallback in this process never leaves the device.
        local = None
        if adapting:
            local = self.local_fallback or self.adapt_fallback
        elif not drafted:
            local = self.local_fallback
            if local is None and self.cost_sampler is not None and policy.wants_cost_sample():
                local = self.cost_sampler
        local_ar = local is not None
        host_rows = {}
        if pending and not local_ar:
            # A batch pending whole is not gathered.
            kept = (states if len(pending) == states.shape[0] else states[pending]).cpu()
            if self.seeds is None:
                # For a fallback in another process: float32 arrays, the bytes that travel.
                # In this process (build_fallback) the rows may never become bytes (the
                # local runner), so the states stay tensors.
                kept = kept.float().numpy()
            host_rows = dict(zip((needs[k] for k in pending), kept))
        shipped_kv = self._ship_kv([rows[needs[k]] for k in pending])
        # A fixed model.language (auto needs the ar kind) is every segment's language.
        language = self.adapter.prompt_language
        out = []
        for i, row in enumerate(rows):
            res = SegmentResult(row.text, row.stage or PENDING, len(row.tokens), t_enc, t_dec,
                                max_entropy=row.max_entropy if drafted else None, min_prob=row.min_prob,
                                prefix_len=row.prefix_len, drafted=len(row.draft_tokens), generated=0,
                                language=language)
            if row.stage is None:
                state = SSDPending(states=host_rows.get(i), prefix=list(row.prefix), draft=list(row.draft_tokens),
                                   draft_text=row.draft_text if drafted else None, undrafted=not drafted)
                if self.seeds is not None and row.seed is not None:
                    state.handle = self.seeds.keep(row.seed)
                elif id(row) in shipped_kv:
                    state.kv, state.next_token = shipped_kv[id(row)], row.seed.next_token
                row.seed = None
                res.pending = state
            out.append(res)
        if local_ar:
            # Plain AR for the whole batch: nothing to re-batch across recordings, so it
            # is decoded here, as one batch, and leaves this stage final.
            share = local.finish(out, states) / len(out)
            for res in out:
                res.t_decode_s += share
            if adapting:
                self.adaptation.observe(states, self._valid_frames, [res.text for res in out],
                                        sum(len(a) for a in audios) / SAMPLE_RATE)
        if self.confidence and drafted:
            self._confidence(rows, states, needs, out)
        if self.english_check is not None:
            self._check_english(rows, states, needs, out)
        return out

    def _check_english(self, rows: list[SSDRow], states, needs: list[int], out: list[SegmentResult]) -> None:
        """The language of the segments final after the first pass, from their tokens scored
        over their own encoder states (a gated clip of a shared packed window has none: it
        keeps the configured language)."""
        has_states = {i: k for k, i in enumerate(needs)}
        done = [i for i, row in enumerate(rows) if row.stage is not None and i in has_states]
        if not done:
            return
        tokens = [rows[i].tokens or (self.adapter.tokenize(rows[i].text) if rows[i].text.strip() else [])
                  for i in done]
        languages = self.english_check.languages(self.adapter, states[[has_states[i] for i in done]], tokens)
        for i, language in zip(done, languages):
            out[i].language = language

    def _confidence(self, rows: list[SSDRow], states, needs: list[int], out: list[SegmentResult]) -> None:
        """Words and confidence features of the segments final after the first pass: their
        final tokens scored by the decoder (a gated draft re-tokenised) and each word's
        agreement with the CTC draft. A gated clip of a shared packed window has no solo
        encoder states: its words get the agreement alone. The seconds count as decoding."""
        from ...confidence.features import decoder_words
        from ...confidence.words import segment_words

        t0 = time.perf_counter()
        has_states = {i: k for k, i in enumerate(needs)}
        done = [i for i, row in enumerate(rows) if row.stage is not None and i in has_states]
        if done:
            tokens = [rows[i].tokens if rows[i].tokens else self.adapter.tokenize(rows[i].text)
                      if rows[i].text.strip() else [] for i in done]
            scored = decoder_words(self.adapter, states[[has_states[i] for i in done]], tokens,
                                   [rows[i].draft_text for i in done])
            for i, (words, feats) in zip(done, scored):
                out[i].words, out[i].word_features = words, feats
        for i, row in enumerate(rows):
            if row.stage is not None and i not in has_states:
                out[i].words = segment_words(row.text)
                out[i].word_features = [{"agree": 1.0} for _ in out[i].words]
        share = (time.perf_counter() - t0) / max(len(out), 1)
        for res in out:
            res.t_decode_s += share


class SSDFallback:
    """AR fallback from the verified prefix (eqs. 6-7) for pending SSD segments. In the
    first pass's process it starts each row from the verification KV cache that pass kept
    (``seeds``); in another process from the shipped self-attention K/V, else it prefills."""

    name = "ssd"
    pending_type = SSDPending

    def __init__(self, ssd: SelfSpeculativeDecoder, seeds: SeedStore | None = None, confidence: bool = False,
                 verify_policy: VerifyPolicy | None = None):
        self.confidence = confidence
        # The first pass's policy, in its process: told what a decoded token costs here.
        self.verify_policy = verify_policy
        self.ssd = ssd
        self.adapter = ssd.adapter
        self.seeds = seeds
        self.seeded = 0  # rows that started from a verification cache (a statistic)
        self.english_check = None   # as SSDFirstPassDecoder.english_check, for the rows finished here

    def cost(self, result: SegmentResult) -> int:
        return int(result.pending.states.shape[0])

    def finish(self, results: list[SegmentResult], states: torch.Tensor | None = None) -> float:
        """AR fallback for pending results, in place; returns the seconds spent.
        ``states``: the results' encoder states, row by row, where the caller holds them
        on the device already (else they come from each pending state's array)."""
        t0 = time.perf_counter()
        device = self.adapter.device
        dtype = self.adapter.dtype
        pend = [r.pending for r in results]
        if states is None:
            # Zero-padded to the longest row: Whisper's rows are all 1500 frames; adapters
            # with per-row lengths (granite) read zero rows as padding.
            # Arrays rebuilt from the row's bytes may be read-only, and torch warns on those:
            # np.require copies only read-only arrays (2.3 MB per Whisper tiny segment).
            states = torch.nn.utils.rnn.pad_sequence(
                [p.states if isinstance(p.states, torch.Tensor) else
                 torch.from_numpy(np.require(p.states, requirements="W")) for p in pend], batch_first=True)
        states = states.to(device, dtype)
        rows = []
        for r, p in zip(results, pend):
            seed = self.seeds.take(p.handle) if self.seeds is not None else None
            if seed is None and p.kv is not None:
                kv = torch.from_numpy(np.require(p.kv, requirements="W")).to(device, dtype)
                seed = DecodeSeed(self_kv=[(layer[0], layer[1]) for layer in kv], next_token=p.next_token)
            self.seeded += seed is not None
            rows.append(SSDRow(stage=None, text="", max_entropy=r.max_entropy or 0.0, draft_text="",
                               draft_tokens=list(p.draft), prefix=list(p.prefix), min_prob=r.min_prob,
                               seed=seed))
        cross = [] if self.confidence else None
        rows = self.ssd.fallback(states, rows, cross_out=cross)
        if self.ssd.map_drafting is not None:
            # an online token map learns the committed transcripts (token_map.online)
            self.ssd.map_drafting.learn([row.tokens for row in rows])
        if self.verify_policy is not None:
            self.verify_policy.observe_fallback(len(rows), sum(row.generated for row in rows),
                                                time.perf_counter() - t0)
        scored = None
        if self.confidence:
            from ...confidence.features import decoder_words

            drafts = [None if p.undrafted else p.draft_text if p.draft_text is not None else self.adapter.text(p.draft)
                      for p in pend]
            # the confidence pass reuses the cross-attention K/V the fallback decoded with
            scored = decoder_words(self.adapter, states, [row.tokens for row in rows], drafts,
                                   cross_kv=cross or None)
        languages = (self.english_check.languages(self.adapter, states, [row.tokens for row in rows], cross_kv=cross)
                     if self.english_check is not None else [r.language for r in results])
        for n, (res, row, p) in enumerate(zip(results, rows, pend)):
            res.language = languages[n]
            res.text, res.stage, res.tokens = row.text, AR_UNDRAFTED if p.undrafted else row.stage, len(row.tokens)
            res.prefix_len, res.generated = len(row.prefix), row.generated
            if scored is not None:
                res.words, res.word_features = scored[n]
            res.pending = None
        return time.perf_counter() - t0


def _options(cfg) -> dict:
    tau_ctc, tau_slm = cfg.ssd.thresholds()
    return dict(tau_ctc=tau_ctc, tau_slm=tau_slm, max_new_tokens=cfg.decoder.max_new_tokens,
                reuse_kv=cfg.ssd.reuse_kv, verify_max_entropy=cfg.ssd.verify_max_entropy,
                lookahead=cfg.ssd.lookahead, lookahead_rule=cfg.ssd.lookahead_rule,
                gate_verify_tau=cfg.ssd.gate_verify_threshold(), use_cuda_graphs=cfg.decoder.use_cuda_graphs,
                verify_rule=cfg.ssd.verify_rule)


def build_first_pass(adapter: ARDecoderModel, cfg) -> SSDFirstPassDecoder:
    first = SSDFirstPassDecoder(adapter, pack_gate=cfg.ssd.packs_gate(), adaptive_pack_gate=cfg.ssd.adaptive_pack_gate,
                                map_drafting=map_drafting(adapter, cfg), max_draft_error=cfg.ssd.draft_error_target(),
                                adaptive_verify=cfg.ssd.verifies_adaptively(),
                                verify_break_even=cfg.ssd.verify_break_even, confidence=cfg.confidence.enabled,
                                **_options(cfg))
    first.english_check = _english_check(adapter, cfg)
    if cfg.ssd.adapt:
        from .adapt import HeadAdaptation

        o = cfg.ssd
        first.adaptation = HeadAdaptation(adapter, o.adapt_audio_minutes, o.adapt_fit_minutes, o.adapt_dir,
                                          epochs=o.adapt_epochs, lr=o.adapt_lr)
        if first.adaptation.collecting:
            first.adapt_fallback = SSDFallback(first.ssd, confidence=cfg.confidence.enabled)
            first.adapt_fallback.english_check = first.english_check
    if first.verify_policy is not None:
        # No seeds: drafted rows still ship their K/V to the fallback pool.
        first.cost_sampler = SSDFallback(first.ssd, confidence=cfg.confidence.enabled,
                                         verify_policy=first.verify_policy)
        first.cost_sampler.english_check = first.english_check
    return first


def _english_check(adapter: ARDecoderModel, cfg):
    from ...models.whisper.language_check import EnglishOnlyCheck

    return EnglishOnlyCheck.of(adapter, cfg.filters)


def build_fallback(cfg, first_stage: SSDFirstPassDecoder | None = None) -> SSDFallback:
    """In the first pass's process: its model and its verification caches; elsewhere a
    model of its own."""
    if first_stage is not None:
        fallback = SSDFallback(first_stage.ssd, first_stage.share_seeds(), confidence=cfg.confidence.enabled,
                               verify_policy=first_stage.verify_policy)
        first_stage.local_fallback = fallback
        fallback.english_check = first_stage.english_check
        return fallback
    from ...models import load_model

    adapter = load_model(cfg.model)
    fallback = SSDFallback(SelfSpeculativeDecoder(adapter, map_drafting=map_drafting(adapter, cfg), **_options(cfg)),
                           confidence=cfg.confidence.enabled)
    fallback.english_check = _english_check(adapter, cfg)
    return fallback


