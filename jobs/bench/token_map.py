"""Token-map drafting benchmark ("Model-free Speculative Decoding for Transformer-based ASR
with Token Map Drafting", Table I and Fig. 3 in shape): plain greedy AR against AR drafted
from a token map, on three sets, in one process.

Sets: (a) ``domain``: structured maintenance sentences (pipeline.training.tts.domain_text) said by
held-out voices, the map built from other sentences of the same generator (the test
sentences excluded); (b) ``general``: prose sentences (pipeline.training.tts.text_sources) said by
held-out voices, the same domain map; (c) ``real``: human and recorded speech
(``--real-manifest``, default: the bundled human recording and the alsa-utils channel
announcements where /usr/share/sounds/alsa has them), the same map.

Per set the encoder runs once (timed: the encoder-bound ceiling is audio seconds / encoder
seconds) and every configuration decodes the same encoder states in batches of
``--batch``; decode times are the fastest of ``--repeat`` round-robin runs. Rows: decode
seconds, decoder-time speedup over AR, end-to-end RTFx (audio / (encoder + decode)), its
share of the ceiling, whether every segment's tokens equal AR's, the acceptance rate A_r
(accepted draft tokens / draft tokens fed: with K > 1 candidates per pass this counts every
node of the candidate tree) and the mean accepted length A_l (per row and drafting pass).
Clock: with ``--threads 1`` on CPU (the default here) every time is this process's CPU
time (``time.process_time``), and the adaptive rows' policy times passes with it too: on
a 2-core machine shared with other jobs, wall time moved 2-3x between identical runs,
while one thread's CPU time is what its wall time is on an idle core. Otherwise wall time
(device synchronised). ``adaptive`` rows switch drafting off where it does not pay (pipeline.decoding.drafting.token_map_policy, as
``token_map.adaptive`` does); the others draft on every pass. On the domain set a sweep
over K (candidates) at the main N and over N (map order) at the main K (every pair with
``--full-grid``) draws decode time against K (--plot). Per set, ``bound`` rows give the
ceiling (pipeline.decoding.drafting.token_map_replay): plain AR's tokens replayed through the
lookup give drafting's passes exactly, and priced with this machine's plain-step cost
(per pass and per alive row, fitted from AR batched and AR one segment at a time) they
bound the decoder-time speedup of any tree pass that costs at least a plain step; for the
main rows' map, the best map/K/draft length, and a map that is always right. With ``--ssd``
the SSD fallback (high_accuracy preset, the embedded CTC head) runs with its two draft
sources, the rest of the CTC draft (``ssd.lookahead``) and the token map, alone and in
both orders; those rows time the fallback only.

With ``--online`` every set also gets the rows of a map built online
(``token_map.online``, pipeline.decoding.drafting.token_map_online): empty at the start of each
run, it learns each batch's tokens once the batch is decoded (learning is timed with the
decode), adaptive and always drafting, and its bound row (the same replay, the map
growing batch by batch). Set (d) ``samples``: the bundled samples, said ``--copies`` times
over in order (a corpus that repeats itself, where the online map has the most to draft).
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import time

from .data import heldout_voice_speech, load_recordings
from ...pipeline.timing import synchronize

ALSA_DIR = Path("/usr/share/sounds/alsa")
SAMPLES = Path(__file__).resolve().parents[2] / "pipeline/assets/samples"


def add_arguments(parser) -> None:
    parser.add_argument("--batch", type=int, default=8, help="segments per decoder call")
    parser.add_argument("--domain", type=int, default=48, help="held-out domain sentences (quick: 16)")
    parser.add_argument("--general", type=int, default=24, help="held-out prose sentences (quick: 8)")
    parser.add_argument("--map-sentences", type=int, default=3000, help="domain sentences the map is built from")
    parser.add_argument("--real-manifest", default=None, help="real clips (default: beckett + alsa announcements)")
    parser.add_argument("--candidates", type=int, default=None, help="K of the main rows (default: the config's)")
    parser.add_argument("--max-draft", type=int, default=None, help="tokens per candidate (default: the config's)")
    parser.add_argument("--min-share", type=float, default=None, help="the maps' min share (default: build-token-map's)")
    parser.add_argument("--order", type=int, default=3, help="N of the main rows' map")
    parser.add_argument("--sweep-k", default="1,2,3,4")
    parser.add_argument("--sweep-n", default="1,2,3,4")
    parser.add_argument("--full-grid", action="store_true",
                        help="sweep every (K, N) pair (default: K at the main N, N at the main K)")
    parser.add_argument("--repeat", type=int, default=0, help="round-robin runs, fastest kept (default 2, quick 1)")
    parser.add_argument("--ssd", action="store_true", help="also the SSD fallback's draft-source orders (domain)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: times are CPU times)")
    parser.add_argument("--config", default="ssd", help="config naming the model (and CTC head for --ssd)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--sets", default="domain,general,real", help="which sets to run (comma list; also: samples)")
    parser.add_argument("--online", action="store_true", help="also a map built online from each set's own tokens")
    parser.add_argument("--copies", type=int, default=4, help="times the samples set says the bundled samples")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--plot", default=None, help="PNG of decode time vs K (default: beside --out)")


def _domain_split(n_test: int, n_map: int, seed: int):
    from ...pipeline.training.tts.domain_text import domain_sentences

    sents = domain_sentences(n_test + n_map, seed)
    return sents[:n_test], [s["text"] for s in sents[n_test:]]


def _general(n: int) -> list[dict]:
    from ...pipeline.training.tts.text_sources import prose_sentences

    pool = [s for sents in prose_sentences().values() for s in sents]
    step = max(1, len(pool) // max(1, n))
    return [{"text": s, "spoken": s} for s in pool[::step][:n]]


def _real_manifest(path: str | None, tmp: Path) -> str:
    if path:
        return path
    rows = [{"id": "beckett", "audio": str(SAMPLES / "beckett_human.flac"),
             "text": "Ever tried, ever failed. No matter, try again. Fail again. Fail better."}]
    for pos in ("Front", "Rear", "Side"):
        for side in ("Left", "Right", "Center"):
            wav = ALSA_DIR / f"{pos}_{side}.wav"
            if wav.exists():
                rows.append({"id": f"alsa_{pos}_{side}", "audio": str(wav), "text": f"{pos} {side.lower()}."})
    out = tmp / "real.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(out)


def run(args) -> dict:
    import torch

    from ...pipeline.audio import SAMPLE_RATE
    from ...pipeline.config import load_config
    from ...pipeline.decoding.ar.greedy import greedy_decode
    from ...pipeline.decoding.drafting.drafters import NO_DRAFT, TokenMapDrafter
    from ...pipeline.decoding.drafting.token_map import build_token_map
    from ...pipeline.decoding.drafting.token_map_online import OnlineTokenMap
    from ...pipeline.decoding.drafting.token_map_policy import DraftPolicy
    from ...pipeline.models import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    overrides = list(args.overrides) + ([f"model.device={args.device}"] if args.device else [])
    cfg = load_config(args.config, overrides)
    adapter = load_model(cfg.model)
    device = adapter.device
    cpu_clock = args.threads == 1 and device.type == "cpu"
    clock = time.process_time if cpu_clock else time.perf_counter

    def timed(fn, *a, **kw):
        synchronize(device)
        t0 = clock()
        out = fn(*a, **kw)
        synchronize(device)
        return out, clock() - t0

    repeat = args.repeat or (2 if args.quick else 3)
    n_domain, n_general = (16, 8) if args.quick else (args.domain, args.general)

    test, map_text = _domain_split(n_domain, args.map_sentences, args.seed)
    tokenised = [adapter.tokenize(t) for t in map_text]
    orders = sorted({args.order} | {int(x) for x in args.sweep_n.split(",") if x})
    share = {} if args.min_share is None else {"min_share": args.min_share}
    maps = {n: build_token_map(tokenised, order=n, **share) for n in orders}
    grid_maps = _grid_maps(tokenised, args)   # the same for every set: built once

    chosen = [x for x in args.sets.split(",") if x]
    sets = {}
    if "domain" in chosen:
        sets["domain"] = [a for _, a in heldout_voice_speech(test, args.seed)]
    if "general" in chosen:
        sets["general"] = [a for _, a in heldout_voice_speech(_general(n_general), args.seed + 1)]
    if "real" in chosen:
        with tempfile.TemporaryDirectory() as tmp:
            recordings, _ = load_recordings(_real_manifest(args.real_manifest, Path(tmp)), 0, cfg)
        sets["real"] = [a for segs in recordings for a in segs]
    if "samples" in chosen:
        recordings, _ = load_recordings(str(SAMPLES / "samples.jsonl"), 0, cfg)
        sets["samples"] = [a for segs in recordings for a in segs] * args.copies

    warm = adapter.encode([next(iter(sets.values()))[0]])
    eot = adapter.eot_id
    limit = min(cfg.decoder.max_new_tokens, adapter.max_positions - len(adapter.batch_prompts(warm.states)[0]))
    greedy_decode(adapter, warm.states)
    greedy_decode(adapter, warm.states, drafter=TokenMapDrafter(maps[args.order], 2, 8))

    rows, summary = [], {}
    for name, audios in sets.items():
        audio_s = sum(len(a) for a in audios) / SAMPLE_RATE
        batches, t_enc = [], 0.0
        for i in range(0, len(audios), args.batch):
            enc, t = timed(adapter.encode, audios[i:i + args.batch])
            batches.append(enc)
            t_enc += t

        def decode(drafting_factory):
            def go():
                out, timer = [], {}
                drafting = drafting_factory() if drafting_factory else None
                for enc in batches:
                    tokens = greedy_decode(adapter, enc.states, max_new_tokens=cfg.decoder.max_new_tokens,
                                           drafter=drafting or NO_DRAFT, timer=timer)
                    if drafting is not None:
                        drafting.learn(tokens)   # an online map grows as the decoders' does
                    out += tokens
                return out, timer, drafting
            return go

        K, N = args.candidates or cfg.token_map.candidates, args.order
        D = args.max_draft or cfg.token_map.max_draft
        configs = [("AR", None, None, None),
                   (f"token map K={K} N={N} adaptive", K, N,
                    lambda: TokenMapDrafter(maps[N], K, D, DraftPolicy(clock=clock))),
                   (f"token map K={K} N={N} always", K, N, lambda: TokenMapDrafter(maps[N], K, D))]
        if args.online:
            configs += [(f"online map K={K} adaptive", K, None,
                         lambda: TokenMapDrafter(OnlineTokenMap(max_len=D), K, D, DraftPolicy(clock=clock))),
                        (f"online map K={K} always", K, None, lambda: TokenMapDrafter(OnlineTokenMap(max_len=D), K, D))]
        if name == "domain":
            sweep_k = [int(x) for x in args.sweep_k.split(",") if x]
            sweep_n = [int(x) for x in args.sweep_n.split(",") if x]
            grid = [(k, n) for n in sweep_n for k in sweep_k] if args.full_grid else \
                [(k, N) for k in sweep_k] + [(K, n) for n in sweep_n]
            for k, n in dict.fromkeys(grid):
                if (k, n) != (K, N):
                    configs.append((f"sweep K={k} N={n}", k, n, lambda k=k, n=n: TokenMapDrafter(maps[n], k, D)))
        best = [None] * len(configs)
        for _ in range(repeat):
            for c, (_, _, _, factory) in enumerate(configs):
                out, secs = timed(decode(factory))
                if best[c] is None or secs < best[c][1]:
                    best[c] = (out, secs)
        (ar_tokens, _, _), t_ar = best[0]
        for c, (label, k, n, _) in enumerate(configs):
            (tokens, timer, drafting), secs = best[c]
            policy = drafting.policy if drafting is not None else None
            row = {"set": name, "config": label, "K": k, "N": n, "segments": len(audios), "audio_s": audio_s,
                   "decode_s": secs, "speedup": t_ar / secs, "rtfx": audio_s / (t_enc + secs),
                   "share_of_ceiling": t_enc / (t_enc + secs), "identical": tokens == ar_tokens,
                   "A_r": timer["tm_accepted"] / timer["tm_drafted"] if timer.get("tm_drafted") else None,
                   "A_l": timer["tm_accepted"] / timer["tm_rounds"] if timer.get("tm_rounds") else None,
                   "drafting_passes": timer.get("tm_passes"), "plain_passes": timer.get("tm_plain_passes"),
                   "policy_off": policy.plain_passes if policy is not None else None}
            rows.append(row)
        main = next(r for r in rows if r["set"] == name and r["config"].endswith("adaptive"))
        always = next(r for r in rows if r["set"] == name and r["config"].endswith("always"))
        summary[name] = {"segments": len(audios), "audio_s": audio_s, "encoder_s": t_enc, "ar_decode_s": t_ar,
                         "encoder_share_of_ar": t_enc / (t_enc + t_ar), "ar_rtfx": audio_s / (t_enc + t_ar),
                         "ceiling_rtfx": audio_s / t_enc, "ar_share_of_ceiling": t_enc / (t_enc + t_ar),
                         "speedup": main["speedup"], "rtfx": main["rtfx"], "share_of_ceiling": main["share_of_ceiling"],
                         "rtfx_vs_ar": main["rtfx"] / (audio_s / (t_enc + t_ar)),
                         "A_r": main["A_r"], "A_l": main["A_l"], "always_speedup": always["speedup"],
                         "always_A_r": always["A_r"], "always_A_l": always["A_l"],
                         "identical": all(r["identical"] for r in rows if r["set"] == name)}
        if args.online:
            online = {r["config"].split()[-1]: r for r in rows if r["set"] == name and r["config"].startswith("online")}
            summary[name]["online"] = {"speedup": online["adaptive"]["speedup"],
                                       "rtfx_vs_ar": online["adaptive"]["rtfx"] / (audio_s / (t_enc + t_ar)),
                                       "always_speedup": online["always"]["speedup"],
                                       "A_l": online["adaptive"]["A_l"], "always_A_l": online["always"]["A_l"]}
        # Plain AR once more with every segment alone: with the batched run it fits what a
        # decoder step costs per pass and per row (_replay).
        alone = [enc.states[i:i + 1] for enc in batches for i in range(enc.states.shape[0])]

        def decode_alone():
            timer = {}
            for st in alone:
                greedy_decode(adapter, st, max_new_tokens=cfg.decoder.max_new_tokens, timer=timer)
            return timer
        t_alone = min((timed(decode_alone) for _ in range(min(2, repeat))), key=lambda x: x[1])
        steps = _step_seconds(best[0][0][1], t_ar), _step_seconds(*t_alone)
        summary[name]["replay"], bound_rows = _replay(ar_tokens, grid_maps, maps, args, K, N, D, limit, eot,
                                                      always["speedup"], t_ar, steps)
        rows += [{"set": name, "segments": len(audios), "audio_s": audio_s, **r} for r in bound_rows]
        if name == "domain" and args.ssd:
            rows += _ssd_rows(adapter, cfg, batches, maps[N], K, D, repeat, timed)
            summary["ssd_fallback"] = {r["config"]: r["speedup"] for r in rows if r["config"].startswith("SSD")}
    bars = {"domain": 1.37, "general": 0.97, "real": 0.97}
    summary["targets"] = {f"{name}_speedup_ge_{bar}": summary[name]["speedup"] >= bar
                          for name, bar in bars.items() if name in summary}
    summary["device"] = str(device)
    summary["clock"] = "process CPU time" if cpu_clock else "wall"
    plot = args.plot or (str(Path(args.out).with_suffix(".png")) if args.out else None)
    if plot and "domain" in sets:
        _plot([r for r in rows if r["set"] == "domain"], plot)
    return {"rows": rows, "summary": summary}


def _step_seconds(timer: dict, seconds: float) -> float:
    """The part of a decode's ``seconds`` after the prefill pass (the timer's own clock
    gives the share)."""
    total = timer.get("prefill", 0.0) + timer.get("decode", 0.0)
    return seconds * timer.get("decode", 0.0) / total if total else 0.0


def _grid_maps(tokenised, args) -> dict:
    """The bound grid's maps, keyed (order, min count, min share): every order, pruned as
    the bench's maps are or far less, eight candidates kept per key."""
    from ...pipeline.decoding.drafting.token_map import DEFAULT_MIN_SHARE, build_token_map

    share = DEFAULT_MIN_SHARE if args.min_share is None else args.min_share
    return {(n, c, sh): build_token_map(tokenised, order=n, min_count=c, min_share=sh, keep=8)
            for n in range(1, 5) for c, sh in ((2, share), (2, 0.0), (1, 0.0))}


def _replay(ar_tokens, grid_maps, maps, args, K, N, D, limit, eot, always_speedup, t_ar, steps):
    """The set's drafting bounds from plain AR's tokens (pipeline.decoding.drafting.token_map_replay):
    the main rows' map, K and draft length; the best over orders 1-4, K 1, 2, 4, 8, drafts
    of 4, 8 and 16 tokens, and maps pruned as the bench's or keeping every follower seen
    twice or once; a map that is always right. Each bound gives a candidate-tree pass the cost of a
    one-token step. ``pass_ratio`` counts passes, ``row_pass_ratio`` passes times alive
    rows; ``bound`` prices them with this machine's step cost, a + b x alive rows, fitted
    from plain AR's step seconds batched and alone (``steps``), the prefill pass (the same
    in both) included: the decoder-time speedup no tree pass that costs more than a
    plain step can beat."""
    from ...pipeline.decoding.drafting.drafters import TokenMapDrafter
    from ...pipeline.decoding.drafting.token_map_online import OnlineTokenMap, replay_online
    from ...pipeline.decoding.drafting.token_map_replay import oracle, replay_drafting

    def bound(m, k, d):
        md = TokenMapDrafter(m, k, d)
        return replay_drafting(ar_tokens, lambda _, h, room: md.propose(h, room, eot, None), args.batch, limit, eot)

    main = bound(maps[N], K, D)
    batches, segments = -(-len(ar_tokens) // args.batch), len(ar_tokens)
    # AR's steps: batched, P passes over R row-passes; alone, every row-pass is a pass.
    P, R = main.ar_passes - batches, main.ar_row_passes - segments
    batched, solo = steps
    per_pass_and_row = solo / R if R else 0.0                    # a + b
    a = min(max((per_pass_and_row * R - batched) / (R - P), 0.0), per_pass_and_row) if R > P else 0.0
    b = per_pass_and_row - a
    prefill = t_ar - batched

    def seconds(passes: int, row_passes: int) -> float:
        return prefill + a * (passes - batches) + b * (row_passes - segments)

    def priced(r) -> float:
        # against the model's own AR time: t_ar itself unless a or b was clipped at 0
        return seconds(r.ar_passes, r.ar_row_passes) / seconds(r.passes, r.row_passes)

    grid = {(n, c, sh, k, d): bound(m, k, d) for (n, c, sh), m in grid_maps.items()
            for k in (1, 2, 4, 8) for d in (4, 8, 16)}
    (bn, bc, bsh, bk, bd), best = max(grid.items(), key=lambda kv: priced(kv[1]))
    right = {d: oracle(ar_tokens, d, args.batch, limit, eot) for d in (D, 16)}

    def summary(r) -> dict:
        return {"bound": priced(r), "pass_ratio": r.pass_ratio, "row_pass_ratio": r.row_pass_ratio,
                "A_l": r.tm_accepted / max(1, r.tm_rounds)}
    out = {"step_cost": {"per_pass_s": a, "per_row_s": b, "prefill_s": prefill},
           "main": {"K": K, "N": N, "max_draft": D, **summary(main),
                    "always_share_of_bound": always_speedup / priced(main)},
           "best": {"K": bk, "N": bn, "max_draft": bd, "min_count": bc, "min_share": bsh,
                    **summary(best),
                    "max_pass_ratio": max(r.pass_ratio for r in grid.values()),
                    "max_row_pass_ratio": max(r.row_pass_ratio for r in grid.values())},
           "oracle": {str(d): summary(r) for d, r in right.items()}}
    rows = [{"config": f"bound: K={K} N={N} draft {D}", "K": K, "N": N, "speedup": priced(main)},
            {"config": f"bound: best, K={bk} N={bn} draft {bd}", "K": bk, "N": bn, "speedup": priced(best)}]
    rows += [{"config": f"bound: always-right map, draft {d}", "speedup": priced(r)} for d, r in right.items()]
    if args.online:
        grown = replay_online(ar_tokens, TokenMapDrafter(OnlineTokenMap(max_len=D), K, D), args.batch, limit, eot)
        out["online"] = {"K": K, "max_draft": D, **summary(grown)}
        rows.append({"config": f"bound: online map K={K} draft {D}", "K": K, "speedup": priced(grown)})
    return out, rows


def _ssd_rows(adapter, cfg, batches, token_map, k, max_draft, repeat, timed) -> list[dict]:
    """The SSD fallback (high_accuracy thresholds) with each draft-source arrangement; the
    first pass runs untimed before every timed fallback (it makes the rows and seeds the
    fallback consumes)."""
    from ...pipeline.decoding.drafting.drafters import TokenMapDrafter
    from ...pipeline.decoding.ssd.decoder import SelfSpeculativeDecoder

    tau_ctc, tau_slm = cfg.ssd.presets["high_accuracy"]["tau_ctc"], cfg.ssd.presets["high_accuracy"]["tau_slm"]
    drafts = [adapter.ctc_draft(enc) for enc in batches]
    arrangements = [("SSD fallback plain", 0, None), ("SSD fallback lookahead 4", 4, None),
                    ("SSD fallback token map", 0, True), ("SSD fallback map then lookahead", 4, True),
                    ("SSD fallback lookahead then map", 4, False)]
    best = {}
    for _ in range(repeat):
        for label, look, map_first in arrangements:
            md = TokenMapDrafter(token_map, k, max_draft, map_first=map_first) if map_first is not None else None
            ssd = SelfSpeculativeDecoder(adapter, tau_ctc, tau_slm, cfg.decoder.max_new_tokens, lookahead=look,
                                         map_drafting=md)
            total, tokens, fallback_rows = 0.0, [], 0
            for enc, d in zip(batches, drafts):
                res = ssd.first_pass(enc.states, d.texts, d.max_entropy)
                pending = [i for i, r in enumerate(res) if r.stage is None]
                fallback_rows += len(pending)
                if pending:
                    _, t = timed(ssd.fallback, enc.states[pending], [res[i] for i in pending])
                    total += t
                tokens += [r.tokens for r in res]
            if label not in best or total < best[label][0]:
                best[label] = (total, tokens, fallback_rows)
    base_s, base_tokens, _ = best["SSD fallback plain"]
    return [{"set": "domain", "config": label, "K": k if mf is not None else None, "decode_s": best[label][0],
             "speedup": base_s / best[label][0] if best[label][0] else None,
             "identical": best[label][1] == base_tokens, "segments": best[label][2]}
            for label, _, mf in arrangements]


def _plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from .data import save_figure

    fig, ax = plt.subplots(figsize=(6, 4))
    ar = next(r for r in rows if r["config"] == "AR")
    drafted = [r for r in rows if r.get("K") is not None and not r["config"].endswith("adaptive")
               and not r["config"].startswith(("SSD", "bound", "online"))]
    for n in sorted({r["N"] for r in drafted}):
        line = sorted((r for r in drafted if r["N"] == n), key=lambda r: r["K"])
        ax.plot([r["K"] for r in line], [r["decode_s"] for r in line], "o-", label=f"token map, N={n}")
    ax.axhline(ar["decode_s"], color="k", linestyle="--", label="plain AR")
    ax.set_xlabel("K (candidates per row and pass)")
    ax.set_ylabel("decode seconds")
    ax.set_title("Token-map drafting: decode time vs K (domain set)")
    ax.legend(fontsize=7)
    save_figure(fig, path, dpi=120)
