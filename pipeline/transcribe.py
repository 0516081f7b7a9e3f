"""Turn prepared recordings into output rows with a segment decoder.

Segments of all recordings in a batch are pooled, sorted by length and packed under the
padded-token budget (pipeline.batching), decoded, then put back per recording. A failure
while decoding one sub-batch retries its segments one at a time, so only the segment that
really fails marks its recording with an `error`.

Decoders: full AR (the baseline), greedy CTC (the draft alone) and the SSD first pass
(gate + verify; with ``pack_gate`` the gate reads drafts of packed encoder windows, and
with ``gate_verify_tau`` the drafts it accepts are also verified on those windows). SSD
segments that fail verification come back *pending*, carrying their
encoder states as CPU arrays; `complete_pending` runs the AR fallback on them, in the
same process or in a separate actor pool.
"""
from __future__ import annotations

import time
import uuid
from collections import Counter, OrderedDict
from dataclasses import dataclass, field

import numpy as np
import torch

from pipeline.audio import SAMPLE_RATE
from pipeline.batching import pack_by_budget
from pipeline.decoding.ar_greedy import DecodeSeed, greedy_decode
from pipeline.decoding.ssd import CTC_GATE, SelfSpeculativeDecoder, SSDRow
from pipeline.decoding.ssd_packed_verify import verify_packed_drafts
from pipeline.pack_gate_policy import PackGatePolicy
from pipeline.records import PENDING_FIELDS, recording_stage

ENCODER_FRAMES = 1500  # Whisper encodes a fixed 30-s window per segment
_EMPTY = np.zeros(0, dtype=np.float32)
PENDING = "pending"


@dataclass
class SegmentResult:
    text: str
    stage: str
    tokens: int = 0
    t_encode_s: float = 0.0
    t_decode_s: float = 0.0
    error: str | None = None
    max_entropy: float | None = None
    min_prob: float | None = None
    prefix_len: int | None = None
    drafted: int | None = None
    generated: int | None = None
    # Only while pending: what the second stage needs.
    ssd_row: SSDRow | None = None
    states: np.ndarray | None = field(default=None, repr=False)
    key_phrases: list[str] | None = None
    handle: str | None = None         # state the first pool kept in-process (SSD seeds)
    kv: np.ndarray | None = field(default=None, repr=False)  # shipped SSD self-attention K/V
    next_token: int | None = None     # shipped greedy token after the verified prefix


def _sync(t: torch.Tensor) -> None:
    if t.is_cuda:
        torch.cuda.synchronize(t.device)


def timed_encode(encode, audios: list[np.ndarray], **kw):
    """``encode(audios, **kw)`` and its seconds, the device synchronised."""
    t0 = time.perf_counter()
    enc = encode(audios, **kw)
    _sync(enc.states)
    return enc, time.perf_counter() - t0


def encode_then(adapter, audios: list[np.ndarray], after_encode, packed: bool = False):
    """Encode ``audios`` (several short clips per encoder window when ``packed``) and run
    ``after_encode(encoder_batch)``; returns its result and the encoder's and its own
    seconds per segment (the per-stage timings of each row)."""
    enc, t_enc = timed_encode(adapter.encode_packed if packed else adapter.encode, audios)
    t1 = time.perf_counter()
    out = after_encode(enc)
    t2 = time.perf_counter()
    return out, t_enc / len(audios), (t2 - t1) / len(audios)


class ARSegmentDecoder:
    """Full autoregressive greedy decoding of each segment (the baseline)."""

    name = "ar"

    def __init__(self, adapter, max_new_tokens: int = 224):
        self.adapter = adapter
        self.max_new_tokens = max_new_tokens

    def decode(self, audios: list[np.ndarray]) -> list[SegmentResult]:
        tokens, t_enc, t_dec = encode_then(
            self.adapter, audios,
            lambda enc: greedy_decode(self.adapter, enc.states, max_new_tokens=self.max_new_tokens))
        return [SegmentResult(self.adapter.text(t), "ar", len(t), t_enc, t_dec, generated=len(t))
                for t in tokens]


def packed_frames(audio: np.ndarray) -> int:
    """Encoder frames a clip takes in a packed window (its states plus a gap's worth)."""
    return min(ENCODER_FRAMES, len(audio) // 320 + 16)


class CTCGreedySegmentDecoder:
    """The greedy CTC draft alone: encoder + CTC head, no decoder pass. With ``pack``,
    short clips share encoder windows (pipeline.packing)."""

    name = "ctc_greedy"

    def __init__(self, adapter, pack: bool = False):
        self.adapter = adapter
        self.pack = pack

    def segment_cost(self, audio: np.ndarray) -> int:
        return packed_frames(audio) if self.pack else ENCODER_FRAMES

    def decode(self, audios: list[np.ndarray]) -> list[SegmentResult]:
        draft, t_enc, t_dec = encode_then(self.adapter, audios, self.adapter.ctc_draft, packed=self.pack)
        return [SegmentResult(t.strip(), "ctc_greedy", len(t), t_enc, t_dec, max_entropy=float(h))
                for t, h in zip(draft.texts, draft.max_entropy.tolist())]


class SSDFirstPassDecoder:
    """Encode, draft, gate and verify; rows that fail come back pending with CPU states.

    When the fallback runs in this same process (``keep_seeds``, set by an in-process
    SSDFallback), each pending row's verification KV cache, cropped to its prefix (with
    the cross-attention K/V), stays here under a handle that travels in the row, so the
    fallback skips its prefill and the cross-attention projections. To a fallback pool in
    another process (the two-pool Ray plan) only the cropped self-attention K/V (prompt +
    prefix, ~4 tokens: ~45 KB, 2% of the 2.3-MB encoder states of a Whisper tiny segment)
    and the next token travel: they spare that pool its prefill step, ~7% of its time on
    held-out voices. The cross-attention K/V stay behind: ~8x the encoder states (18 MB
    per segment) and, from the states that travel anyway, one batched projection away.
    Decoder-only models (granite) ship nothing extra: their self-attention K/V hold the
    audio embeddings, more bytes than the states themselves."""

    name = "ssd"
    # The packed gate takes clips up to a third of Whisper's window, so that at least three
    # share one encoder pass: a gated clip then saves >= 2/3 of a pass and a rejected one
    # costs <= 1/3 more (its solo encode), so packing pays once the gate accepts > 1/3 of
    # them. Two 15-s clips per window would need > 1/2 (long-form accepts ~12% here).
    PACK_GATE_MAX_S = 10.0
    # Seeds kept for an in-process fallback, oldest dropped first beyond this (a dropped
    # row is prefilled as usual). ~18 MB per Whisper tiny segment, mostly cross K/V.
    SEED_BUDGET_BYTES = 1 << 30

    def __init__(self, adapter, tau_ctc: float, tau_slm: float, max_new_tokens: int = 224,
                 reuse_kv: bool = True, verify_max_entropy: float | None = None, lookahead: int = 0,
                 lookahead_rule: str = "greedy", pack_gate: bool = False,
                 gate_verify_tau: float | None = None, adaptive_pack_gate: bool = False):
        if pack_gate and not (hasattr(adapter, "encode_packed") and hasattr(adapter, "plan_packing")):
            raise ValueError(f"ssd.pack_gate: {type(adapter).__name__} cannot pack encoder windows")
        self.adapter = adapter
        self.pack_gate = pack_gate
        # Adaptive: a batch is packed only while packing pays (pipeline.pack_gate_policy);
        # otherwise every batch with two short clips or more is.
        self.pack_policy = PackGatePolicy() if pack_gate and adaptive_pack_gate else None
        self.ssd = SelfSpeculativeDecoder(adapter, tau_ctc, tau_slm, max_new_tokens, reuse_kv=reuse_kv,
                                          verify_max_entropy=verify_max_entropy, lookahead=lookahead,
                                          lookahead_rule=lookahead_rule, gate_verify_tau=gate_verify_tau)
        self.keep_seeds = False
        self.seeded = 0  # fallback rows that started from a verification cache (a statistic)
        self._seeds: OrderedDict[str, tuple[DecodeSeed, int]] = OrderedDict()
        self._seed_bytes = 0
        self._prefix = uuid.uuid4().hex[:12]
        self._count = 0

    def _keep(self, seed: DecodeSeed) -> str:
        size = sum(t.numel() * t.element_size() for kv in seed.self_kv + (seed.cross_kv or []) for t in kv)
        while self._seeds and self._seed_bytes + size > self.SEED_BUDGET_BYTES:
            self._seed_bytes -= self._seeds.popitem(last=False)[1][1]
        self._count += 1
        handle = f"{self._prefix}:{self._count}"
        self._seeds[handle] = (seed, size)
        self._seed_bytes += size
        return handle

    def _take(self, handle: str | None) -> DecodeSeed | None:
        kept = self._seeds.pop(handle, None) if handle else None
        if kept is None:
            return None
        self._seed_bytes -= kept[1]
        return kept[0]

    def _first_pass(self, audios: list[np.ndarray]):
        """Rows, the decoder's encoder states of the rows that still need the decoder
        (``states[k]`` belongs to ``rows[needs[k]]``), and encoder seconds."""
        enc, t_enc = timed_encode(self.adapter.encode, audios)
        draft = self.adapter.ctc_draft(enc)
        rows = self.ssd.first_pass(enc.states, draft.texts, draft.max_entropy)
        return rows, enc.states, list(range(len(rows))), t_enc

    def _gate_first_pass(self, audios: list[np.ndarray]):
        """The packed gate for clips of at most PACK_GATE_MAX_S (where the policy says it
        pays), the plain first pass for the others; the same (rows, states, needs, encoder
        seconds) as either. The short clips' gate decisions feed the policy either way."""
        short = [i for i, a in enumerate(audios) if len(a) <= self.PACK_GATE_MAX_S * SAMPLE_RATE]
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
        verification (pipeline.decoding.ssd_packed_verify); one that fails is treated as
        rejected by the gate; its packed min token probability stays as evidence only where
        it is not verified again alone."""
        ad, ssd = self.adapter, self.ssd
        packed, t_enc = timed_encode(ad.encode_packed, audios, keep_windows=True)
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
            solo, seconds = timed_encode(ad.encode, [audios[i] for i in shared])
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
        if self.keep_seeds:
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
        rows, states, needs, t_enc = self._gate_first_pass(audios)
        if states is not None:
            _sync(states)
        t_enc, t_dec = t_enc / len(audios), (time.perf_counter() - t0 - t_enc) / len(audios)
        pending = [k for k, i in enumerate(needs) if rows[i].stage is None]
        # One device-to-host copy for all pending rows (the CPU offload), not one per row.
        host_rows = dict(zip((needs[k] for k in pending), states[pending].float().cpu().numpy())) if pending else {}
        shipped_kv = self._ship_kv([rows[needs[k]] for k in pending])
        out = []
        for i, row in enumerate(rows):
            res = SegmentResult(row.text, row.stage or PENDING, len(row.tokens), t_enc, t_dec,
                                max_entropy=row.max_entropy, min_prob=row.min_prob,
                                prefix_len=row.prefix_len, drafted=len(row.draft_tokens), generated=0)
            if row.stage is None:
                if self.keep_seeds and row.seed is not None:
                    res.handle = self._keep(row.seed)
                elif id(row) in shipped_kv:
                    res.kv, res.next_token = shipped_kv[id(row)], row.seed.next_token
                row.seed = None
                res.ssd_row = row
                res.states = host_rows[i]
            out.append(res)
        return out

    def cost(self, result: SegmentResult) -> int:
        return ENCODER_FRAMES

    def finish(self, results: list[SegmentResult]) -> float:
        """AR fallback for pending results, in place; returns the seconds spent."""
        t0 = time.perf_counter()
        device = self.adapter.device
        dtype = self.adapter.dtype
        # Zero-padded to the longest row: Whisper's rows are all 1500 frames; adapters with
        # per-row lengths (granite) read zero rows as padding.
        # Arrays from Arrow are read-only views and torch warns on those: np.require copies
        # only read-only arrays (2.3 MB per Whisper tiny segment, small next to the decode).
        states = torch.nn.utils.rnn.pad_sequence([torch.from_numpy(np.require(r.states, requirements="W"))
                                                  for r in results],
                                                 batch_first=True).to(device, dtype)
        for r in results:
            seed = self._take(r.handle)
            if seed is None and r.kv is not None:
                kv = torch.from_numpy(np.require(r.kv, requirements="W")).to(device, dtype)
                seed = DecodeSeed(self_kv=[(layer[0], layer[1]) for layer in kv], next_token=r.next_token)
            r.ssd_row.seed = seed
            self.seeded += seed is not None
        rows = self.ssd.fallback(states, [r.ssd_row for r in results])
        for res, row in zip(results, rows):
            res.text, res.stage, res.tokens = row.text, row.stage, len(row.tokens)
            res.prefix_len, res.generated = len(row.prefix), row.generated
            res.ssd_row, res.states, res.handle, res.kv = None, None, None, None
        return time.perf_counter() - t0


def decode_segments(decoder, audios: list[np.ndarray], max_tokens: int) -> list[SegmentResult]:
    results: list[SegmentResult | None] = [None] * len(audios)
    cost = getattr(decoder, "segment_cost", lambda audio: ENCODER_FRAMES)
    for batch in pack_by_budget([cost(a) for a in audios], max_tokens):
        try:
            outs = decoder.decode([audios[i] for i in batch])
        except Exception:
            outs = [_decode_one(decoder, audios[i]) for i in batch]
        for i, res in zip(batch, outs):
            results[i] = res
    return results


def _decode_one(decoder, audio: np.ndarray) -> SegmentResult:
    try:
        return decoder.decode([audio])[0]
    except Exception as exc:
        return SegmentResult("", "error", error=f"{type(exc).__name__} while decoding: {exc}")


def _segment_dict(row: dict, s: int, res: SegmentResult) -> dict:
    return {"start": row["seg_start"][s], "end": row["seg_end"][s], "text": res.text, "stage": res.stage,
            "tokens": res.tokens, "max_entropy": res.max_entropy, "min_prob": res.min_prob,
            "prefix_len": res.prefix_len, "drafted": res.drafted, "generated": res.generated,
            "error": res.error}


def finalize_row(row: dict) -> dict:
    """Fill text, stage and error of an output row from its segments."""
    segments = row["segments"]
    error = row.get("prepare_error") or next((sg["error"] for sg in segments if sg.get("error")), None)
    row["error"] = error
    row["text"] = None if error else " ".join(sg["text"] for sg in segments if sg["text"])
    row["stage"] = recording_stage([sg["stage"] for sg in segments], error)
    return row


def transcribe_prepared(rows: list[dict], decoder, max_tokens: int) -> list[dict]:
    """Output rows, one per input row. Pending SSD segments keep their states in
    ``pending_*`` fields (see records.INTERMEDIATE_SCHEMA)."""
    flat: list[tuple[int, int]] = []
    audios: list[np.ndarray] = []
    for r, row in enumerate(rows):
        if row.get("error"):
            continue
        for s, audio in enumerate(row["seg_audio"]):
            flat.append((r, s))
            audios.append(np.asarray(audio, dtype=np.float32))
    results = decode_segments(decoder, audios, max_tokens) if audios else []
    per_row: dict[int, list[tuple[int, SegmentResult]]] = {}
    for (r, s), res in zip(flat, results):
        per_row.setdefault(r, []).append((s, res))
    out = []
    for r, row in enumerate(rows):
        segs = sorted(per_row.get(r, []), key=lambda x: x[0])
        pending = [(s, res) for s, res in segs if res.stage == PENDING]
        out_row = {
            "id": row["id"], "audio": row["audio"], "duration_s": row.get("duration_s"),
            "reference": row.get("reference"), "prepare_error": row.get("error"),
            "segments": [_segment_dict(row, s, res) for s, res in segs],
            "decoder": decoder.name, "t_prepare_s": row.get("t_prepare_s"),
            "t_encode_s": sum(res.t_encode_s for _, res in segs),
            "t_decode_s": sum(res.t_decode_s for _, res in segs), "t_fallback_s": 0.0,
            "pending_index": [s for s, _ in pending],
            "pending_prefix": [res.ssd_row.prefix if res.ssd_row else [] for _, res in pending],
            "pending_draft": [res.ssd_row.draft_tokens if res.ssd_row else [] for _, res in pending],
            "pending_states": [res.states.reshape(-1) for _, res in pending],
            "pending_shape": [list(res.states.shape) for _, res in pending],
            "pending_handle": [res.handle for _, res in pending],
            "pending_kv": [res.kv.reshape(-1) if res.kv is not None else _EMPTY for _, res in pending],
            "pending_kv_shape": [list(res.kv.shape) if res.kv is not None else [] for _, res in pending],
            "pending_next": [res.next_token if res.next_token is not None else -1 for _, res in pending],
        }
        out.append(finalize_row(out_row))
    return out


def complete_pending(rows: list[dict], finisher, max_tokens: int) -> list[dict]:
    """Finish every pending segment of ``rows`` with ``finisher`` (SSD AR fallback, CTC
    beam search), re-batched across rows under the token budget; other segments and rows
    pass through untouched. ``finisher`` has ``cost(result) -> int`` (padded tokens) and
    ``finish(results) -> seconds``, which fills the results in place."""
    work: list[tuple[int, int, SegmentResult]] = []
    for r, row in enumerate(rows):
        for k, s in enumerate(row.get("pending_index") or []):
            seg = row["segments"][s]
            prefix = list(row["pending_prefix"][k] or [])
            draft = list((row.get("pending_draft") or [[]] * (k + 1))[k] or [])
            array = np.asarray(row["pending_states"][k], dtype=np.float32).reshape(row["pending_shape"][k])
            res = SegmentResult("", PENDING, states=array, max_entropy=seg["max_entropy"],
                                min_prob=seg["min_prob"], drafted=seg["drafted"],
                                ssd_row=SSDRow(stage=None, text="", max_entropy=seg["max_entropy"] or 0.0,
                                               draft_text="", draft_tokens=draft, prefix=prefix,
                                               min_prob=seg["min_prob"]))
            res.key_phrases = row.get("key_phrases")
            res.handle = (row.get("pending_handle") or [None] * (k + 1))[k]
            kv_shape = (row.get("pending_kv_shape") or [[]] * (k + 1))[k]
            if kv_shape:
                res.kv = np.asarray(row["pending_kv"][k], dtype=np.float32).reshape(kv_shape)
                res.next_token = int(row["pending_next"][k])
            work.append((r, s, res))
    for batch in pack_by_budget([finisher.cost(w[2]) for w in work], max_tokens):
        items = [work[i][2] for i in batch]
        try:
            seconds = finisher.finish(items)
        except Exception as exc:
            seconds = 0.0
            for item in items:
                item.stage, item.error = "error", f"{type(exc).__name__} in {finisher.name}: {exc}"
        for i in batch:
            r, s, res = work[i]
            seg = rows[r]["segments"][s]
            seg.update(text=res.text, stage=res.stage, tokens=res.tokens, prefix_len=res.prefix_len,
                       generated=res.generated, error=res.error)
            rows[r]["t_fallback_s"] = (rows[r].get("t_fallback_s") or 0.0) + seconds / len(batch)
    for row in rows:
        for key, _ in PENDING_FIELDS:
            row[key] = []
        finalize_row(row)
    return rows
