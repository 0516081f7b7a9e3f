"""`shardscribe bench ctc-beam`: FlexCTC ("FlexCTC: GPU-powered CTC Beam Decoding") vs pyctcdecode vs flashlight-text on
IDENTICAL log-probs and the same LM text, side by side in one process.

Rows: WER and ms/utterance for greedy; ours at beams 4/8/16/64 x batch 1/8/32 with and
without LM, 0/100/1000 key phrases, FLToP ("FLToP CTC: Frame-Level Token Pruning via Relative Threshold") off/on with the average number of
surviving hypotheses; flashlight-text's LexiconFreeDecoder on the same token-level ARPA;
pyctcdecode with a word-level KenLM built from the same text (it cannot use a token LM).

Inputs: ``--manifest FILE.jsonl`` runs the embedded Whisper encoder + CTC head
(``--ctc-head``) over held-out audio with references (``--save-logprobs`` keeps them);
``--lm-text`` is the in-domain LM text (e.g. the TTS corpus's train.jsonl). Or
``--logprobs FILE.safetensors`` (tensors ``log_probs`` [N, T, 96] over
``pipeline.text.charset``, ``lengths`` [N]; metadata ``texts``: JSON list of references)
holds real encoder outputs (the embedded CTC head on held-out audio). Without it the
bench SIMULATES CTC posteriors from held-out sentences of Python's language reference
(``pipeline.training.sample_text``): 1-2 frames per character and 0-2 blank frames between
them, noisy logits, and a competing character on a share of the frames (case flips,
neighbouring letters, random characters) that sometimes wins. The LM is a character
6-gram (lmplz) on the other sentences; key phrases are the held-out words that are rare
or absent in the LM text (plus distractors for the 1000 list). Simulated numbers say how
the decoders compare on identical inputs, not what WER a real model gets.

Speed is single-threaded CPU (torch.set_num_threads(1)) unless --device says otherwise;
every ratio in ``summary`` is measured in this run: the speed-ups against pyctcdecode and
flashlight and FLToP's come from the four beam-8 LM decoders timed in turn, several rounds
(``headline_ms_per_utt``), so that a slow spell of a shared machine cannot favour one.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

from .ctc_beam_runs import FLTOP_PAPER, decode_ours, utterance_rows
from .data import (best_of, domain_phrases, interleaved_ms_per_utt, key_phrases, pad_log_probs,
                   read_lm_text, simulate_log_probs, simulate_token_log_probs, split_text)
from ...pipeline.metrics import corpus_wer_lowercase, phrase_fscore
from ...pipeline.timing import timed

SUMMARY_BEAM = 8
SUMMARY_BATCH = 32


def add_arguments(parser) -> None:
    parser.add_argument("--logprobs", help="safetensors with log_probs, lengths (+ texts metadata)")
    parser.add_argument("--ctc-head", default="embedded", help="with --manifest: the CTC head to run")
    parser.add_argument("--save-logprobs", help="with --manifest: also write the log-probs here")
    parser.add_argument("--lm-text", nargs="+", help="LM training text files (lines, or JSONL with 'text'), "
                        "e.g. the TTS corpora's train.jsonl; default: Python reference sentences other than "
                        "the references")
    parser.add_argument("--key-phrases", help="the 100-phrase boosting list: a file (one phrase a line) or "
                        "'domain' (the maintenance vocabulary of pipeline.training.tts.domain_text); default: rare "
                        "held-out words")
    parser.add_argument("--utterances", type=int, default=None,
                        help="held-out utterances (default 96; quick 32, or 16 with --manifest)")
    parser.add_argument("--alpha", type=float, default=0.5, help="LM weight (natural-log units)")
    parser.add_argument("--beta", type=float, default=0.0,
                        help="insertion bonus per token (flashlight's lexicon-free decoder has none)")
    parser.add_argument("--alpha-boost", type=float, default=0.2,
                        help="boosting weight (character-level phrase trees want a small one)")
    parser.add_argument("--no-case-variants", action="store_true",
                        help="boost each phrase only as given (default: also with its first letter's case "
                        "flipped, as beam.boost_case_variants does; pyctcdecode gets the same hotwords)")
    parser.add_argument("--flop-top-n", type=int, default=8)
    parser.add_argument("--flop-ratio", type=float, default=5e-4)
    parser.add_argument("--reps", type=int, default=None, help="timing repetitions, min taken (default 3, quick 2)")
    parser.add_argument("--prune-threshold", type=float, default=12.0, help="theta (the FlexCTC paper uses 12)")
    parser.add_argument("--plot", help="PNG path (default: beside --out, else ctc_beam.png)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", help="also bench a ctc-family checkpoint DIR (or random:parakeet-ctc-0.6b) "
                        "for speed in its own vocabulary, and time words on the embedded model "
                        "(jobs/bench/ctc_beam_model.py)")


# ----------------------------------------------------------------------- inputs
def manifest_log_probs(manifest: str, head: str, device: str | None, limit: int, batch: int = 8):
    """Real encoder outputs: the embedded Whisper encoder + CTC head over the first ``limit``
    rows (with references) of a manifest."""
    from ...pipeline.audio import decode_audio
    from ...pipeline.models.whisper.adapter import load_whisper_adapter
    from ...pipeline.sources import read_bytes, read_source

    rows = [r for r in read_source(manifest) if r.get("reference")][:limit]
    adapter = load_whisper_adapter("embedded", device=device or "cpu", ctc_head=head)
    chunks, refs = [], []
    for start in range(0, len(rows), batch):
        part = rows[start:start + batch]
        enc = adapter.encode([decode_audio(read_bytes(r))[0] for r in part])
        draft = adapter.ctc_draft(enc)
        chunks += [draft.log_probs[j, : int(draft.lengths[j])].float().cpu() for j in range(len(part))]
        refs += [r["reference"] for r in part]
    return (*pad_log_probs(chunks), refs)


def save_log_probs(path: str, log_probs, lengths, texts) -> None:
    from safetensors.torch import save_file

    save_file({"log_probs": log_probs.contiguous(), "lengths": lengths.contiguous()}, path,
              metadata={"texts": json.dumps(texts)})


def load_log_probs(path: str):
    from safetensors import safe_open
    from safetensors.torch import load_file

    tensors = load_file(path)
    with safe_open(path, framework="pt") as fh:
        meta = fh.metadata() or {}
    return tensors["log_probs"].float(), tensors["lengths"].long(), json.loads(meta.get("texts", "[]"))


# ------------------------------------------------------------------- decoders
def build_lms(train: list[str], workdir: Path):
    """Token-level char 6-gram (ours + flashlight) and word 4-gram (pyctcdecode), same text."""
    from ...pipeline.lm.build import build_lm, run_lmplz

    text = workdir / "train.txt"
    text.write_text("\n".join(train) + "\n")
    info = build_lm([str(text)], order=6, tokenizer="chars", output_dir=workdir / "char")
    words = workdir / "words.txt"
    words.write_text("\n".join(" ".join(s.split()) for s in train) + "\n")
    run_lmplz(words, workdir / "words.arpa", order=4)
    return info["arpa"], info["tensors"], str(workdir / "words.arpa")


# ------------------------------------------------------------------------- run
def run(args) -> dict:
    # the LMs (and with --model a full-size random checkpoint, ~2.3 GB) live only as long
    # as the run
    with tempfile.TemporaryDirectory(prefix="bench-ctc-beam-") as work:
        return _run(args, Path(work))


def _run(args, work: Path) -> dict:
    import torch

    from ...pipeline.decoding.ctc_beam import CTCBeamSearch
    from ...pipeline.models.ctc_greedy import ctc_greedy
    from ...pipeline.decoding.ctc_beam.flop import surviving_tokens
    from ...pipeline.lm.boosting import BoostingTree, case_variants
    from ...pipeline.lm.ngpu_lm import NGramLM
    from ...pipeline.text import charset

    torch.set_num_threads(1)
    quick = bool(getattr(args, "quick", False))
    from_audio = bool(getattr(args, "manifest", None) and not args.logprobs)
    # quick + audio: the encoder runs on the CPU here (~1 s a clip), so fewer clips
    n_utts = args.utterances or ((16 if from_audio else 32) if quick else 96)
    held, train = split_text(args.seed)
    if getattr(args, "manifest", None) and not args.logprobs:
        log_probs, lengths, refs = manifest_log_probs(args.manifest, args.ctc_head, getattr(args, "device", None), n_utts)
        if args.save_logprobs:
            save_log_probs(args.save_logprobs, log_probs, lengths, refs)
        source = f"real: CTC head {args.ctc_head} on {args.manifest}"
    elif args.logprobs:
        log_probs, lengths, refs = load_log_probs(args.logprobs)
        source = f"real: {args.logprobs}"
    else:
        refs = held[:n_utts]
        log_probs, lengths = simulate_log_probs(refs, args.seed)
        source = "simulated from held-out text"
    log_probs, lengths = log_probs[:n_utts], lengths[:n_utts]
    refs = refs[: len(lengths)]
    if not source.startswith("simulated"):  # every reference is held out of the LM text
        ref_set = set(refs)
        train = [s for p in args.lm_text for s in read_lm_text(p)] if args.lm_text else held + train
        train = [s for s in train if s not in ref_set]
        held = list(refs)
    n = len(lengths)
    text_of = charset.decode
    arpa, tensors, word_arpa = build_lms(train, work)
    device = getattr(args, "device", None) or ("cuda" if torch.cuda.is_available() else "cpu")
    lm = NGramLM.load(tensors, device=device)
    phrase_counts = (100,) if quick else (100, 1000)
    phrases = {k: key_phrases(held, train, k) for k in phrase_counts}
    if getattr(args, "key_phrases", None):
        given = domain_phrases() if args.key_phrases == "domain" else [
            ln.strip() for ln in Path(args.key_phrases).read_text(encoding="utf-8").splitlines() if ln.strip()]
        for k in phrase_counts:  # the given list first, then rare words as distractors
            phrases[k] = list(dict.fromkeys(given[:k] + phrases[k]))[:k]
    # what the search boosts: the phrase lists, plus case variants (F is still scored on the lists)
    boosted = {k: p if args.no_case_variants else case_variants(p) for k, p in phrases.items()}
    trees = {k: BoostingTree.from_phrases([p], vocab_size=lm.vocab_size,
                                          tokenize=charset.lm_token_ids).to(device)
             for k, p in boosted.items()}
    cpu_lp = log_probs
    log_probs, lengths = log_probs.to(device), lengths.to(device)
    rows: list[dict] = []

    def add(decoder, beam, batch, lm_on, n_phr, flop, hyps, seconds, count, beams=None, tokens_kept=None):
        row = {"decoder": decoder, "beam": beam, "batch": batch, "lm": lm_on, "phrases": n_phr,
               "flop": flop, "wer": corpus_wer_lowercase(refs[:count], hyps),
               "ms_per_utt": 1000.0 * seconds / count, "utts": count}
        # F-score of the 100-phrase list for every row, boosted or not
        row["phrase_f"] = phrase_fscore(refs[:count], hyps, phrases[100])
        if beams is not None:
            row["avg_beams"] = beams
        if tokens_kept is not None:
            row["avg_tokens"] = tokens_kept
        rows.append(row)
        return row

    # greedy
    g, secs = timed(lambda: ctc_greedy(log_probs, lengths))  # includes the .tolist() sync
    add("greedy", 1, n, False, 0, False, [text_of(t) for t in g.tokens], secs, n)

    reps_default = args.reps or (2 if quick else 3)

    def ours(beam, batch, lm_on, n_phr=0, flop=False, reps=None, native=True, flop_setting=None):
        reps = reps or reps_default
        top_n, ratio = flop_setting or (args.flop_top_n, args.flop_ratio)
        kw = dict(beam_size=beam, beta=args.beta if lm_on else 0.0, prune_threshold=args.prune_threshold,
                  track_beams=True, native=native)
        if lm_on:
            kw.update(lm=lm, alpha_lm=args.alpha)
        if n_phr:
            kw.update(boost=trees[n_phr], alpha_boost=args.alpha_boost)
        if flop:
            kw.update(flop_top_n=top_n, flop_ratio=ratio)
        search = CTCBeamSearch(**kw)
        decode_ours(search, log_probs[:batch], lengths[:batch], batch)  # warm-up (+ dense tables)
        (toks, beams), best = best_of(reps, lambda: decode_ours(search, log_probs, lengths, batch))
        kept = float(surviving_tokens(log_probs, lengths, top_n, ratio).mean()) if flop else None
        name = "ours" if native or device != "cpu" else "ours (torch step)"
        if flop_setting is not None:
            name += f" (FLToP N {top_n}, R {ratio:g})"
        return add(name, beam, batch, lm_on, n_phr, flop, [text_of(t) for t in toks], best, n, beams, kept)

    beams_grid = ([4, 8] if from_audio else [4, 8, 16]) if quick else [4, 8, 16, 64]
    batch_grid = [1, 32] if quick else [1, 8, 32]
    for beam in beams_grid:
        for batch in batch_grid:
            ours(beam, batch, True)
        ours(beam, SUMMARY_BATCH, False)
        ours(beam, SUMMARY_BATCH, True, flop=True)
    for n_phr in phrase_counts:
        ours(SUMMARY_BEAM, SUMMARY_BATCH, True, n_phr)
        ours(SUMMARY_BEAM, SUMMARY_BATCH, True, n_phr, flop=True)
    for n_phr in phrase_counts:
        ours(SUMMARY_BEAM, SUMMARY_BATCH, False, n_phr)
    # headline pair, timed again back to back (the machine is shared)
    flop_off = ours(SUMMARY_BEAM, SUMMARY_BATCH, True, reps=reps_default + 2)
    flop_on = ours(SUMMARY_BEAM, SUMMARY_BATCH, True, flop=True, reps=reps_default + 2)
    flop_paper = ours(SUMMARY_BEAM, SUMMARY_BATCH, True, flop=True, reps=reps_default + 2, flop_setting=FLTOP_PAPER)
    # the same search with the torch frame step (what a GPU runs, in CUDA graphs): the
    # native CPU loop's speed-up at identical settings
    torch_step = {flop: ours(SUMMARY_BEAM, SUMMARY_BATCH, True, flop=flop, native=False) for flop in (False, True)}

    # FLToP where it is meant to pay off: a 1024-token vocabulary (no LM), exact vs pruned
    big_lp, big_len, truths = simulate_token_log_probs(min(n, 32) if quick else n, 1024, args.seed)
    big_lp, big_len = big_lp.to(device), big_len.to(device)
    ref_tokens = [" ".join(map(str, t)) for t in truths]
    for flop in (False, True):
        kw = dict(flop_top_n=args.flop_top_n, flop_ratio=args.flop_ratio) if flop else {}
        search = CTCBeamSearch(SUMMARY_BEAM, prune_threshold=args.prune_threshold, track_beams=True, **kw)
        decode_ours(search, big_lp[:SUMMARY_BATCH], big_len[:SUMMARY_BATCH], SUMMARY_BATCH)
        (toks, beams), secs = best_of(reps_default, lambda: decode_ours(search, big_lp, big_len, SUMMARY_BATCH))
        import jiwer

        rows.append({"decoder": "ours V=1024", "beam": SUMMARY_BEAM, "batch": SUMMARY_BATCH, "lm": False,
                     "phrases": 0, "flop": flop, "wer": jiwer.wer(ref_tokens, [" ".join(map(str, t)) for t in toks]),
                     "ms_per_utt": 1000.0 * secs / len(big_len), "utts": len(big_len), "avg_beams": beams})

    # flashlight-text: same token ARPA, same weight, one utterance at a time
    from ...pipeline.training.references.ctc_decoders import FlashlightCTC, PyCTCDecode

    np_lp = [cpu_lp[i, : int(lengths[i])].numpy() for i in range(n)]
    views = utterance_rows(log_probs, lengths) if log_probs.device.type == "cpu" else None
    for beam in ([SUMMARY_BEAM] if quick else beams_grid):
        for lm_on in (False, True):
            fl = FlashlightCTC(charset.NUM_CLASSES, 0, beam, space=charset.encode(" ")[0],
                               arpa_path=arpa if lm_on else None, lm_weight=args.alpha if lm_on else 0.0,
                               beam_threshold=args.prune_threshold)
            # flashlight has no insertion bonus for lexicon-free decoding: compare at beta=0 too
            out, secs = best_of(reps_default, lambda: [fl.decode(x)[0] for x in np_lp])
            add("flashlight", beam, 1, lm_on, 0, False, [text_of(t) for t in out], secs, n)
    if args.beta != 0.0:  # the like-for-like comparison with flashlight
        for beam in ([8] if quick else [4, 8]):
            ours_beta0 = CTCBeamSearch(beam, lm=lm, alpha_lm=args.alpha, prune_threshold=args.prune_threshold)
            decode_ours(ours_beta0, log_probs[:SUMMARY_BATCH], lengths[:SUMMARY_BATCH], SUMMARY_BATCH)  # tables
            (toks, _), secs = best_of(reps_default, lambda: decode_ours(ours_beta0, log_probs, lengths, SUMMARY_BATCH))
            add("ours(beta=0)", beam, SUMMARY_BATCH, True, 0, False, [text_of(t) for t in toks], secs, n)

    # pyctcdecode: word-level KenLM on the same text, hotwords = the key phrases
    labels = [""] + charset.CHARS
    n_py = 8 if quick else n  # the same utterances as ours outside --quick
    py_lm = PyCTCDecode(labels, kenlm_path=word_arpa, alpha=args.alpha, beta=args.beta)
    py_plain = PyCTCDecode(labels)
    for beam in ([8] if quick else [4, 8, 16]):
        for lm_on, dec in ((False, py_plain), (True, py_lm)):
            out, secs = best_of(reps_default, lambda: [dec.decode(x, beam, beam_prune_logp=-args.prune_threshold,
                                                                   token_min_logp=-5.0) for x in np_lp[:n_py]])
            add("pyctcdecode", beam, 1, lm_on, 0, False, out, secs, n_py)
    out, secs = timed(lambda: [py_lm.decode(x, SUMMARY_BEAM, hotwords=boosted[100], beam_prune_logp=-args.prune_threshold,
                                            token_min_logp=-5.0) for x in np_lp[:n_py]])
    add("pyctcdecode", SUMMARY_BEAM, 1, True, 100, False, out, secs, n_py)

    # the headline ratios: the four beam-8 LM decoders timed in turn, round after round, so
    # a slow spell of this shared machine hits all of them instead of one row
    exact_search = CTCBeamSearch(SUMMARY_BEAM, beta=args.beta, lm=lm, alpha_lm=args.alpha,
                                 prune_threshold=args.prune_threshold)
    flop_search = CTCBeamSearch(SUMMARY_BEAM, beta=args.beta, lm=lm, alpha_lm=args.alpha,
                                prune_threshold=args.prune_threshold, flop_top_n=args.flop_top_n,
                                flop_ratio=args.flop_ratio)
    paper_search = CTCBeamSearch(SUMMARY_BEAM, beta=args.beta, lm=lm, alpha_lm=args.alpha,
                                 prune_threshold=args.prune_threshold, flop_top_n=FLTOP_PAPER[0],
                                 flop_ratio=FLTOP_PAPER[1])
    fl_lm = FlashlightCTC(charset.NUM_CLASSES, 0, SUMMARY_BEAM, space=charset.encode(" ")[0], arpa_path=arpa,
                          lm_weight=args.alpha, beam_threshold=args.prune_threshold)
    contenders = {
        "ours": (n, lambda: decode_ours(exact_search, log_probs, lengths, SUMMARY_BATCH, rows=views)),
        "ours_flop": (n, lambda: decode_ours(flop_search, log_probs, lengths, SUMMARY_BATCH, rows=views)),
        "ours_flop_paper": (n, lambda: decode_ours(paper_search, log_probs, lengths, SUMMARY_BATCH, rows=views)),
        "flashlight": (n, lambda: [fl_lm.decode(x) for x in np_lp]),
        "pyctcdecode": (n_py, lambda: [py_lm.decode(x, SUMMARY_BEAM, beam_prune_logp=-args.prune_threshold,
                                                    token_min_logp=-5.0) for x in np_lp[:n_py]]),
    }
    headline = interleaved_ms_per_utt(contenders, rounds=reps_default + 2)
    summary = _summary(rows, flop_off, flop_on, flop_paper, source, headline)
    if device == "cpu":
        summary["native_speedup_vs_torch_step"] = torch_step[False]["ms_per_utt"] / flop_off["ms_per_utt"]
        summary["native_speedup_vs_torch_step_flop"] = torch_step[True]["ms_per_utt"] / flop_on["ms_per_utt"]
        summary["native_same_wer"] = (torch_step[False]["wer"] == flop_off["wer"]
                                              and torch_step[True]["wer"] == flop_on["wer"])
    if getattr(args, "model", None):
        from .ctc_beam_model import run_model

        summary.update(run_model(args, train, phrases[100], held, work))
    _plot(rows, args)
    return {"rows": rows, "summary": summary}


def _find(rows, **kw):
    for r in rows:
        if all(r.get(k) == v for k, v in kw.items()):
            return r
    return None


def _summary(rows, flop_off, flop_on, flop_paper, source, ms: dict) -> dict:
    """``ms``: interleaved ms/utterance of ours (exact and FLToP), flashlight and
    pyctcdecode at beam 8 with LM; every speed ratio here comes from it."""
    greedy = _find(rows, decoder="greedy")
    beam_lm = flop_off
    fl = _find(rows, decoder="flashlight", beam=SUMMARY_BEAM, lm=True)
    py = _find(rows, decoder="pyctcdecode", beam=SUMMARY_BEAM, lm=True, phrases=0)
    no_boost = _find(rows, decoder="ours", beam=SUMMARY_BEAM, batch=SUMMARY_BATCH, lm=False, phrases=0, flop=False)
    boost = _find(rows, decoder="ours", beam=SUMMARY_BEAM, batch=SUMMARY_BATCH, lm=False, phrases=100, flop=False)
    lm_no_boost = _find(rows, decoder="ours", beam=SUMMARY_BEAM, batch=SUMMARY_BATCH, lm=True, phrases=0, flop=False)
    lm_boost = _find(rows, decoder="ours", beam=SUMMARY_BEAM, batch=SUMMARY_BATCH, lm=True, phrases=100, flop=False)
    base_f = no_boost["phrase_f"]
    return {
        "input": source,
        "wer_greedy": greedy["wer"],
        "wer_beam_lm": beam_lm["wer"],
        "wer_flashlight": fl["wer"],
        "wer_beam_lm_rel_vs_greedy": (beam_lm["wer"] - greedy["wer"]) / greedy["wer"] if greedy["wer"] else None,
        "speedup_vs_pyctcdecode": ms["pyctcdecode"] / ms["ours"],
        "speedup_vs_flashlight": ms["flashlight"] / ms["ours"],
        # the shipped configuration (conf/ctc_beam.yaml) has FLToP on
        "speedup_vs_pyctcdecode_flop": ms["pyctcdecode"] / ms["ours_flop"],
        "speedup_vs_flashlight_flop": ms["flashlight"] / ms["ours_flop"],
        # FLToP at its paper's (N, R) (FLTOP_PAPER), with its WER on these frames
        "flop_paper": {"top_n": FLTOP_PAPER[0], "ratio": FLTOP_PAPER[1]},
        "speedup_vs_pyctcdecode_flop_paper": ms["pyctcdecode"] / ms["ours_flop_paper"],
        "speedup_vs_flashlight_flop_paper": ms["flashlight"] / ms["ours_flop_paper"],
        "wer_beam_lm_flop_paper": flop_paper["wer"],
        "headline_ms_per_utt": ms,
        "wer_pyctcdecode": py["wer"],
        "wer_beam_lm_flop": flop_on["wer"],
        "flop_speedup": ms["ours"] / ms["ours_flop"],
        "flop_wer_rel_change": ((flop_on["wer"] - flop_off["wer"]) / flop_off["wer"]) if flop_off["wer"] else 0.0,
        "flop_avg_beams_off": flop_off.get("avg_beams"),
        "flop_avg_beams_on": flop_on.get("avg_beams"),
        # boosting alone (beam 8, no LM) and on top of the LM, 100 phrases, F in points
        "flop_speedup_v1024": (_find(rows, decoder="ours V=1024", flop=False)["ms_per_utt"]
                               / _find(rows, decoder="ours V=1024", flop=True)["ms_per_utt"]),
        "boost_fscore_gain": boost["phrase_f"] - base_f,
        "boost_fscore": boost["phrase_f"],
        "boost_fscore_without": base_f,
        "boost_fscore_gain_with_lm": lm_boost["phrase_f"] - lm_no_boost["phrase_f"],
        "pyctcdecode_hotwords_fscore_gain": (_find(rows, decoder="pyctcdecode", phrases=100)["phrase_f"]
                                             - py["phrase_f"]),
    }


def _plot(rows, args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from .data import save_figure

    path = args.plot or (str(Path(args.out).with_suffix(".png")) if getattr(args, "out", None) else "ctc_beam.png")
    fig, (ax_t, ax_w) = plt.subplots(1, 2, figsize=(11, 4))
    series = {}
    for r in rows:
        if r["decoder"] in ("greedy", "ours V=1024") or r["phrases"] or r["flop"]:
            continue
        name = f'{r["decoder"]} {"LM" if r["lm"] else "no LM"}' + (f' b={r["batch"]}' if r["decoder"] == "ours" else "")
        series.setdefault(name, []).append(r)
    for name, rs in sorted(series.items()):
        rs = sorted(rs, key=lambda r: r["beam"])
        ax_t.plot([r["beam"] for r in rs], [r["ms_per_utt"] for r in rs], marker="o", label=name)
        ax_w.plot([r["beam"] for r in rs], [r["wer"] for r in rs], marker="o", label=name)
    flop = sorted([r for r in rows if r["decoder"] == "ours" and r["flop"] and not r["phrases"] and r["lm"]],
                  key=lambda r: r["beam"])
    if flop:
        ax_t.plot([r["beam"] for r in flop], [r["ms_per_utt"] for r in flop], marker="x", ls="--", label="ours LM+FLToP b=32")
        ax_w.plot([r["beam"] for r in flop], [r["wer"] for r in flop], marker="x", ls="--", label="ours LM+FLToP b=32")
    greedy = _find(rows, decoder="greedy")
    ax_w.axhline(greedy["wer"], color="gray", ls=":", label="greedy")
    for ax, label in ((ax_t, "ms / utterance (CPU, 1 thread)"), (ax_w, "WER")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("beam")
        ax.set_ylabel(label)
    ax_t.set_yscale("log")
    ax_w.legend(fontsize=7)
    fig.suptitle("CTC beam search: FlexCTC (ours) vs flashlight-text vs pyctcdecode")
    save_figure(fig, path, dpi=110)
