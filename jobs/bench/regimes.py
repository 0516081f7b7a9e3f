"""`shardscribe bench regimes`: the seed papers' GPU regimes in one in-process run (no Ray,
which the GPU machine lacks), on the realistic architectures built from their configs with
random weights, so only speed and the searches' own equalities are measured:

- **SSD** ("Self-Speculative Decoding for LLM-based ASR with CTC Encoder Drafts", Table 1
  and Fig. 2) on Whisper large-v3-turbo's architecture and on granite-speech-3.3-2b's (the
  paper's model family; stacked log-mel features drawn at random): full AR (encoder + greedy decoding)
  against SSD at forced acceptance. A share ``%C`` of rows is gated (the CTC draft is
  final: no decoder work), the other rows are verified in one teacher-forced pass (eq. 5);
  a share ``%L`` of them is accepted (its draft is the model's own greedy output) and the
  rest rejected at a chosen position (the draft corrupted there) and continued by AR from
  the verified prefix, from the verification's KV cache (eqs. 6-7). Time per stage:
  encoder, CTC head (a random head of the embedded head's shape on the model's width),
  verification, fallback. The paper's rates: high accuracy %C 14, %L 47; high RTFx, close
  to every row gated. The fallback's tokens are checked against full AR's (the same greedy
  continuation of the same prefix). Pooled rows (``--pool``, default 8 and 32): the
  rejected rows of N consecutive batches decoded by one fallback call, as the runners'
  second-stage pool does (pipeline.pending_pool), its time shared by the N batches; a
  batch's fallback alone runs 1-15 rows, latency-bound on a GPU.
- **CTC beam** ("FlexCTC: GPU-powered CTC Beam Decoding with advanced Contextual
  Abilities") on parakeet-ctc-0.6b's encoder: encoder + greedy against encoder + beam 8 +
  a token 4-gram (NGPU-LM) + 100 boosted phrases with FLToP, on CTC-like frames in the
  model's vocabulary (a random model's own frames are flat); the frame loop in CUDA graphs
  against eager: identical results, and their speed ratio.
- **ALSD++** ("Pushing the Limits of Beam Search Decoding for Transducer-based ASR models")
  on parakeet-tdt-0.6b: encoder + greedy against encoder + ALSD++ beam 4.

With random weights nothing ends by itself: AR decoding runs to ``--tokens`` tokens and
the transducer emits what its random joint gives. On a GPU the models run in bfloat16
(``--dtype``). ``--quick``: the same code on toy sizes of the same architectures, on the
CPU in seconds; the test suite runs it so the bench cannot rot while no GPU is lent.
The LM is written here as a random ARPA over the vocabulary (no KenLM on the GPU machine).
"""
from __future__ import annotations

import argparse
import functools
import time
from pathlib import Path

import numpy as np

# "Self-Speculative Decoding ...", Table 1 (granite-speech-4.0-1b, Open ASR average):
# high accuracy gates 14% of drafts and accepts 47% of the rest; high RTFx gates nearly all.
PAPER_RATES = {"high_accuracy": (0.14, 0.47), "high_rtfx": (0.97, 0.47)}
TURBO = dict(d_model=1280, encoder_layers=32, decoder_layers=4, encoder_attention_heads=20,
             decoder_attention_heads=20, encoder_ffn_dim=5120, decoder_ffn_dim=5120)
TOY_WHISPER = dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                   decoder_attention_heads=2, encoder_ffn_dim=128, decoder_ffn_dim=128)
TOY_PARAKEET = {"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 128}
# granite-speech-3.3-2b as we read its published config: a 40-layer 2048-wide Granite LLM
# (GQA 32/8 heads), a 16-block 1024-wide conformer encoder over 160-dim stacked log-mels,
# a 2-layer Q-Former projector (5x downsampling in 15-frame windows)
GRANITE_2B = dict(
    text=dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=40, num_attention_heads=32,
              num_key_value_heads=8, vocab=49160),
    encoder=dict(input_dim=160, num_layers=16, hidden_dim=1024, num_heads=8, dim_head=128, context_size=200,
                 max_pos_emb=512, conv_kernel_size=15),
    projector=dict(hidden_size=1024, num_hidden_layers=2, num_attention_heads=16, intermediate_size=4096))
TOY_GRANITE = dict(
    text=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, vocab=512),
    encoder=dict(input_dim=16, num_layers=2, hidden_dim=32, num_heads=2, dim_head=16, context_size=20,
                 max_pos_emb=32, conv_kernel_size=5),
    projector=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64))
GRANITE_SPECIALS = ["<|end_of_text|>", "<|audio|>", "<|start_of_role|>", "<|end_of_role|>", "<unk>"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sections", default="ssd,ctc_beam,transducer")
    parser.add_argument("--ssd-models", default="whisper,granite", help="SSD section: whisper, granite or both")
    parser.add_argument("--batch", type=int, default=None, help="rows per batch (default 32, --quick 4)")
    parser.add_argument("--seconds", type=float, default=None, help="clip length (default 8, --quick 2)")
    parser.add_argument("--tokens", type=int, default=None, help="AR tokens per row (default 48, --quick 8)")
    parser.add_argument("--reject-at", type=float, default=0.5,
                        help="SSD: where a rejected draft is corrupted, as a share of its length")
    parser.add_argument("--dtype", default="auto", help="auto (bfloat16 on CUDA, float32 on CPU), or a dtype")
    parser.add_argument("--rounds", type=int, default=None, help="timed repetitions, best kept (default 3, quick 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pool", default="8,32",
                        help="SSD: pooled rows, the rejected rows of N consecutive batches in one fallback call "
                             "(comma-separated N; empty: none)")
    parser.add_argument("--whisper-processor", default=None, metavar="DIR",
                        help="SSD: Whisper tokenizer, feature extractor and configs saved here (written from "
                             "the embedded model when DIR does not exist yet): what a machine without the "
                             "embedded model's package needs carried")


def run(args) -> dict:
    import torch

    quick = bool(args.quick)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = (torch.bfloat16 if device.type == "cuda" else torch.float32) if args.dtype == "auto" \
        else getattr(torch, args.dtype)
    opts = argparse.Namespace(
        quick=quick, device=device, dtype=dtype, seed=args.seed, reject_at=args.reject_at,
        batch=args.batch or (4 if quick else 32), seconds=args.seconds or (2.0 if quick else 8.0),
        tokens=args.tokens or (8 if quick else 48), rounds=args.rounds or (1 if quick else 3),
        whisper_processor=getattr(args, "whisper_processor", None),
        pool=[int(n) for n in str(getattr(args, "pool", "8,32") or "").split(",") if n.strip()],
        ssd_models=[m.strip() for m in getattr(args, "ssd_models", "whisper,granite").split(",") if m.strip()])
    rows, summary = [], {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                         "dtype": str(dtype).removeprefix("torch."), "batch": opts.batch, "seconds": opts.seconds,
                         "sizes": "toy" if quick else "full"}
    sections = {"ssd": ssd_regimes, "ctc_beam": ctc_beam_regime, "transducer": transducer_regime}
    for name in [s.strip() for s in args.sections.split(",") if s.strip()]:
        if name not in sections:
            raise SystemExit(f"--sections: unknown {name!r} (known: {', '.join(sections)})")
        got_rows, got = sections[name](opts)
        rows += got_rows
        summary.update(got)
    summary["when"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    _plot(rows, args)
    return {"rows": rows, "summary": summary}


def _clips(n: int, seconds: float, seed: int) -> list[np.ndarray]:
    """Noise bursts: random weights read any audio the same way, and no decoder is needed."""
    rng = np.random.default_rng(seed)
    return [(0.1 * rng.standard_normal(int(seconds * 16000))).astype(np.float32) for _ in range(n)]


def _best(fn, device, rounds: int):
    from ...pipeline.timing import timed

    out, _ = timed(fn, device=device)      # warm-up (and the result)
    return out, min(timed(fn, device=device)[1] for _ in range(rounds))


# ------------------------------------------------------------------------------- SSD
def whisper_parts(directory: str | None):
    """tiny.en's processor, generation config and model config: from ``directory`` when it
    holds them, else from the embedded model (and saved to ``directory`` if one is given)."""
    from transformers import GenerationConfig, WhisperConfig, WhisperProcessor

    if directory and (Path(directory) / "config.json").is_file():
        return (WhisperProcessor.from_pretrained(directory), GenerationConfig.from_pretrained(directory),
                WhisperConfig.from_pretrained(directory))
    from ...pipeline.models.whisper.loader import load_whisper

    tiny, processor = load_whisper("embedded")
    if directory:
        for part in (processor, tiny.generation_config, tiny.config):
            part.save_pretrained(directory)
    return processor, tiny.generation_config, tiny.config


def random_whisper(dims: dict, device, dtype, processor_dir: str | None = None, ctc_classes: int = 96):
    """Whisper with ``dims`` and random weights, tiny.en's tokenizer, feature extractor and
    generation config (the vocabulary and mel bins are tiny.en's: large-v3-turbo has 128
    bins and two more tokens, which changes no cost that matters), and a random CTC head
    of the embedded head's shape on the model's width."""
    import torch
    from transformers import WhisperForConditionalGeneration

    from ...pipeline.models.whisper.adapter import WhisperAdapter
    from ...pipeline.models.whisper.ctc_head import CTCHead, CTCHeadConfig
    from ...pipeline.text import charset

    processor, generation, base = whisper_parts(processor_dir)
    config = base.__class__(**{**base.to_dict(), **dims})
    torch.manual_seed(0)
    model = WhisperForConditionalGeneration(config)
    model.generation_config = generation
    model = model.to(device=device, dtype=dtype).eval()
    head = CTCHead(CTCHeadConfig(d_model=config.d_model, num_classes=ctc_classes, frame_stack=2))
    head = head.to(device=device, dtype=dtype).eval()
    return WhisperAdapter(model, processor, device=device, ctc_head=head, ctc_decode=charset.decode)


def random_granite(dims: dict, device, dtype):
    """granite-speech with ``dims`` and random weights, a word-level tokenizer of the LLM's
    vocabulary size (the chat roles, the audio token and placeholder words) and a CTC
    vocabulary of the encoder's outputs; inputs are stacked log-mel features."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GraniteSpeechConfig, GraniteSpeechForConditionalGeneration, PreTrainedTokenizerFast

    from ...pipeline.models.granite_speech.adapter import GraniteSpeechAdapter

    text = dict(dims["text"])
    vocab = text.pop("vocab")
    words = GRANITE_SPECIALS + [f"w{i}" for i in range(vocab - len(GRANITE_SPECIALS))]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(GRANITE_SPECIALS)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=GRANITE_SPECIALS[0], unk_token="<unk>",
                                        pad_token=GRANITE_SPECIALS[0])
    ctc_vocab = ["<blank>"] + [chr(c) for c in range(97, 123)] + [" ", "'"]
    cfg = GraniteSpeechConfig(
        text_config=dict(model_type="granite", vocab_size=vocab, max_position_embeddings=4096,
                         eos_token_id=0, bos_token_id=0, pad_token_id=0, **text),
        encoder_config=dict(output_dim=len(ctc_vocab), dropout=0.0, **dims["encoder"]),
        projector_config=dict(model_type="blip_2_qformer", encoder_hidden_size=dims["encoder"]["hidden_dim"],
                              cross_attention_frequency=1, **dims["projector"]),
        audio_token_index=1, has_lora_adapter=False, downsample_rate=5, window_size=15,
        tie_word_embeddings=False)
    torch.manual_seed(0)
    model = GraniteSpeechForConditionalGeneration(cfg).to(device=device, dtype=dtype).eval()
    return GraniteSpeechAdapter(model, tokenizer, ctc_vocab, device=device)


def _other_token(adapter, token: int) -> int:
    """The next id after ``token`` that greedy decoding could emit (not end-of-text, not
    suppressed): a draft corrupted with it is rejected where it stands."""
    banned = adapter.suppress_mask.cpu()
    for step in range(1, adapter.vocab_size):
        t = (token + step) % adapter.vocab_size
        if t != adapter.eot_id and not banned[t]:
            return t
    raise ValueError("no other token can be emitted")


def _parameters(adapter) -> int:
    return sum(p.numel() for p in adapter.model.parameters())


def ssd_regimes(o) -> tuple[list[dict], dict]:
    import torch

    rows, summary = [], {}
    for name in o.ssd_models:
        if name == "whisper":
            adapter = random_whisper(TOY_WHISPER if o.quick else TURBO, o.device, o.dtype, o.whisper_processor)
            clips = _clips(o.batch, o.seconds, o.seed)
            encode = functools.partial(adapter.encode, clips)
            label = "whisper toy" if o.quick else "whisper large-v3-turbo"
        elif name == "granite":
            adapter = random_granite(TOY_GRANITE if o.quick else GRANITE_2B, o.device, o.dtype)
            dim = adapter.model.config.encoder_config.input_dim
            feats = torch.randn(o.batch, int(o.seconds * 50), dim, generator=torch.Generator().manual_seed(o.seed))
            encode = functools.partial(adapter.encode_features, feats)
            label = "granite-speech toy" if o.quick else "granite-speech-3.3-2b"
        else:
            raise SystemExit(f"--ssd-models: unknown {name!r} (whisper, granite)")
        got_rows, got = _ssd_on(adapter, label, encode, o)
        rows += got_rows
        summary.update({f"{k}_{name}" if k.startswith("ssd_") else k: v for k, v in got.items()})
        summary[f"ssd_parameters_{name}"] = _parameters(adapter)
        del adapter, encode      # free the model before the next one is built
    return rows, summary


def _ssd_on(adapter, label: str, encode, o) -> tuple[list[dict], dict]:
    """Full AR and SSD at the paper's rates on one model (see the module docstring)."""
    import torch

    from ...pipeline.decoding.ar.greedy import greedy_decode, seeds_from_cache
    from ...pipeline.decoding.ssd.decoder import VERIFY_HEAD_CHUNK
    from ...pipeline.decoding.ssd.verify import verify_drafts

    audio_s = o.seconds * o.batch
    enc, t_enc = _best(encode, o.device, o.rounds)
    states = enc.states
    with torch.inference_mode():
        ar, t_ar = _best(lambda: greedy_decode(adapter, states, max_new_tokens=o.tokens), o.device, o.rounds)
        _, t_ctc = _best(lambda: adapter.ctc_draft(enc), o.device, o.rounds)
    rows = [{"section": f"ssd {label}", "regime": "full AR", "gated": 0.0, "accepted": None, "encoder_s": t_enc,
             "ctc_s": 0.0, "verify_s": 0.0, "fallback_s": t_ar, "rtfx": audio_s / (t_enc + t_ar),
             "vs_ar": 1.0, "fallback_equals_ar": None}]
    summary = {"ssd_tokens_per_row": float(np.mean([len(t) for t in ar]))}
    static_fields, static = _static_ar(adapter, states, ar, t_ar, o)
    rows[0].update(static_fields)
    summary.update(static)
    static_loop = None
    if static_fields.get("static_s") is not None:
        from ...pipeline.decoding.ar.graphs import StaticDecoding

        # the fallback's static loop: CUDA graphs on a GPU, uncaptured on the CPU
        static_loop = StaticDecoding() if o.device.type == "cuda" else StaticDecoding(cpu_static=True)
    for regime, (gated, accepted) in PAPER_RATES.items():
        n = o.batch
        n_gate = round(gated * n)
        todo = list(range(n_gate, n))
        n_acc = round(accepted * len(todo))
        rejected = [i for i in todo[n_acc:] if len(ar[i]) >= 2]
        at = {i: max(1, min(len(ar[i]) - 1, int(o.reject_at * len(ar[i])))) for i in rejected}
        drafts = []
        for i in todo:
            d = list(ar[i])
            if i in at:    # another token than greedy's at the chosen position
                d[at[i]] = _other_token(adapter, d[at[i]])
            drafts.append(d)

        # tau 0: every draft token passes, so the pass projects every row's whole draft.
        # A random model's distributions are near-flat (no token reaches the paper's 0.1),
        # which would end every row at its first chunk; a real rejected row stops at the
        # chunk of its failure, so this is an upper bound on the verification's cost.
        def verify():
            return verify_drafts(adapter, states[todo], drafts, 0.0, head_chunk=VERIFY_HEAD_CHUNK) if todo else None

        def fallback(ver, pooled: int = 1, static=None):
            """The rejected rows' AR from their verified prefixes; ``pooled``: those of
            that many consecutive batches (the same rows again: seeds, states, prefixes)
            in one call."""
            if not rejected:
                return []
            pos = [todo.index(i) for i in rejected]
            lead = ver.lead.tolist()
            seeds = seeds_from_cache(ver.cache, pos, [lead[p] for p in pos],
                                     [ver.prompt_end + at[i] for i in rejected], [ar[i][at[i]] for i in rejected])
            limit = max(len(ar[i]) - at[i] for i in rejected)
            return greedy_decode(adapter, states[rejected * pooled], prefixes=[ar[i][:at[i]] for i in rejected] * pooled,
                                 max_new_tokens=limit, seeds=seeds * pooled, static=static)

        with torch.inference_mode():
            ver, t_ver = _best(verify, o.device, o.rounds)
            out, t_fb = _best(lambda: fallback(verify()), o.device, o.rounds)
            t_fb = max(0.0, t_fb - t_ver)    # the fallback alone (its seeds come from a fresh pass)
        same = [ar[i][:at[i]] + tokens == ar[i] for i, tokens in zip(rejected, out)]
        total = t_enc + t_ctc + t_ver + t_fb
        rows.append({"section": f"ssd {label}", "regime": regime, "gated": gated, "accepted": accepted,
                     "encoder_s": t_enc, "ctc_s": t_ctc, "verify_s": t_ver, "fallback_s": t_fb, "rtfx": audio_s / total,
                     "vs_ar": (t_enc + t_ar) / total, "fallback_rows": len(rejected),
                     "fallback_equals_ar": float(np.mean(same)) if same else None})
        summary[f"ssd_{regime}_vs_ar"] = (t_enc + t_ar) / total
        if static_loop is not None and rejected:
            # the same fallback over the static cache (graphs on CUDA), seeded the same way
            with torch.inference_mode():
                out_s, t_s = _best(lambda: fallback(verify(), static=static_loop), o.device, o.rounds)
            t_s = max(0.0, t_s - t_ver)
            rows[-1].update({"fallback_static_s": t_s, "fallback_static_vs_eager": t_fb / t_s if t_s else None,
                             "fallback_static_equals_eager": out_s == out})
            summary[f"ssd_{regime}_fallback_static_equals_eager"] = out_s == out
        for n_pool in o.pool:
            # One call for the rejected rows of n_pool batches; each batch's share of it.
            with torch.inference_mode():
                pooled_out, t_pool = _best(lambda: fallback(verify(), n_pool), o.device, o.rounds)
            t_pool = max(0.0, t_pool - t_ver) / n_pool
            same_p = [ar[i][:at[i]] + tokens == ar[i] for i, tokens in zip(rejected * n_pool, pooled_out)]
            total_p = t_enc + t_ctc + t_ver + t_pool
            rows.append({"section": f"ssd {label}", "regime": f"{regime}, pooled x{n_pool}", "gated": gated,
                         "accepted": accepted, "encoder_s": t_enc, "ctc_s": t_ctc, "verify_s": t_ver,
                         "fallback_s": t_pool, "rtfx": audio_s / total_p, "vs_ar": (t_enc + t_ar) / total_p,
                         "fallback_rows": len(rejected) * n_pool,
                         "fallback_equals_ar": float(np.mean(same_p)) if same_p else None})
            summary[f"ssd_{regime}_pooled{n_pool}_vs_ar"] = (t_enc + t_ar) / total_p
    return rows, summary


def _static_ar(adapter, states, ar, t_ar: float, o) -> tuple[dict, dict]:
    """Full AR's greedy loop over a static KV cache (pipeline.decoding.ar.static) next to
    the eager loop's ``ar`` (``t_ar`` s): uncaptured (``static_*``), and on CUDA replayed as
    CUDA graphs (``graphs_*``; the bucket's capture happens in the untimed warm-up). Fields
    for the full-AR row: the loop's seconds, its speed ratio to eager (``*_vs_eager``) and
    the share of rows whose tokens equal eager's (``*_equals_eager``); graphs also against
    the uncaptured static loop, which they must equal. None where the model has no
    static step (the eager loop decodes it)."""
    import torch

    from ...pipeline.decoding.ar.greedy import greedy_decode
    from ...pipeline.decoding.ar.graphs import StaticDecoding

    if adapter.static_step() is None:
        return {"static_s": None}, {}
    variants = [("static", StaticDecoding(cpu_static=True, capture=False))]
    if o.device.type == "cuda":
        variants.append(("graphs", StaticDecoding()))
    fields, summary, outs = {}, {}, {}
    for name, static in variants:
        with torch.inference_mode():
            outs[name], t = _best(lambda: greedy_decode(adapter, states, max_new_tokens=o.tokens, static=static),
                                  o.device, o.rounds)
        same = float(np.mean([a == b for a, b in zip(outs[name], ar)]))
        fields.update({f"{name}_s": t, f"{name}_vs_eager": t_ar / t, f"{name}_equals_eager": same})
        summary.update({f"ssd_ar_{name}_vs_eager": t_ar / t, f"ssd_ar_{name}_equals_eager": same})
    if "graphs" in outs:
        fields["graphs_equal_static"] = outs["graphs"] == outs["static"]
        fields["graphs_failed"] = bool(adapter.__dict__.get("_ar_graphs", {}).get("failed"))
        summary["ssd_ar_graphs_equal_static"] = fields["graphs_equal_static"]
        summary["ssd_ar_graphs_failed"] = fields["graphs_failed"]
    adapter.__dict__.pop("_ar_graphs", None)    # free the bucket's buffers before SSD
    return fields, summary


def _decoder_row(section: str, regime: str, t_enc: float, t_dec: float, t_greedy: float, audio_s: float) -> dict:
    """A decoder's row: full-model RTFx (encoder + decoder) and its ratio to greedy's."""
    return {"section": section, "regime": regime, "encoder_s": t_enc, "decoder_s": t_dec,
            "rtfx": audio_s / (t_enc + t_dec), "vs_greedy": (t_enc + t_greedy) / (t_enc + t_dec)}


# ---------------------------------------------------------------------------- CTC beam
def random_arpa(vocab: int, order: int, seed: int, per_order: int) -> str:
    """A back-off n-gram over token ids ``0..vocab-1`` in ARPA form, random but well formed
    (every prefix of an n-gram is listed): an LM of a realistic shape for speed only."""
    from ...pipeline.lm.arpa import token_word

    rng = np.random.default_rng(seed)
    words = [token_word(i) for i in range(vocab)]
    grams = [[(w,) for w in ["<s>", "</s>"] + words]]
    for n in range(2, order + 1):
        prev = grams[-1]
        picks = rng.integers(0, len(prev), size=per_order)
        nxt = rng.integers(0, vocab, size=per_order)
        grams.append(sorted({prev[p] + (words[w],) for p, w in zip(picks, nxt)
                             if prev[p][-1] != "</s>"}))
    lines = ["\\data\\"] + [f"ngram {n + 1}={len(g)}" for n, g in enumerate(grams)] + [""]
    for n, g in enumerate(grams):
        lines.append(f"\\{n + 1}-grams:")
        for gram in g:
            logp = -99.0 if gram == ("<s>",) else float(rng.uniform(-4.0, -0.3))
            backoff = f"\t{rng.uniform(-1.0, 0.0):.4f}" if n + 1 < order and gram[-1] != "</s>" else ""
            lines.append(f"{logp:.4f}\t{' '.join(gram)}{backoff}")
        lines.append("")
    return "\n".join(lines + ["\\end\\", ""])


def ctc_like_frames(n: int, frames: int, vocab1: int, blank: int, seed: int):
    """[n, frames, vocab1] log-probs shaped like a trained CTC model's: mostly blank, a token
    every few frames, a close rival now and then."""
    import torch

    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, frames, vocab1, generator=g)
    labels = torch.full((n, frames), blank, dtype=torch.long)
    token_at = torch.rand(n, frames, generator=g) < 0.3
    labels[token_at] = torch.randint(0, vocab1 - 1, (int(token_at.sum()),), generator=g)
    logits.scatter_add_(2, labels[..., None], torch.full((n, frames, 1), 9.0))
    rival_at = token_at & (torch.rand(n, frames, generator=g) < 0.25)
    rivals = torch.randint(0, vocab1 - 1, (int(rival_at.sum()),), generator=g)
    logits[rival_at, rivals] = logits[rival_at, labels[rival_at]] + 0.5 * torch.randn(len(rivals), generator=g)
    return logits.log_softmax(-1)


def ctc_beam_regime(o) -> tuple[list[dict], dict]:
    import tempfile

    import torch
    from transformers import ParakeetCTCConfig, ParakeetFeatureExtractor, ParakeetForCTC

    from ...pipeline.decoding.ctc_beam import CTCBeamSearch
    from ...pipeline.models.ctc_greedy import ctc_greedy
    from ...pipeline.lm.boosting import BoostingTree
    from ...pipeline.lm.ngpu_lm import NGramLM

    vocab = 64 if o.quick else 1024
    cfg = ParakeetCTCConfig(vocab_size=vocab + 1, pad_token_id=vocab,
                            **({"encoder_config": TOY_PARAKEET} if o.quick else {}))
    torch.manual_seed(0)
    model = ParakeetForCTC(cfg).to(device=o.device, dtype=o.dtype).eval()
    fe = ParakeetFeatureExtractor(feature_size=cfg.encoder_config.num_mel_bins)
    clips = _clips(o.batch, o.seconds, o.seed)
    audio_s = o.seconds * len(clips)

    def encode():
        feats = fe(clips, sampling_rate=16000, return_tensors="pt", padding=True)
        with torch.inference_mode():
            out = model(input_features=feats["input_features"].to(o.device, o.dtype),
                        attention_mask=feats["attention_mask"].to(o.device))
        return out.logits.float().log_softmax(-1)

    own, t_enc = _best(encode, o.device, o.rounds)
    blank = vocab
    lp = ctc_like_frames(len(clips), own.shape[1], vocab + 1, blank, o.seed).to(o.device)
    lengths = torch.full((len(clips),), own.shape[1], dtype=torch.long, device=o.device)
    with tempfile.TemporaryDirectory() as tmp:
        arpa = Path(tmp) / "lm.arpa"
        arpa.write_text(random_arpa(vocab, 4, o.seed, per_order=2000 if o.quick else 40000))
        lm = NGramLM.from_arpa(str(arpa), vocab).to(o.device)
    rng = np.random.default_rng(o.seed)
    phrases = [[[int(t) for t in rng.integers(0, vocab, size=int(rng.integers(2, 5)))] for _ in range(100)]]
    tree = BoostingTree.from_phrases(phrases, vocab_size=vocab).to(o.device)
    kw = dict(blank=blank, lm=lm, alpha_lm=0.5, beta=0.5, boost=tree, alpha_boost=1.0, prune_threshold=20.0,
              flop_top_n=8, flop_ratio=0.0005)
    rows, summary = [], {}
    greedy, t_greedy = _best(lambda: ctc_greedy(lp, lengths, blank=blank), o.device, o.rounds)
    rows.append(_decoder_row("ctc_beam", "greedy", t_enc, t_greedy, t_greedy, audio_s))
    results, times = {}, {}
    modes = [("eager", False, False)] + ([("cuda_graph", True, False)] if o.device.type == "cuda"
                                         else [("native", False, True)])
    for mode, graphs, native in modes:
        search = CTCBeamSearch(8, use_cuda_graphs=graphs, native=native, **kw)
        out, t_beam = _best(lambda: search(lp, lengths), o.device, o.rounds)
        if search.last_loop != mode:
            summary[f"ctc_beam_{mode}_fell_back_to"] = search.last_loop
        results[mode], times[mode] = out, t_beam
        rows.append(_decoder_row("ctc_beam", f"beam 8 + LM + 100 phrases ({search.last_loop})", t_enc, t_beam,
                                 t_greedy, audio_s))
        summary[f"ctc_beam_{mode}_vs_greedy"] = rows[-1]["vs_greedy"]
    other = modes[1][0]     # CUDA graphs on a GPU, the native loop on a CPU: the same search as eager
    a, b = results[other], results["eager"]
    summary[f"ctc_beam_{other}_equals_eager"] = a.tokens == b.tokens and bool(
        torch.equal(a.nbest_scores.cpu(), b.nbest_scores.cpu()))
    summary[f"ctc_beam_{other}_decoder_over_eager"] = times["eager"] / times[other]
    summary["ctc_beam_beam_differs_from_greedy"] = results["eager"].tokens != greedy.tokens
    return rows, summary


# --------------------------------------------------------------------------- transducer
def transducer_regime(o) -> tuple[list[dict], dict]:
    """TDT greedy and ALSD++ beam 4 on parakeet-tdt-0.6b's shape, AES++ beam 4 on an RNN-T
    predictor and joint of the same shape over the same frames; each loop eager and on its
    static path (CUDA graphs on a GPU, the static buffers uncaptured on a CPU): speed ratio
    and equality (tokens, frames, scores)."""
    import math

    import torch
    from transformers import (ParakeetFeatureExtractor, ParakeetForRNNT, ParakeetForTDT, ParakeetRNNTConfig,
                              ParakeetTDTConfig)

    from ...pipeline.decoding.transducer.greedy import transducer_greedy
    from ...pipeline.decoding.transducer.label_looping import LabelLoopingGreedy
    from ...pipeline.decoding.transducer.search import TransducerBeamSearch
    from ...pipeline.models.transducer.adapter import TransducerAdapter

    toy = {"vocab_size": 257, "blank_token_id": 256, "decoder_hidden_size": 64} if o.quick else {}
    cfg = ParakeetTDTConfig(**({"encoder_config": TOY_PARAKEET} if o.quick else {}), **toy)
    torch.manual_seed(0)
    model = ParakeetForTDT(cfg).to(device=o.device, dtype=o.dtype).eval()
    fe = ParakeetFeatureExtractor(feature_size=cfg.encoder_config.num_mel_bins)
    adapter = TransducerAdapter(model, fe, None, device=o.device)
    # AES++ searches RNN-T: the same predictor/joint shape; its encoder is never run
    rnnt_cfg = ParakeetRNNTConfig(encoder_config=TOY_PARAKEET, vocab_size=cfg.vocab_size,
                                  blank_token_id=cfg.blank_token_id, decoder_hidden_size=cfg.decoder_hidden_size)
    rnnt_model = ParakeetForRNNT(rnnt_cfg)
    with torch.no_grad():   # random logits are flat: blank at 1/V would fill every frame to max_symbols
        rnnt_model.joint.head.bias[cfg.blank_token_id] += math.log(cfg.vocab_size)
    rnnt = TransducerAdapter(rnnt_model.to(device=o.device, dtype=o.dtype).eval(), fe, None, device=o.device)
    clips = _clips(o.batch, o.seconds, o.seed)
    audio_s = o.seconds * len(clips)
    enc, t_enc = _best(lambda: adapter.encode(clips), o.device, o.rounds)
    frames, lengths = enc.states, enc.valid_frames
    greedy, t_greedy = _best(lambda: transducer_greedy(adapter, frames, lengths), o.device, o.rounds)
    search = TransducerBeamSearch(adapter, 4, loop="eager")
    beam, t_beam = _best(lambda: search(frames, lengths), o.device, o.rounds)
    one = TransducerBeamSearch(adapter, 1, loop="eager")(frames, lengths)
    rows = [_decoder_row("transducer", "greedy", t_enc, t_greedy, t_greedy, audio_s),
            _decoder_row("transducer", "alsd++ beam 4", t_enc, t_beam, t_greedy, audio_s)]
    summary = {"transducer_alsd4_vs_greedy": rows[1]["vs_greedy"],
               "transducer_tokens_per_row": float(np.mean([len(t) for t in greedy.tokens])),
               "transducer_beam1_equals_greedy": one.tokens == greedy.tokens,
               "transducer_greedy_eager_share": t_greedy / (t_enc + t_greedy)}
    fast = "cuda_graph" if o.device.type == "cuda" else "static"

    def same(a, b) -> bool:
        return a.tokens == b.tokens and a.frames == b.frames and bool(torch.equal(a.scores.cpu(), b.scores.cpu()))

    def compare(name: str, label: str, eager_out, t_eager: float, fast_search, t_ref: float) -> float:
        out, t_fast = _best(lambda: fast_search(frames, lengths), o.device, o.rounds)
        if fast_search.last_loop != fast:
            summary[f"transducer_{name}_{fast}_fell_back_to"] = fast_search.last_loop
        rows.append(_decoder_row("transducer", f"{label} ({fast_search.last_loop})", t_enc, t_fast, t_ref, audio_s))
        summary[f"transducer_{name}_{fast}_equals_eager"] = same(out, eager_out)
        summary[f"transducer_{name}_{fast}_decoder_over_eager"] = t_eager / t_fast
        return t_fast

    t_fast_greedy = compare("greedy", "greedy label-looping", greedy, t_greedy,
                            LabelLoopingGreedy(adapter, loop=fast), t_greedy)
    summary[f"transducer_greedy_{fast}_share"] = t_fast_greedy / (t_enc + t_fast_greedy)
    compare("alsd4", "alsd++ beam 4", beam, t_beam, TransducerBeamSearch(adapter, 4, loop=fast),
            t_fast_greedy)
    summary[f"transducer_alsd4_{fast}_vs_greedy_{fast}"] = rows[-1]["vs_greedy"]
    aes = TransducerBeamSearch(rnnt, 4, algorithm="aes", loop="eager")
    aes_out, t_aes = _best(lambda: aes(frames, lengths), o.device, o.rounds)
    rows.append(_decoder_row("transducer", "aes++ beam 4, rnn-t (eager)", t_enc, t_aes, t_greedy, audio_s))
    compare("aes4", "aes++ beam 4, rnn-t", aes_out, t_aes,
            TransducerBeamSearch(rnnt, 4, algorithm="aes", loop=fast), t_fast_greedy)
    return rows, summary


def _plot(rows, args) -> None:
    """A bar per row, beside ``--out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .data import save_figure

    if not getattr(args, "out", None):
        return
    path = str(Path(args.out).with_suffix(".png"))
    fig, ax = plt.subplots(figsize=(9, 3.5))
    shown = [r for r in rows if r.get("rtfx")]
    ax.bar([f'{r["section"]}: {r["regime"]}' for r in shown], [r["rtfx"] for r in shown])
    ax.set_ylabel("RTFx (audio s / s)")
    ax.set_yscale("log")
    ax.tick_params(axis="x", labelrotation=35, labelsize=7)
    fig.suptitle("GPU regimes (random weights): SSD vs AR, CTC beam vs greedy, ALSD++ vs greedy")
    save_figure(fig, path, dpi=110)
