"""Independent references for the transducer tests: tiny random Parakeet RNN-T / TDT
checkpoints built here, a brute-force search over every alignment, and a plain
per-utterance ALSD / AES (hypothesis objects, one joint call per hypothesis) written from
the description in "Pushing the Limits of Beam Search Decoding for Transducer-based ASR
models" (§2.2-2.3), the paper's baseline."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

PIECES = ["<unk>", "▁", "▁the", "▁a", "th", "er", "in"] + list("abcdefghijklmnopqrstuvwxyz'") + ["<pad>"]
TINY = ["<unk>", "▁a"]   # brute-force sized: 2 tokens + blank


def build(kind: str, root, pieces=PIECES, durations=(0, 1, 2, 3, 4), max_symbols: int = 3,
          blank_bias: float = 1.0, zero_duration_bias: float = 0.0, seed: int = 0):
    """A random ParakeetForRNNT ("rnnt") or ParakeetForTDT ("tdt") with a SentencePiece-
    style tokenizer (blank = the last id), saved with its processor to ``root``. Weights are
    drawn at unit gain (transformers' init makes the encoder output nearly constant over
    time, so every frame would decode alike); ``blank_bias`` is added to the blank's logit
    and ``zero_duration_bias`` to duration 0's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import (ParakeetFeatureExtractor, ParakeetForRNNT, ParakeetForTDT, ParakeetProcessor,
                              ParakeetRNNTConfig, ParakeetTDTConfig, ParakeetTokenizer)

    spm = Tokenizer(models.Unigram([(p, -1.0 - 0.1 * i) for i, p in enumerate(pieces)], unk_id=0))
    spm.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    spm.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    tok = ParakeetTokenizer(tokenizer_object=spm, unk_token="<unk>", pad_token="<pad>")
    v = len(pieces) + 1
    enc = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=48, num_mel_bins=16,
               subsampling_conv_channels=8, conv_kernel_size=5)
    common = dict(vocab_size=v, blank_token_id=v - 1, pad_token_id=len(pieces) - 1, decoder_hidden_size=24,
                  num_decoder_layers=1, max_symbols_per_step=max_symbols, encoder_config=enc)
    if kind == "tdt":
        cfg, cls = ParakeetTDTConfig(durations=list(durations), **common), ParakeetForTDT
    else:
        cfg, cls = ParakeetRNNTConfig(**common), ParakeetForRNNT
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * 2.0 / p.shape[-1] ** 0.5)
        model.joint.head.bias[v - 1] += blank_bias
        if kind == "tdt":
            if 0 in durations:
                model.joint.head.bias[v + list(durations).index(0)] += zero_duration_bias
    model.generation_config.decoder_start_token_id = v - 1
    processor = ParakeetProcessor(ParakeetFeatureExtractor(feature_size=16), tok)
    model.save_pretrained(root)
    processor.save_pretrained(root)
    return model, processor


# ---------------------------------------------------------------------------- rules
def _moves(model, token: int, d_value: int | None, sym: int):
    """(frames advanced, tokens at the new frame) after emitting ``token`` with duration
    ``d_value`` (None for RNN-T) at a frame where ``sym`` tokens were emitted."""
    blank = token == model.blank
    adv = (1 if blank else 0) if d_value is None else d_value
    if blank and adv == 0:
        adv = 1
    sym = 0 if blank else sym + 1
    if not blank and adv == 0 and sym >= model.max_symbols:
        adv = 1
    return adv, (0 if adv > 0 else sym)


def _options(model, tok_lp, dur_lp):
    """Every (token, duration value, log-prob) of one joint output."""
    if dur_lp is None:
        return [(k, None, float(tok_lp[k])) for k in range(model.vocab_size)]
    return [(k, d, float(tok_lp[k]) + float(dur_lp[j]))
            for k in range(model.vocab_size) for j, d in enumerate(model.durations)]


def _lm_index(model, k: int) -> int:
    return k if k < model.blank else k - 1


def brute_force(model, frames: torch.Tensor, length: int) -> tuple[float, list[int]]:
    """The best alignment score over every alignment of ``frames[:length]`` (no fusion),
    and its tokens: a depth-first walk over the alignment tree."""
    best = [-math.inf, []]
    memo = {}   # prefix -> (predictor state, joint log-probs at every frame)

    def at(tokens, state):
        if tokens not in memo:
            out = model.predictor_output(state).expand(length, -1)
            memo[tokens] = (state, model.joint(frames[:length], out))
        return memo[tokens]

    def walk(t, sym, tokens, state, score):
        if t >= length:
            if score > best[0]:
                best[0], best[1] = score, list(tokens)
            return
        _, (tok_lp, dur_lp) = at(tokens, state)
        for k, d, lp in _options(model, tok_lp[t], None if dur_lp is None else dur_lp[t]):
            adv, s2 = _moves(model, k, d, sym)
            if k == model.blank:
                walk(t + adv, s2, tokens, state, score + lp)
            else:
                nxt = tokens + (k,)
                st = memo[nxt][0] if nxt in memo else model.predictor_step(torch.tensor([k]), state)
                walk(t + adv, s2, nxt, st, score + lp)

    walk(0, 0, (), model.predictor_init(1), 0.0)
    return best[0], best[1]


# ------------------------------------------------------------------ reference search
@dataclass
class Hyp:
    tokens: tuple
    t: int
    sym: int
    score: float
    state: tuple         # predictor state, or (parent state, token) until the hypothesis survives
    fusion: tuple        # one int state per fusion model


def reference_search(model, frames: torch.Tensor, length: int, beam: int, algorithm: str = "alsd",
                     fusion=(), lam: float = 0.0, blank_scoring: str = "lm", pruning: str = "late",
                     gamma: float | None = None):
    """Plain per-utterance ALSD / AES: a list of hypotheses, each expanded alone into every
    token (and duration), fused (eq. 2 or 3; early pruning keeps the ``beam`` best tokens
    by the ASR score first), merged when transcript, frame and tokens at that frame agree
    (the better score wins), then the ``beam`` best kept. ``fusion``: [(model, weight)],
    ``lam``: the LM's weight lambda (for eq. 3). Returns (score with final fusion scores,
    tokens). ``gamma``: a hypothesis keeps only the expansions within ``gamma`` of its best
    one (mAES's expansion beam)."""
    start = tuple(int(fm.init_states(1)[0]) for fm, _ in fusion)
    hyps = [Hyp((), 0, 0, 0.0, model.predictor_init(1), start)]

    def expand(h: Hyp, frame: int | None):
        if h.t >= length or (frame is not None and h.t > frame):   # AES: a blank waits for the next frame
            return [h]
        tok_lp, dur_lp = model.joint(frames[h.t][None], model.predictor_output(h.state))
        tok_lp, dur_lp = tok_lp[0], None if dur_lp is None else dur_lp[0]
        p_blank = float(tok_lp[model.blank])
        if blank_scoring == "lm" and lam:
            nb_term, blank_score = lam * math.log(1 - math.exp(p_blank)), (1 + lam) * p_blank
        else:
            nb_term, blank_score = 0.0, p_blank
        allowed = range(model.vocab_size)
        if pruning == "early" and fusion:
            allowed = tok_lp.topk(min(beam, model.vocab_size)).indices.tolist()
        out = []
        for k in allowed:
            if k == model.blank:
                base, fus, st, toks = blank_score, h.fusion, h.state, h.tokens
            else:
                base, fus_l = float(tok_lp[k]) + nb_term, []
                for (fm, w), s in zip(fusion, h.fusion):
                    sc, nx = fm.advance(torch.tensor([s]))
                    base += w * float(sc[0, _lm_index(model, k)])
                    fus_l.append(int(nx[0, _lm_index(model, k)]))
                fus, st, toks = tuple(fus_l), ("pending", h.state, k), h.tokens + (k,)
            durs = [(None, 0.0)] if dur_lp is None else [(d, float(dur_lp[j])) for j, d in enumerate(model.durations)]
            for d, dlp in durs:
                adv, sym = _moves(model, k, d, h.sym)
                out.append(Hyp(toks, h.t + adv, sym, h.score + base + dlp, st, fus))
        if gamma is not None:
            best = max(c.score for c in out)
            out = [c for c in out if c.score >= best - gamma]
        return out

    def prune(cands):
        best = {}
        for c in cands:
            key = (c.tokens, c.t, c.sym)
            if key not in best or c.score > best[key].score:
                best[key] = c
        kept = sorted(best.values(), key=lambda c: -c.score)[:beam]
        for c in kept:
            if isinstance(c.state[0], str):
                c.state = model.predictor_step(torch.tensor([c.state[2]]), c.state[1])
        return kept

    if algorithm == "alsd":
        while any(h.t < length for h in hyps):
            hyps = prune([c for h in hyps for c in expand(h, None)])
    else:
        for f in range(length):
            for _ in range(model.max_symbols):
                if not any(h.t == f for h in hyps):
                    break
                hyps = prune([c for h in hyps for c in expand(h, f)])
    finals = []
    for h in hyps:
        extra = sum(w * float(fm.final(torch.tensor([s]))[0]) for (fm, w), s in zip(fusion, h.fusion))
        finals.append((h.score + extra, list(h.tokens)))
    return max(finals, key=lambda x: x[0])
