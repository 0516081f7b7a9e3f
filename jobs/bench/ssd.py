"""SSD benchmark ("Self-Speculative Decoding for LLM-based ASR with CTC Encoder Drafts", Table 1 / Fig. 3 in shape): full AR, greedy CTC, the two
presets and a tau_CTC sweep, side by side on one held-out set, in one process.

Every configuration starts from the same encoder output: the encoder pass (Whisper's
fixed 30-s window) is timed once and added to each configuration's own decode time, so
RTFx = audio seconds / (encoder seconds + that configuration's seconds). This is the
same work each configuration would do alone, measured without running the encoder nine
times on a 2-core machine. Rows: WER, RTFx, %C (gated), %L (verified), %F (fallback),
mean j (accepted prefix length of verified/fallback rows).

Stage breakdown (the SSD paper's Fig. 2 in shape): every row also carries its seconds per stage
-- encoder (shared), CTC head, verify (gate + re-tokenise + the teacher-forced pass),
fallback prefill (the first decoder step after prompt + prefix; near zero when it starts
from the verification KV cache) and fallback decode (the remaining steps); full AR splits
the same way. ``high_accuracy`` is also run without KV reuse, with the output projection over every
draft position (no head chunks), with neither (the paper's path), side by side, and with each
``--verify-max-entropy`` ceiling (rows above it skip verification and go straight to AR).
With ``--lookahead K`` (default 4), both presets also run with the fallback's speculative
rounds (``ssd.lookahead``), under each rule: "greedy" (plain AR's text, faster only if
guesses are kept often enough to pay for the wider passes) and "tau_slm" (eq. 5 again after
each correction); these rows carry ``tokens_per_pass`` and ``guesses_kept``.
A row "CTC greedy, packed windows" is ctc_greedy with ``decoder.pack_windows``: short
clips share encoder passes, isolated from each other (pipeline.packing), timed with its own
encoder pass. SSD's verifier reads a clip's whole window, so the rows above run one clip
per window; the packed gate (``ssd.pack_gate``, off in both presets since a clip's text
there depends on its window neighbours) drafts and gates on shared windows and
encodes only the rejected clips alone. It changes the encoder's work, so two more rows run
the pipeline's SSD decoder (``SSDFirstPassDecoder`` + in-process fallback) end to end with
the high_rtfx thresholds, each with its own encoder passes: "SSD high_rtfx, pipeline,
unpacked gate" and "..., packed gate"; the summary's ``high_rtfx_packed_gate_*`` keys
compare them with each other and with both CTC-greedy ceilings. The packed gate row packs
a batch only where the running gate pass rate says it pays (``ssd.adaptive_pack_gate``,
pipeline.decoding.ssd.pack_gate_policy; its row counts packed and plain batches); "..., packed gate,
every batch packed" packs them all, as does "..., gate unverified" below.
Gate verification (``ssd.gate_verify_tau``, in the high_rtfx preset): drafts the gate
accepts are also verified, on their own window or, with the packed gate, on their packed
window (pipeline.decoding.ssd.packed_verify). Every high_rtfx row applies the preset's;
"SSD high_rtfx, paper gate" and "SSD high_rtfx, pipeline, packed gate, gate unverified"
are the same without it (the sweep is the paper's gate too), and the summary's
``high_rtfx_unverified_*`` keys carry them. (The other "SSD high_rtfx" rows run the
unpacked gate on the shared encoder pass; "paper gate" is the paper's method.)
``--repeat N`` times every configuration N times, round-robin, and keeps the fastest run
(timings on a shared 2-core machine drift by 20-40%).
"""
from __future__ import annotations

from pathlib import Path

from .data import concat_long_form, flat_segments, join_by_recording, load_recordings
from ...pipeline.decoding.drafting.draft_sync import LOOKAHEAD_RULES
from ...pipeline.models.base import PACKABLE
from ...pipeline.timing import timed

PAPER_GATE_ROW = "SSD high_rtfx, paper gate"
UNVERIFIED_PACKED_ROW = "SSD high_rtfx, pipeline, packed gate, gate unverified"
EVERY_BATCH_PACKED_ROW = "SSD high_rtfx, pipeline, packed gate, every batch packed"
# Per-row statistics of the speculative rounds (not seconds, unlike the other stage keys).
ROUND_STATS = ("tokens_per_pass", "guesses_kept")


def add_arguments(parser) -> None:
    parser.add_argument("--batch", type=int, default=8, help="segments per model call")
    parser.add_argument("--sweep", default="0.1,0.3,0.7,1.5,3.0,6.0", help="tau_CTC values to sweep")
    parser.add_argument("--sweep-slm", default="0.1",
                        help="tau_SLM values for the sweep (comma list; the sweep runs every pair)")
    parser.add_argument("--limit", type=int, default=0, help="use only the first N recordings")
    parser.add_argument("--plot", default=None, help="PNG path for WER vs RTFx (default: beside --out)")
    parser.add_argument("--config", default="ssd", help="config providing presets and the CTC head")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="config override, e.g. model.ctc_head=DIR")
    parser.add_argument("--verify-max-entropy", default="", metavar="NATS,...",
                        help="ssd.verify_max_entropy ceilings to try on the high_accuracy preset")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="time each configuration N times, round-robin, and keep the fastest")
    parser.add_argument("--lookahead", type=int, default=4, metavar="K",
                        help="ssd.lookahead for the speculative-round rows of both presets (0: no such rows)")
    parser.add_argument("--max-draft-error", default="", metavar="E,...",
                        help="add high_rtfx rows with the self-calibrating gate (ssd.max_draft_error) at each E")
    parser.add_argument("--calibrated-only", action="store_true",
                        help="run only full AR, CTC greedy and the --max-draft-error rows (unpacked gate, no gate "
                             "verification unless --calibrated-gate-verify)")
    parser.add_argument("--calibrated-gate-verify", action="store_true",
                        help="with --calibrated-only: the calibrated rows also verify gated drafts (high_rtfx's tau)")
    parser.add_argument("--warm-manifest", default=None, metavar="M",
                        help="calibrated-gate rows also run warmed: the gate first learns on M (untimed)")
    parser.add_argument("--long-form", type=float, default=0.0, metavar="SECONDS",
                        help="join consecutive recordings into segments of up to SECONDS (e.g. 28)")


def run(args) -> dict:
    from ...pipeline.config import load_config
    from ...pipeline.decoding.ar.greedy import greedy_decode
    from ...pipeline.decoding.ssd.decoder import AR_FALLBACK, CTC_GATE, LLM_VERIFY, SelfSpeculativeDecoder
    from ...pipeline.metrics import corpus_wer
    from ...pipeline.kinds.base import PENDING
    from ...pipeline.kinds.ctc_greedy.stage import CTCGreedySegmentDecoder
    from ...pipeline.kinds.ssd.stages import SSDFallback, SSDFirstPassDecoder
    from ...pipeline.models import load_model
    from ...pipeline.segment_runner import decode_segments

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    overrides = list(args.overrides) + ([f"model.device={args.device}"] if args.device else [])
    cfg = load_config(args.config, overrides)
    limit = args.limit or (24 if args.quick else 0)
    recordings, refs = load_recordings(args.manifest, limit, cfg)
    if args.long_form:
        recordings, refs = concat_long_form(recordings, refs, args.long_form)
    flat, audio_s = flat_segments(recordings)
    adapter = load_model(cfg.model)
    device = adapter.device
    batches = [list(range(i, min(i + args.batch, len(flat)))) for i in range(0, len(flat), args.batch)]

    # Warm-up (first calls allocate and pick kernels).
    warm = adapter.encode([flat[0][1]])
    greedy_decode(adapter, warm.states)
    adapter.ctc_draft(warm)

    encoded, t_enc = [], 0.0
    for b in batches:
        enc, t = timed(lambda: adapter.encode([flat[i][1] for i in b]), device=device)
        encoded.append(enc)
        t_enc += t
    drafts, t_ctc = [], 0.0
    for enc in encoded:
        d, t = timed(lambda: adapter.ctc_draft(enc), device=device)
        drafts.append(d)
        t_ctc += t

    def by_recording(seg_texts):
        return join_by_recording(flat, seg_texts, len(recordings))

    rows = []

    def record(name, texts, seconds, tau_ctc=None, tau_slm=None, ssd_rows=None, stages=None):
        """``ssd_rows``: (stage, prefix length) per segment."""
        n = len(flat)
        row = {"config": name, "tau_ctc": tau_ctc, "tau_slm": tau_slm,
               "wer": corpus_wer(refs, by_recording(texts)), "rtfx": audio_s / (t_enc + seconds),
               "decode_s": seconds, "pct_C": None, "pct_L": None, "pct_F": None, "mean_j": None}
        row.update({k if k in ROUND_STATS else f"s_{k}": v for k, v in {"encoder": t_enc, **(stages or {})}.items()})
        if ssd_rows is not None:
            stages = [stage for stage, _ in ssd_rows]
            row["pct_C"] = 100.0 * stages.count(CTC_GATE) / n
            row["pct_L"] = 100.0 * stages.count(LLM_VERIFY) / n
            row["pct_F"] = 100.0 * stages.count(AR_FALLBACK) / n
            js = [j for stage, j in ssd_rows if stage != CTC_GATE]
            row["mean_j"] = sum(js) / len(js) if js else None
        rows.append(row)
        return row

    def run_ar():
        texts, total, timer = [], 0.0, {}
        for enc in encoded:
            toks, t = timed(lambda: greedy_decode(adapter, enc.states, max_new_tokens=cfg.decoder.max_new_tokens,
                                                  timer=timer), device=device)
            texts += [adapter.text(x) for x in toks]
            total += t
        return texts, total, {"ar_prefill": timer.get("prefill", 0.0), "ar_decode": timer.get("decode", 0.0)}, None

    def run_ssd(tau_ctc, tau_slm, reuse_kv=True, ceiling=None, **kw):
        ssd = SelfSpeculativeDecoder(adapter, tau_ctc, tau_slm, cfg.decoder.max_new_tokens, reuse_kv=reuse_kv,
                                     verify_max_entropy=ceiling, **kw)
        out, t_verify, t_fallback, timer = [], 0.0, 0.0, {}
        for enc, d in zip(encoded, drafts):
            res, t = timed(lambda: ssd.first_pass(enc.states, d.texts, d.max_entropy), device=device)
            t_verify += t
            pending = [i for i, r in enumerate(res) if r.stage is None]
            if pending:
                _, t = timed(lambda: ssd.fallback(enc.states[pending], [res[i] for i in pending], timer), device=device)
                t_fallback += t
            out += res
        stages = {"ctc_head": t_ctc, "verify": t_verify, "fallback_prefill": timer.get("prefill", 0.0),
                  "fallback_decode": timer.get("decode", 0.0),
                  "fallback_other": t_fallback - timer.get("prefill", 0.0) - timer.get("decode", 0.0)}
        if kw.get("lookahead"):
            # Speculative rounds: decided tokens per fallback pass, draft guesses kept.
            fallback_tokens = sum(r.generated for r in out if r.stage == AR_FALLBACK)
            rounds = timer.get("rounds", 0)
            stages["tokens_per_pass"] = fallback_tokens / rounds if rounds else None
            stages["guesses_kept"] = timer.get("kept", 0) / timer["guessed"] if timer.get("guessed") else None
        return [r.text for r in out], t_ctc + t_verify + t_fallback, stages, [(r.stage, len(r.prefix)) for r in out]

    def run_packed_ctc():
        # conf/ctc_greedy.yaml's path: short clips share encoder windows, batched by the
        # pipeline's frame budget; the encoder is part of this row's own time.
        decoder = CTCGreedySegmentDecoder(adapter, pack=True)
        res, t = timed(lambda: decode_segments(decoder, [a for _, a in flat], cfg.batching.max_tokens), device=device)
        return [r.text for r in res], t

    # Each preset's (tau_ctc, tau_slm, gate_verify_tau), read once for every row below.
    thresholds = {}
    for name in ("high_accuracy", "high_rtfx"):
        preset = cfg.ssd.presets[name]
        thresholds[name] = (preset["tau_ctc"], preset["tau_slm"], preset.get("gate_verify_tau"))

    pack_decisions = {}  # label -> the PackGatePolicy of its latest run (adaptive packed gate rows)

    calibrated = {}  # label -> the GateCalibration of its latest run
    verify_decisions = {}  # label -> the VerifyPolicy of its latest run

    def run_pipeline_ssd(label, preset, pack_gate, gate_verify_tau=None, adaptive=cfg.ssd.adaptive_pack_gate,
                         max_draft_error=None, tau_cap=None, warm=None):
        # The pipeline's SSD decoder end to end, its own encoder pass(es) included: the
        # packed gate changes what the encoder does, so it cannot share the pass above.
        tc, ts, _ = thresholds[preset]
        # SSD's own rows draft every batch (what the paper measures) unless ssd.adaptive_verify
        # is set; the self-calibrating gate's rows skip where drafts do not pay, as before.
        adaptive_verify = (max_draft_error is not None if cfg.ssd.adaptive_verify is None
                           else cfg.ssd.adaptive_verify)
        decoder = SSDFirstPassDecoder(adapter, tau_cap or tc, ts, cfg.decoder.max_new_tokens,
                                      reuse_kv=cfg.ssd.reuse_kv, pack_gate=pack_gate, gate_verify_tau=gate_verify_tau,
                                      adaptive_pack_gate=adaptive, max_draft_error=max_draft_error,
                                      adaptive_verify=adaptive_verify, verify_break_even=cfg.ssd.verify_break_even)
        if decoder.ssd.gate_calibration is not None:
            calibrated[label] = decoder.ssd.gate_calibration
            if warm:
                # A longer corpus: the gate has learnt on other recordings first (untimed).
                decode_segments(decoder, warm, cfg.batching.max_tokens)
        fallback = SSDFallback(decoder.ssd, decoder.share_seeds(), verify_policy=decoder.verify_policy)
        if decoder.verify_policy is not None:
            verify_decisions[label] = decoder.verify_policy
        if decoder.pack_policy is not None:
            pack_decisions[label] = decoder.pack_policy

        def go():
            res = decode_segments(decoder, [a for _, a in flat], cfg.batching.max_tokens)
            pending = [r for r in res if r.stage == PENDING]
            for i in range(0, len(pending), args.batch):
                fallback.finish(pending[i:i + args.batch])
            return res

        res, t = timed(go, device=device)
        return [r.text for r in res], t, {}, [(r.stage, r.prefix_len or 0) for r in res]

    # (label, tau_ctc, tau_slm, run); with --repeat N every configuration runs N times,
    # round-robin so that load drift on a shared machine hits all alike; the fastest run counts.
    (ha_tc, ha_ts, _), (hr_tc, hr_ts, hr_gv) = thresholds["high_accuracy"], thresholds["high_rtfx"]
    configs = [("full AR", None, None, run_ar)]
    for name, (tc, ts, gv) in thresholds.items():
        configs.append((f"SSD {name}", tc, ts, lambda tc=tc, ts=ts, gv=gv: run_ssd(tc, ts, gate_verify_tau=gv)))
    configs.append((PAPER_GATE_ROW, hr_tc, hr_ts, lambda: run_ssd(hr_tc, hr_ts)))
    if args.lookahead:
        for name, (tc, ts, gv) in thresholds.items():
            for rule in LOOKAHEAD_RULES:
                configs.append((f"SSD {name}, lookahead {args.lookahead} {rule}", tc, ts,
                                lambda tc=tc, ts=ts, rule=rule, gv=gv:
                                run_ssd(tc, ts, lookahead=args.lookahead, lookahead_rule=rule, gate_verify_tau=gv)))
    if PACKABLE in adapter.capabilities:
        for pack_gate in (False, True):
            label = f"SSD high_rtfx, pipeline, {'packed' if pack_gate else 'unpacked'} gate"
            configs.append((label, hr_tc, hr_ts,
                            lambda p=pack_gate, lb=label: run_pipeline_ssd(lb, "high_rtfx", p, hr_gv)))
        if cfg.ssd.adaptive_pack_gate:
            configs.append((EVERY_BATCH_PACKED_ROW, hr_tc, hr_ts,
                            lambda: run_pipeline_ssd(EVERY_BATCH_PACKED_ROW, "high_rtfx", True, hr_gv, adaptive=False)))
        if hr_gv is not None:
            configs.append((UNVERIFIED_PACKED_ROW, hr_tc, hr_ts,
                            lambda: run_pipeline_ssd(UNVERIFIED_PACKED_ROW, "high_rtfx", True, adaptive=False)))
    warm_audio = None
    if args.warm_manifest:
        warm_recordings, _ = load_recordings(args.warm_manifest, 0, cfg)
        warm_audio = [a for _, a in flat_segments(warm_recordings)[0]]
    cap = cfg.ssd.tau_ctc  # the calibrated rows' cap on tau_ctc (null: high_rtfx's)
    calibrated_rows = []
    for target in [float(x) for x in args.max_draft_error.split(",") if x]:
        verify_options = (hr_gv, None) if hr_gv is not None else (None,)
        if args.calibrated_only:
            verify_options = (hr_gv if args.calibrated_gate_verify else None,)
        for gv in verify_options:
            for warmed in (None, warm_audio) if warm_audio else (None,):
                label = f"SSD high_rtfx, calibrated gate {target:g}{', gate verified' if gv else ''}" \
                        f"{', warmed' if warmed else ''}"
                calibrated_rows.append((label, cap or hr_tc, hr_ts,
                                        lambda lb=label, t=target, g=gv, w=warmed:
                                        run_pipeline_ssd(lb, "high_rtfx", False, g, max_draft_error=t, tau_cap=cap,
                                                         warm=w)))
    if args.calibrated_only:
        configs = [c for c in configs if c[0] in ("full AR", "SSD high_rtfx")]
    configs += calibrated_rows
    if not args.calibrated_only:
        configs.append(("SSD high_accuracy, no KV reuse", ha_tc, ha_ts, lambda: run_ssd(ha_tc, ha_ts, reuse_kv=False)))
        configs.append(("SSD high_accuracy, full-draft head", ha_tc, ha_ts,
                        lambda: run_ssd(ha_tc, ha_ts, verify_chunk=None)))
        configs.append(("SSD high_accuracy, paper (no reuse, full head)", ha_tc, ha_ts,
                        lambda: run_ssd(ha_tc, ha_ts, reuse_kv=False, verify_chunk=None)))
        for ceiling in [float(x) for x in args.verify_max_entropy.split(",") if x]:
            configs.append((f"SSD high_accuracy, verify_max_entropy {ceiling:g}", ha_tc, ha_ts,
                            lambda c=ceiling: run_ssd(ha_tc, ha_ts, ceiling=c)))
        sweep = [float(x) for x in args.sweep.split(",") if x]
        if args.quick:
            sweep = sweep[::2]
        for ts in [float(x) for x in str(args.sweep_slm).split(",") if x]:
            for tc in sweep:
                configs.append(("SSD sweep", tc, ts, lambda tc=tc, ts=ts: run_ssd(tc, ts)))
    best: list[tuple | None] = [None] * len(configs)
    for _ in range(max(1, args.repeat)):
        for k, (_, _, _, fn) in enumerate(configs):
            out = fn()
            if best[k] is None or out[1] < best[k][1]:
                best[k] = out
    recorded = {}
    for k, (label, tc, ts, _) in enumerate(configs):
        texts, seconds, stages, ssd_rows = best[k]
        row = recorded[label] = record(label, texts, seconds, tc, ts, ssd_rows, stages)
        if label in calibrated:
            row["rtfx"], row["s_encoder"] = audio_s / seconds, None  # its own encoder pass
            row["tau_learnt"] = calibrated[label].tau
        if label.startswith("SSD high_rtfx, pipeline"):
            row["rtfx"], row["s_encoder"] = audio_s / seconds, None  # its own encoder pass(es)
        if label in pack_decisions:
            # Of the latest run: every run starts a fresh policy and its decisions follow
            # the gate's results only, which do not change between runs.
            row["packed_batches"] = pack_decisions[label].packed_batches
            row["plain_batches"] = pack_decisions[label].plain_batches
        if label in verify_decisions:
            # Of the latest run (a fresh policy each run, or warmed with the gate): batches
            # drafted and verified, and batches decoded as plain AR (pipeline.decoding.ssd.verify_policy).
            row["drafted_batches"] = verify_decisions[label].drafted_batches
            row["skipped_batches"] = verify_decisions[label].skipped_batches
        if k == 0:
            recorded["CTC greedy"] = record("CTC greedy", [t.strip() for d in drafts for t in d.texts], t_ctc,
                                            stages={"ctc_head": t_ctc})
            if PACKABLE in adapter.capabilities:
                packed = recorded["CTC greedy, packed windows"] = record("CTC greedy, packed windows",
                                                                          *run_packed_ctc())
                packed["rtfx"] = audio_s / packed["decode_s"]  # its own encoder pass
                packed["s_encoder"] = None
    if args.calibrated_only:
        return {"rows": rows, "summary": _calibrated_summary(recorded, calibrated)}
    ar, ctc, no_reuse = recorded["full AR"], recorded["CTC greedy"], recorded["SSD high_accuracy, no KV reuse"]
    t_ar = ar["decode_s"]
    presets = {name: recorded[f"SSD {name}"] for name in ("high_accuracy", "high_rtfx")}

    plot = args.plot or (str(Path(args.out).with_suffix(".png")) if args.out else None)
    if plot:
        _plot(rows, plot)
    hr, ha = presets["high_rtfx"], presets["high_accuracy"]
    packed_rtfx = recorded["CTC greedy, packed windows"]["rtfx"] if "CTC greedy, packed windows" in recorded else None
    summary = {
        "ar_wer": ar["wer"], "ar_rtfx": ar["rtfx"], "ctc_greedy_wer": ctc["wer"],
        "ctc_greedy_rtfx": ctc["rtfx"], "ctc_greedy_packed_rtfx": packed_rtfx,
        "high_rtfx_wer": hr["wer"], "high_rtfx_rtfx": hr["rtfx"],
        "high_rtfx_unverified_wer": recorded[PAPER_GATE_ROW]["wer"],
        "high_rtfx_unverified_rtfx": recorded[PAPER_GATE_ROW]["rtfx"],
        "high_accuracy_wer": ha["wer"], "high_accuracy_rtfx": ha["rtfx"],
        "pct_ctc_gated": hr["pct_C"], "pct_llm_verified": hr["pct_L"],
        "high_accuracy_pct_ctc_gated": ha["pct_C"], "high_accuracy_pct_llm_verified": ha["pct_L"],
        "high_rtfx_share_of_ceiling": hr["rtfx"] / ctc["rtfx"],
        "high_rtfx_speedup_vs_ar": hr["rtfx"] / ar["rtfx"],
        "encoder_share_of_ar": t_enc / (t_enc + t_ar),
        "high_accuracy_rtfx_vs_ar": ha["rtfx"] / ar["rtfx"],
        "high_accuracy_kv_reuse_speedup": ha["rtfx"] / no_reuse["rtfx"],
        "high_accuracy_chunked_head_speedup": ha["rtfx"] / recorded["SSD high_accuracy, full-draft head"]["rtfx"],
        "high_accuracy_speedup_vs_paper_path":
            ha["rtfx"] / recorded["SSD high_accuracy, paper (no reuse, full head)"]["rtfx"],
        **(_pack_gate_summary(recorded, ctc["rtfx"], packed_rtfx) if packed_rtfx else {}),
        "segments": len(flat), "audio_seconds": audio_s, "device": str(device),
        **_lookahead_summary(recorded, args.lookahead),
    }
    return {"rows": rows, "summary": summary}


def _pack_gate_summary(recorded: dict, ceiling_rtfx: float, packed_ceiling_rtfx: float | None) -> dict:
    """high_rtfx through the pipeline's decoder with the packed gate (adaptive where
    ``ssd.adaptive_pack_gate``, as the pipeline runs it), against the same decoder with the
    unpacked gate, with every batch packed, and against both CTC-greedy ceilings (and,
    where the preset verifies its gate, every batch packed without that verification)."""
    on, off = (recorded[f"SSD high_rtfx, pipeline, {k} gate"] for k in ("packed", "unpacked"))
    unverified, every = recorded.get(UNVERIFIED_PACKED_ROW), recorded.get(EVERY_BATCH_PACKED_ROW)
    return {**({"high_rtfx_every_batch_packed_rtfx": every["rtfx"], "high_rtfx_every_batch_packed_wer": every["wer"],
                "high_rtfx_packed_batches": on.get("packed_batches"),
                "high_rtfx_plain_batches": on.get("plain_batches")} if every else {}),
            **({"high_rtfx_unverified_packed_gate_rtfx": unverified["rtfx"],
                "high_rtfx_unverified_packed_gate_wer": unverified["wer"],
                "high_rtfx_unverified_packed_gate_pct_ctc_gated": unverified["pct_C"]} if unverified else {}),
            "high_rtfx_packed_gate_rtfx": on["rtfx"], "high_rtfx_packed_gate_wer": on["wer"],
            "high_rtfx_packed_gate_pct_ctc_gated": on["pct_C"],
            "high_rtfx_unpacked_gate_pipeline_rtfx": off["rtfx"], "high_rtfx_unpacked_gate_pipeline_wer": off["wer"],
            "high_rtfx_packed_gate_speedup": on["rtfx"] / off["rtfx"],
            "high_rtfx_packed_gate_share_of_ceiling": on["rtfx"] / ceiling_rtfx,
            "high_rtfx_packed_gate_share_of_packed_ceiling":
                on["rtfx"] / packed_ceiling_rtfx if packed_ceiling_rtfx else None}


def _calibrated_summary(recorded: dict, calibrated: dict) -> dict:
    """Per calibrated-gate row: WER and RTFx relative to full AR in the same run, the share
    of segments the gate accepted and the threshold it had learnt by the end."""
    ar = recorded["full AR"]
    fixed = recorded["SSD high_rtfx"]
    out = {"ar_wer": ar["wer"], "ar_rtfx": ar["rtfx"], "ctc_greedy_rtfx": recorded["CTC greedy"]["rtfx"],
           "high_rtfx_fixed_gate": {"wer": fixed["wer"], "rtfx_vs_ar": fixed["rtfx"] / ar["rtfx"],
                                    "pct_ctc_gated": fixed["pct_C"]}}
    for label in calibrated:
        row = recorded[label]
        out[label] = {"wer": row["wer"], "wer_rel_ar": row["wer"] / ar["wer"] if ar["wer"] else None,
                      "rtfx": row["rtfx"], "rtfx_vs_ar": row["rtfx"] / ar["rtfx"], "pct_ctc_gated": row["pct_C"],
                      "tau_learnt": row["tau_learnt"], "drafted_batches": row.get("drafted_batches"),
                      "skipped_batches": row.get("skipped_batches")}
    return out


def _lookahead_summary(recorded: dict, k: int) -> dict:
    """Per preset and rule: RTFx and WER of speculative rounds against the preset's plain fallback."""
    out = {}
    for name in ("high_accuracy", "high_rtfx") if k else ():
        base = recorded[f"SSD {name}"]
        for rule in LOOKAHEAD_RULES:
            row = recorded[f"SSD {name}, lookahead {k} {rule}"]
            out[f"{name}_lookahead_{rule}_speedup"] = row["rtfx"] / base["rtfx"]
            out[f"{name}_lookahead_{rule}_wer"] = row["wer"]
            out[f"{name}_lookahead_{rule}_tokens_per_pass"] = row.get("tokens_per_pass")
    return out


def _plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from .data import save_figure

    fig, ax = plt.subplots(figsize=(6, 4))
    sweep = [r for r in rows if r["config"] == "SSD sweep" and r["wer"] is not None]
    for ts in sorted({r["tau_slm"] for r in sweep}):
        line = [r for r in sweep if r["tau_slm"] == ts]
        ax.plot([r["rtfx"] for r in line], [100 * r["wer"] for r in line], "o-",
                label=f"SSD tau_CTC sweep (tau_SLM {ts:g})")
        for r in line:
            ax.annotate(f"{r['tau_ctc']:g}", (r["rtfx"], 100 * r["wer"]), fontsize=7)
    for r in rows:
        if r["config"] != "SSD sweep" and r["wer"] is not None:
            ax.plot(r["rtfx"], 100 * r["wer"], "s", label=r["config"])
    ax.set_xlabel("RTFx")
    ax.set_ylabel("WER (%)")
    ax.set_title("Self-speculative decoding: WER vs RTFx")
    ax.legend(fontsize=7)
    save_figure(fig, path, dpi=120)
