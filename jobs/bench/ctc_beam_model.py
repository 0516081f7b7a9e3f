"""`shardscribe bench ctc-beam --model DIR` (jobs/bench/ctc_beam.py calls ``run_model``;
not a benchmark of its own, see ``SHARED`` in jobs/bench/__init__.py): the batched beam
search of "FlexCTC: GPU-powered CTC Beam Decoding with advanced Contextual Abilities"
(with "FLToP CTC: Frame-Level Token Pruning via Relative Threshold") on any
``ctc``-family checkpoint, in its own vocabulary, beside the embedded model's figures.

For the checkpoint (``--model DIR``, or ``random:parakeet-ctc-0.6b``: that architecture,
transformers' ParakeetCTCConfig defaults, with random weights and a 1024-piece unigram
tokenizer trained here on the LM text), on the manifest's audio:

- decoder only, beam 8, token LM on: ms/utterance of ours (batch 32; FLToP off and on;
  the LM as the search gets it by default, a back-off graph when its dense table would
  pass ``dense_fusion_max_bytes``, and folded into one dense table, which the native CPU
  loop needs) against flashlight-text's lexicon-free decoder on the same token-level
  ARPA and pyctcdecode with a word-level KenLM from the same text, timed in turn; on the
  checkpoint's own frames, and on CTC-like frames simulated in its vocabulary from
  held-out text (with WER), since random weights give flat or constant frames;
- full model: RTFx of encoder + greedy against encoder + beam 8 + LM + 100 boosted
  phrases with the shipped ``ctc_beam`` settings (FLToP on), from one encoder pass timed
  per round and each decoder timed on its output (the encoder is common to both).

For the embedded model (Whisper tiny.en encoder + CTC head, ``model.family=ctc`` with
``model.source=embedded``): word-timestamp accuracy, the mean absolute error of word
starts and ends against known boundaries, on clips joined from separately rendered words
(held-out text, several TTS voices) with random gaps, for greedy and beam.

Random weights give meaningless text: the checkpoint's rows are for speed, the embedded
model's WER comes from the rest of ``bench ctc-beam`` in the same run.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

RANDOM_PREFIX = "random:"
BEAM = 8
BATCH = 32


# ------------------------------------------------------------------- checkpoint
def random_parakeet_ctc(out: Path, text: list[str], pieces: int = 1024) -> Path:
    """parakeet-ctc-0.6b's architecture with random weights, and a unigram tokenizer of
    ``pieces`` SentencePiece-style pieces trained on ``text`` (blank = the last id)."""
    import torch
    from transformers import ParakeetCTCConfig, ParakeetFeatureExtractor, ParakeetForCTC, ParakeetProcessor

    tokenizer = unigram_tokenizer(text, pieces)
    config = ParakeetCTCConfig(vocab_size=pieces + 1, pad_token_id=pieces)
    torch.manual_seed(0)
    model = ParakeetForCTC(config).eval()
    model.save_pretrained(out)
    ParakeetProcessor(ParakeetFeatureExtractor(feature_size=config.encoder_config.num_mel_bins), tokenizer,
                      decoder_type="ctc").save_pretrained(out)
    return out


def unigram_tokenizer(text: list[str], pieces: int = 1024):
    """A ParakeetTokenizer of ``pieces`` SentencePiece-style unigram pieces trained on
    ``text`` (filled up to ``pieces`` where the text has fewer), ``<pad>`` after them."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import ParakeetTokenizer

    trainer_tok = Tokenizer(models.Unigram())
    trainer_tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    trainer_tok.train_from_iterator(text, trainers.UnigramTrainer(vocab_size=pieces, special_tokens=["<unk>"],
                                                                  unk_token="<unk>"))
    vocab = json.loads(trainer_tok.to_str())["model"]["vocab"][:pieces]
    vocab += [[f"▁<fill{i}>", -30.0] for i in range(pieces - len(vocab))]
    spm = Tokenizer(models.Unigram([tuple(v) for v in vocab] + [("<pad>", -30.0)], unk_id=0))
    spm.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    spm.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    return ParakeetTokenizer(tokenizer_object=spm, unk_token="<unk>", pad_token="<pad>")


def resolve_model(spec: str, text: list[str], work: Path) -> str:
    if spec.startswith(RANDOM_PREFIX):
        arch = spec[len(RANDOM_PREFIX):]
        if arch != "parakeet-ctc-0.6b":
            raise ValueError(f"--model {spec}: only random:parakeet-ctc-0.6b is built here")
        return str(random_parakeet_ctc(work / "parakeet-ctc-0.6b", text))
    return spec


# --------------------------------------------------------------------- speed
def _encode_all(adapter, audios, batch: int):
    from ...pipeline.timing import timed

    def run():
        out = []
        for i in range(0, len(audios), batch):
            enc = adapter.encode(audios[i:i + batch])
            lp = enc.states[:, :int(enc.valid_frames.max())].float().log_softmax(-1)
            out += [lp[j, :int(n)].cpu() for j, n in enumerate(enc.valid_frames.tolist())]
        return out
    return timed(run, device=adapter.device)


def simulate_in_vocabulary(texts: list[str], vocab, seed: int):
    """CTC-like posteriors in the checkpoint's own vocabulary for ``texts`` spelt by its
    tokenizer (``jobs.bench.data``'s alignment model: 0-2 blanks before each token, 1-2
    frames per token, a random rival on a quarter of the token frames that sometimes
    wins): a random-weight checkpoint's own frames are flat or constant, which no trained
    model's are, and the decoders' speeds depend on that shape."""
    import torch

    from .data import _ctc_alignment, pad_log_probs

    rng = np.random.default_rng(seed)
    rows = []
    for text in texts:
        ids = vocab.ctc_ids(text)
        internal = _ctc_alignment(rng, [i + 1 for i in range(len(ids))])   # 0 = blank, k = k-th token
        labels = [vocab.blank if k == 0 else ids[k - 1] for k in internal] + [vocab.blank]
        logits = rng.normal(0.0, 1.0, size=(len(labels), vocab.size))
        for i, y in enumerate(labels):
            logits[i, y] += rng.normal(10.0, 1.0) if y == vocab.blank else rng.normal(9.0, 1.5)
            if y != vocab.blank and rng.random() < 0.25:
                rival = int(rng.integers(0, vocab.size - 1))
                rival += rival >= vocab.blank
                logits[i, rival] = logits[i, y] + rng.normal(-0.5, 1.5)
        rows.append(torch.log_softmax(torch.tensor(logits, dtype=torch.float32), -1))
    return pad_log_probs(rows)


def compare_decoders(lp, lengths, vocab, lms: dict, tree, beam_cfg, alpha: float, rounds: int,
                     refs: list[str] | None = None) -> dict:
    """ms/utterance (and WER against ``refs``) of ours, flashlight-text and pyctcdecode at
    beam 8 with the token LM (pyctcdecode: the word LM), timed in turn."""
    from .ctc_beam_runs import FLTOP_PAPER, decode_ours, utterance_rows
    from .data import interleaved_ms_per_utt
    from ...pipeline.decoding.ctc_beam import CTCBeamSearch
    from ...pipeline.models.ctc_greedy import ctc_greedy
    from ...pipeline.training.references.ctc_decoders import FlashlightCTC, PyCTCDecode
    from ...pipeline.metrics import corpus_wer_lowercase

    n = len(lengths)
    views = utterance_rows(lp, lengths)
    np_lp = [v.numpy() for v in views]
    common = dict(blank=vocab.blank, lm=lms["ngpu"], alpha_lm=alpha, prune_threshold=beam_cfg.prune_threshold)
    flop = dict(flop_top_n=beam_cfg.flop_top_n, flop_ratio=beam_cfg.flop_ratio)
    searches = {
        "ours": CTCBeamSearch(BEAM, **common),
        # the LM folded into one dense table (native CPU loop) whatever its size
        "ours_dense": CTCBeamSearch(BEAM, dense_fusion_max_bytes=4 * 2 ** 30, **common),
        "ours_flop": CTCBeamSearch(BEAM, **common, **flop),
        "ours_flop_dense": CTCBeamSearch(BEAM, dense_fusion_max_bytes=4 * 2 ** 30, **common, **flop),
        "ours_flop_paper": CTCBeamSearch(BEAM, flop_top_n=FLTOP_PAPER[0], flop_ratio=FLTOP_PAPER[1], **common),
        "ours_flop_100_phrases": CTCBeamSearch(BEAM, beta=beam_cfg.beta, alpha_boost=beam_cfg.alpha_boost,
                                               **common, **flop),
    }
    boosts = {"ours_flop_100_phrases": tree}
    silence = vocab.tokenizer.convert_tokens_to_ids("▁")
    if not isinstance(silence, int) or silence == vocab.tokenizer.unk_token_id:
        silence = vocab.ctc_ids("a b")[1] if len(vocab.ctc_ids("a b")) == 3 else vocab.blank
    fl = FlashlightCTC(vocab.size, vocab.blank, BEAM, space=silence, arpa_path=lms["arpa"], lm_weight=alpha,
                       beam_threshold=beam_cfg.prune_threshold)
    labels = ["" if i == vocab.blank else p for i, p in
              enumerate(vocab.tokenizer.convert_ids_to_tokens(list(range(vocab.size))))]
    py = PyCTCDecode(labels, kenlm_path=lms["word_arpa"], alpha=alpha)
    outputs = {}

    def ours(name):
        def run():
            outputs[name] = decode_ours(searches[name], lp, lengths, BATCH, boost=boosts.get(name), rows=views)[0]
        return run

    for name, search in searches.items():     # warm-up: dense tables, the native build
        decode_ours(search, lp[:2], lengths[:2], 2, boost=boosts.get(name))
    contenders = {name: (n, ours(name)) for name in searches}
    contenders["greedy"] = (n, lambda: outputs.__setitem__("greedy", ctc_greedy(lp, lengths, blank=vocab.blank).tokens))
    contenders["flashlight"] = (n, lambda: outputs.__setitem__("flashlight", [fl.decode(x)[0] for x in np_lp]))
    # every decoder on the same utterances: a ms/utterance ratio over different ones
    # would compare their lengths too
    contenders["pyctcdecode"] = (n, lambda: outputs.__setitem__("pyctcdecode", [
        py.decode(x, BEAM, beam_prune_logp=-beam_cfg.prune_threshold, token_min_logp=-5.0) for x in np_lp]))
    ms = interleaved_ms_per_utt(contenders, rounds=rounds)
    out = {"ms_per_utt": ms, "utterances": n, "mean_frames": float(lengths.float().mean()),
           "loops": {name: s.last_loop for name, s in searches.items()},
           "speedup_vs_pyctcdecode": ms["pyctcdecode"] / ms["ours"],
           "speedup_vs_flashlight": ms["flashlight"] / ms["ours"],
           "speedup_vs_pyctcdecode_flop": ms["pyctcdecode"] / ms["ours_flop"],
           "speedup_vs_flashlight_flop": ms["flashlight"] / ms["ours_flop"],
           "speedup_vs_pyctcdecode_dense": ms["pyctcdecode"] / ms["ours_dense"],
           "speedup_vs_flashlight_dense": ms["flashlight"] / ms["ours_dense"],
           "speedup_vs_pyctcdecode_flop_dense": ms["pyctcdecode"] / ms["ours_flop_dense"],
           "speedup_vs_flashlight_flop_dense": ms["flashlight"] / ms["ours_flop_dense"],
           "speedup_vs_pyctcdecode_flop_paper": ms["pyctcdecode"] / ms["ours_flop_paper"],
           "speedup_vs_flashlight_flop_paper": ms["flashlight"] / ms["ours_flop_paper"]}
    if refs is not None:
        text = {k: ([vocab.decode(t) for t in v] if k != "pyctcdecode" else v) for k, v in outputs.items()}
        out["wer"] = {k: corpus_wer_lowercase(refs[:len(v)], v) for k, v in text.items()}
    return out


def model_speed(model: str, audios: list[np.ndarray], lm_text: list[str], heldout: list[str], phrases: list[str],
                work: Path, rounds: int, alpha: float, beam_cfg, seed: int = 0,
                decoder_rounds: int | None = None) -> dict:
    import torch

    from ...pipeline.lm.boosting import BoostingTree
    from ...pipeline.lm.build import build_lm, run_lmplz
    from ...pipeline.lm.ngpu_lm import NGramLM
    from ...pipeline.models.ctc.adapter import load_ctc_adapter
    from ...pipeline.text.ctc_vocabulary import TokenizerVocabulary

    adapter = load_ctc_adapter(model)
    vocab = TokenizerVocabulary.from_pretrained(model)
    (work / "lm_text.txt").write_text("\n".join(lm_text) + "\n")
    build_lm([str(work / "lm_text.txt")], 4, model, str(work / "token_lm"))
    (work / "words.txt").write_text("\n".join(s.lower() for s in lm_text) + "\n")
    run_lmplz(work / "words.txt", work / "words.arpa", order=4)
    ngpu = NGramLM.load(str(work / "token_lm" / "lm.ngpu.safetensors"))
    lms = {"ngpu": ngpu, "arpa": str(work / "token_lm" / "lm.arpa"), "word_arpa": str(work / "words.arpa")}
    tree = BoostingTree.from_phrases([phrases], vocab.size - 1, tokenize=vocab.lm_token_ids,
                                     context_score=beam_cfg.context_score, depth_scaling=beam_cfg.depth_scaling)

    encoded, t_enc = _encode_all(adapter, audios, 8)
    for _ in range(rounds - 1):
        encoded, t = _encode_all(adapter, audios, 8)
        t_enc = min(t_enc, t)
    from .data import pad_log_probs

    lp, lengths = pad_log_probs(encoded)
    n, audio_s = len(encoded), sum(len(a) for a in audios) / 16000
    # the decoders take milliseconds where the encoder takes seconds: on a shared machine
    # more rounds of them (--reps) get each one's fastest round closer to its quiet speed
    decoder_rounds = decoder_rounds or rounds
    own = compare_decoders(lp, lengths, vocab, lms, tree, beam_cfg, alpha, decoder_rounds)
    sim_lp, sim_len = simulate_in_vocabulary(heldout, vocab, seed)
    simulated = compare_decoders(sim_lp, sim_len, vocab, lms, tree, beam_cfg, alpha, decoder_rounds, refs=heldout)
    enc_ms = 1000.0 * t_enc / n
    greedy_s = (enc_ms + own["ms_per_utt"]["greedy"]) * n / 1000.0
    beam_s = (enc_ms + own["ms_per_utt"]["ours_flop_100_phrases"]) * n / 1000.0
    return {
        "model": model, "vocab_size": vocab.size, "blank": vocab.blank, "utterances": n,
        "audio_seconds": audio_s, "frame_stride_s": adapter.frame_stride_s, "threads": torch.get_num_threads(),
        "lm": json.loads(ngpu.describe()),
        "own_frames": own, "simulated_frames": simulated, "encoder_ms_per_utt": enc_ms,
        "rtfx_greedy": audio_s / greedy_s, "rtfx_beam_lm_100_phrases": audio_s / beam_s,
        "rtfx_beam_vs_greedy": greedy_s / beam_s,
    }


# ---------------------------------------------------------------- word timing
def speech_span(audio: np.ndarray, frame: int = 160, rel: float = 0.02) -> tuple[int, int] | None:
    """First and past-last sample of the 10-ms frames louder than ``rel`` x the clip's peak
    frame RMS: where a separately rendered word's sound is (None: silence)."""
    n = len(audio) // frame
    rms = np.sqrt((audio[: n * frame].reshape(n, frame) ** 2).mean(axis=1)) if n else np.zeros(0)
    loud = np.nonzero(rms > rel * rms.max())[0] if n and rms.max() > 1e-4 else []
    if not len(loud):
        return None
    return int(loud[0]) * frame, int(loud[-1] + 1) * frame


def timed_word_clips(sentences: list[str], voices, seed: int):
    """Clips of separately rendered words joined by 0.1-0.5 s of silence: (audio, [(word,
    start_s, end_s)]) with the boundaries known to the sample."""
    from ...pipeline.training.tts.engines import synthesize

    rng = np.random.default_rng(seed)
    clips = []
    for i, sentence in enumerate(sentences):
        voice = voices[i % len(voices)]
        parts, truth, at = [np.zeros(int(0.2 * 16000), np.float32)], [], int(0.2 * 16000)
        for word in sentence.split():
            audio = synthesize(voice, word) if _norm(word) else np.zeros(0, np.float32)
            span = speech_span(audio)
            if span is None:
                continue
            a, b = span
            parts.append(audio[a:b])
            truth.append((word, at / 16000, (at + b - a) / 16000))
            gap = int(rng.uniform(0.1, 0.5) * 16000)
            parts.append(np.zeros(gap, np.float32))
            at += b - a + gap
        clips.append((np.concatenate(parts), truth))
    return clips


def _norm(word: str) -> str:
    return "".join(ch for ch in word.lower() if ch.isalnum() or ch == "'")


def boundary_errors(predicted: list[dict], truth: list[tuple[str, float, float]]) -> list[float]:
    """|start - true start| and |end - true end| of every predicted word matched to a true
    word (the same word, in order: difflib's matching blocks)."""
    import difflib

    a, b = [_norm(w["word"]) for w in predicted], [_norm(w) for w, _, _ in truth]
    errors = []
    for block in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_matching_blocks():
        for k in range(block.size):
            p, t = predicted[block.a + k], truth[block.b + k]
            errors += [abs(p["start"] - t[1]), abs(p["end"] - t[2])]
    return errors


def word_timing(sentences: list[str], seed: int) -> dict:
    """Word-boundary error of greedy and beam (beam 8, no LM) on the embedded model."""
    from ...pipeline.config import load_config
    from ...pipeline.kinds.ctc_beam.stages import CTCLogProbsDecoder, build_search
    from ...pipeline.kinds.ctc_greedy.stage import build
    from ...pipeline.models import load_model
    from ...pipeline.training.tts.engines import Voice

    voices = [Voice("espeak-ng", "en-us"), Voice("flite", "slt"), Voice("espeak-ng", "en-gb+m3", rate=0.9),
              Voice("flite", "rms")]
    clips = timed_word_clips(sentences, voices, seed)
    cfg = load_config("ctc_greedy", ["model.family=ctc", "decoder.pack_windows=false"])
    adapter = load_model(cfg.model)
    greedy = build(adapter, cfg).decode([c[0] for c in clips])
    pending = CTCLogProbsDecoder(adapter).decode([c[0] for c in clips])
    build_search(load_config("ctc_beam", ["model.family=ctc", "beam.use_cuda_graphs=false"])).finish(pending)
    out = {"clips": len(clips), "words": sum(len(c[1]) for c in clips)}
    for name, results in (("greedy", greedy), ("beam", pending)):
        errors = [e for res, (_, truth) in zip(results, clips) for e in boundary_errors(res.words or [], truth)]
        out[f"{name}_boundary_mae_s"] = float(np.mean(errors)) if errors else None
        out[f"{name}_boundary_median_s"] = float(np.median(errors)) if errors else None
        out[f"{name}_matched_words"] = len(errors) // 2
    return out


def run_model(args, lm_text: list[str], phrases: list[str], heldout: list[str], work: Path) -> dict:
    """The checkpoint's speed rows and the embedded model's word timing (files under
    ``work``, the caller's run directory)."""
    from .data import flat_segments, load_recordings
    from ...pipeline.config import load_config

    quick = bool(getattr(args, "quick", False))
    model = resolve_model(args.model, lm_text, work)
    recordings, _ = load_recordings(getattr(args, "manifest", None), limit=16 if quick else 48)
    flat, _ = flat_segments(recordings)
    beam_cfg = load_config("ctc_beam").beam
    speed = model_speed(model, [a for _, a in flat], lm_text, heldout[:32 if quick else 96], phrases, work,
                        rounds=2 if quick else 3, alpha=args.alpha, beam_cfg=beam_cfg, seed=args.seed,
                        decoder_rounds=getattr(args, "reps", None))
    timing = word_timing(heldout[: 6 if quick else 20], args.seed)
    return {"model": speed, "word_timing": timing}
