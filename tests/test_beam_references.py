"""FlexCTC beam search on real CTC log-probs (pyctcdecode's libri_logits.json, 371 x 29)
against flashlight-text's LexiconFreeDecoder and pyctcdecode, and NGPU-LM fusion against
flashlight's KenLM on the same token-level ARPA.

Every comparison runs on an input where the property under test could break: the no-LM
tests use flattened posteriors where the n-best list (max merge) or the best hypothesis
itself (logsumexp merge) differs from greedy CTC, and the LM tests use weights at which
the LM changes the best path; each test asserts that about its input first."""
from __future__ import annotations

import json
import math
import os
import re

import flashlight.lib.text.decoder  # noqa: F401  (test extra: a missing one must fail)
import kenlm
import numpy as np
import pyctcdecode
import pytest
import torch

from shardscribe.pipeline.decoding.ctc_beam import CTCBeamSearch
from shardscribe.pipeline.training.references.ctc_decoders import FlashlightCTC, PyCTCDecode

torch.set_num_threads(1)
LABELS = [" "] + [chr(c) for c in range(97, 123)] + ["'", ""]   # blank last (28)
BLANK = 28


def text(ids):
    return "".join(LABELS[i] for i in ids)


def collapse(labels):
    out, prev = [], None
    for x in labels:
        if x != BLANK and x != prev:
            out.append(int(x))
        prev = x
    return out


def greedy(lp):
    return collapse(lp.argmax(-1).tolist())


def flatten(libri, temperature):
    """Real posteriors at a temperature, with two changes that matter only to the
    comparisons: a +-0.01 fixed random jitter on the logits, because the stored libri
    logits are quantised and full of EXACT score ties, where which hypothesis survives is
    arbitrary (in every implementation); and one first frame that is certainly blank:
    flashlight starts every hypothesis on its silence token, so a space on frame 0 would
    be a repeat for it and a new token for us and pyctcdecode."""
    g = torch.Generator().manual_seed(0)
    jitter = 0.01 * torch.randn(libri.shape, generator=g)
    first = torch.full((1, libri.shape[1]), -1e4)
    first[0, BLANK] = 0.0
    return torch.cat([first, (libri / temperature + jitter).log_softmax(-1)]).log_softmax(-1)


def ours_nbest(res):
    return {tuple(t): float(s) for t, s in zip(res.nbest_tokens[0], res.nbest_scores[0])
            if math.isfinite(float(s))}


def flashlight_nbest(decoder: FlashlightCTC, lp, log_add: bool):
    """Every final flashlight hypothesis, collapsed to its transcript; hypotheses that
    differ only in their last frame label merged (max or logadd) as our search does."""
    emissions = np.ascontiguousarray(lp.numpy(), dtype=np.float32)
    out = {}
    for hyp in decoder.decoder.decode(emissions.ctypes.data, *emissions.shape):
        toks = tuple(collapse([t for t in list(hyp.tokens)[1:-1] if t >= 0]))
        if toks in out:
            out[toks] = float(np.logaddexp(out[toks], hyp.score)) if log_add else max(out[toks], hyp.score)
        else:
            out[toks] = float(hyp.score)
    return out


def ctc_log_prob(lp, toks):
    """log P(transcript | x) summed over ALL alignments (torch's CTC forward algorithm)."""
    return -float(torch.nn.functional.ctc_loss(
        lp[:, None].double(), torch.tensor([list(toks)]), torch.tensor([lp.shape[0]]),
        torch.tensor([len(toks)]), blank=BLANK, reduction="sum", zero_infinity=False))


@pytest.fixture(scope="module")
def libri():
    path = os.path.join(os.path.dirname(pyctcdecode.__file__), "tests", "sample_data", "libri_logits.json")
    with open(path) as fh:
        return torch.tensor(json.load(fh), dtype=torch.float32).log_softmax(-1)


@pytest.fixture(scope="module")
def libri_arpa(tmp_path_factory):
    """A character 6-gram over the libri labels from real English text (lmplz, built by
    ``bash scripts/setup.sh --test``; missing, the test fails)."""
    from shardscribe.pipeline.lm.arpa import tokens_line
    from shardscribe.pipeline.lm.build import find_lmplz, run_lmplz
    from shardscribe.pipeline.training.sample_text import pydoc_sentences

    find_lmplz(build=False)
    out = tmp_path_factory.mktemp("libri-lm")
    index = {c: i for i, c in enumerate(LABELS[:-1])}
    with open(out / "corpus.txt", "w") as fh:
        for sentence in pydoc_sentences():
            s = re.sub(" +", " ", re.sub(r"[^a-z' ]+", " ", sentence.lower())).strip()
            if s:
                fh.write(tokens_line([index[c] for c in s]) + "\n")
    run_lmplz(out / "corpus.txt", out / "lm.arpa", order=6)
    return str(out / "lm.arpa")


@pytest.mark.parametrize("beam", [4, 16])
def test_no_lm_max_merge_nbest_matches_flashlight(libri, beam):
    """Max merge, beta 0, no LM: the best hypothesis is provably greedy CTC (the per-frame
    argmax path is the best alignment of all), so asserted as such; what the beam adds
    is the rest of the n-best list, which must be flashlight's (same transcripts, same
    Viterbi scores)."""
    lp = flatten(libri, 2.0)
    res = CTCBeamSearch(beam, blank=BLANK)(lp[None])
    assert res.tokens[0] == greedy(lp)
    ours = ours_nbest(res)
    assert len(ours) == beam                       # a full list: beam - 1 non-greedy entries
    ref = flashlight_nbest(FlashlightCTC(29, BLANK, beam, space=0), lp, log_add=False)
    assert set(ours) == set(ref)
    for toks, score in ours.items():
        assert score == pytest.approx(ref[toks], abs=1e-3), text(toks)
    # pyctcdecode (prefix probabilities, whitespace-normalised words) agrees on the best
    assert text(res.tokens[0]) == PyCTCDecode(LABELS).decode(lp.numpy(), beam)


@pytest.mark.parametrize("beam", [4, 8, 16])
def test_no_lm_prefix_probability_search_beats_greedy_like_flashlight_and_pyctcdecode(libri, beam):
    """Logsumexp merge (prefix probability) on flattened real posteriors, where the best
    transcript is NOT greedy CTC's: flashlight (log_add) and pyctcdecode (which always
    sums) find the same one, flashlight the same n-best list with the same scores, and the CTC forward
    algorithm confirms the transcript really is more probable than greedy's. preselect
    = V+1 merges every candidate before selection, as flashlight does."""
    lp = flatten(libri, 6.0)
    res = CTCBeamSearch(beam, blank=BLANK, merge="logsumexp", preselect=29)(lp[None])
    best, g = res.tokens[0], greedy(lp)
    assert best != g
    assert ctc_log_prob(lp, best) > ctc_log_prob(lp, g) + 0.1
    ours = ours_nbest(res)
    assert len(ours) == beam
    ref = flashlight_nbest(FlashlightCTC(29, BLANK, beam, space=0, log_add=True), lp, log_add=True)
    assert max(ref, key=ref.get) == tuple(best)
    assert set(ours) == set(ref)
    for toks, score in ours.items():
        # the same partial sum over the surviving alignments as flashlight's, which can
        # never exceed the full forward-algorithm probability
        assert score == pytest.approx(ref[toks], abs=1e-3), text(toks)
        assert score <= ctc_log_prob(lp, toks) + 1e-3
    py = PyCTCDecode(LABELS).decoder.decode_beams(lp.numpy(), beam_width=beam, beam_prune_logp=-1e9,
                                                  token_min_logp=-1e9, prune_history=False)
    assert py[0][0] == " ".join(text(best).split())


@pytest.mark.parametrize("temperature", [2.0, 4.0])
def test_ngpu_lm_fusion_matches_flashlight_kenlm(libri, libri_arpa, temperature):
    """Same ARPA, same weight (flashlight's log10 KenLM scores rescaled), at a weight where
    the LM changes the best path (asserted against the no-LM search): flashlight finds
    the same best hypothesis with the same eq. 1 score, and every n-best entry's score
    decomposes into the acoustic score of its alignment + alpha * KenLM's sentence
    log-prob (flashlight recombines on n-gram context, so its lists are not ours)."""
    from shardscribe.pipeline.lm.arpa import tokens_line
    from shardscribe.pipeline.lm.ngpu_lm import NGramLM

    alpha = 0.8
    lp = (libri / temperature).log_softmax(-1)
    lm = NGramLM.from_arpa(libri_arpa, 28)
    ours = CTCBeamSearch(8, blank=BLANK, lm=lm, alpha_lm=alpha)(lp[None])
    no_lm = CTCBeamSearch(8, blank=BLANK)(lp[None])
    assert ours.tokens[0] != no_lm.tokens[0]
    fl_tokens, fl_score = FlashlightCTC(29, BLANK, 8, space=0, arpa_path=libri_arpa,
                                        lm_weight=alpha).decode(lp.numpy())
    assert ours.tokens[0] == fl_tokens
    assert float(ours.scores[0]) == pytest.approx(fl_score, abs=2e-3)
    model = kenlm.Model(libri_arpa)
    finite = 0
    for i, (toks, score) in enumerate(zip(ours.nbest_tokens[0], ours.nbest_scores[0])):
        if not math.isfinite(float(score)):
            continue
        finite += 1
        align = ours.alignments[0, i]
        assert collapse(align.tolist()) == toks
        acoustic = float(lp.gather(1, align[:, None]).sum())
        lm_ln = model.score(tokens_line(toks), bos=True, eos=True) * math.log(10.0)
        assert float(score) == pytest.approx(acoustic + alpha * lm_ln, abs=2e-3), text(toks)
    assert finite > 4


def test_dense_fusion_table_is_exact(libri, libri_arpa):
    from shardscribe.pipeline.decoding.ctc_beam.fusion_table import DenseFusionTable
    from shardscribe.pipeline.lm.ngpu_lm import NGramLM

    lm = NGramLM.from_arpa(libri_arpa, 28)
    lp = (libri / 4.0).log_softmax(-1)[None].repeat(2, 1, 1)
    lengths = torch.tensor([371, 200])
    kw = dict(beam_size=6, blank=BLANK, lm=lm, alpha_lm=0.5, beta=0.5)
    dense = CTCBeamSearch(**kw)
    assert isinstance(dense.lm, DenseFusionTable)
    graph = CTCBeamSearch(dense_fusion_max_bytes=0, **kw)
    assert graph.lm is lm
    a, b = dense(lp, lengths), graph(lp, lengths)
    assert a.nbest_tokens == b.nbest_tokens
    assert torch.equal(a.nbest_scores, b.nbest_scores)
    for flop in [dict(flop_top_n=5, flop_ratio=1e-3)]:
        a, b = CTCBeamSearch(**kw, **flop)(lp, lengths), CTCBeamSearch(dense_fusion_max_bytes=0, **kw, **flop)(lp, lengths)
        assert a.nbest_tokens == b.nbest_tokens
        assert torch.equal(a.nbest_scores, b.nbest_scores)


def test_lm_score_of_best_hypothesis_is_kenlm_sentence_score(libri, libri_arpa):
    """Score decomposition: best score = acoustic Viterbi score of its alignment +
    alpha * KenLM sentence log-prob (natural log) + beta * N."""
    from shardscribe.pipeline.lm.arpa import tokens_line
    from shardscribe.pipeline.lm.ngpu_lm import NGramLM

    lp = (libri / 4.0).log_softmax(-1)
    alpha, beta = 0.6, 0.4
    res = CTCBeamSearch(8, blank=BLANK, lm=NGramLM.from_arpa(libri_arpa, 28), alpha_lm=alpha, beta=beta)(lp[None])
    align = res.alignments[0, 0]
    acoustic = float(lp.gather(1, align[:, None]).sum())
    lm_log10 = kenlm.Model(libri_arpa).score(tokens_line(res.tokens[0]), bos=True, eos=True)
    expected = acoustic + alpha * lm_log10 * 2.302585092994046 + beta * len(res.tokens[0])
    assert float(res.scores[0]) == pytest.approx(expected, abs=2e-3)


def test_flop_on_real_log_probs_keeps_the_exact_result(libri, libri_arpa):
    """The point of "FLToP CTC: Frame-Level Token Pruning via Relative Threshold": on real
    (peaky) posteriors, top-N + relative-threshold token pruning changes nothing, while it
    keeps ~1-2 of 29 tokens per frame."""
    from shardscribe.pipeline.decoding.ctc_beam.flop import surviving_tokens
    from shardscribe.pipeline.lm.ngpu_lm import NGramLM

    lm = NGramLM.from_arpa(libri_arpa, 28)
    lp = libri[None]
    exact = CTCBeamSearch(8, blank=BLANK, lm=lm, alpha_lm=0.5)(lp)
    pruned = CTCBeamSearch(8, blank=BLANK, lm=lm, alpha_lm=0.5, flop_top_n=8, flop_ratio=1e-3,
                           compress_frames=False)(lp)
    assert pruned.tokens == exact.tokens
    assert torch.equal(pruned.scores, exact.scores)
    # folded single-token runs: the same search up to float summation order
    folded = CTCBeamSearch(8, blank=BLANK, lm=lm, alpha_lm=0.5, flop_top_n=8, flop_ratio=1e-3)(lp)
    assert folded.tokens == exact.tokens and folded.token_frames == exact.token_frames
    assert float(folded.scores[0]) == pytest.approx(float(exact.scores[0]), abs=1e-3)
    assert float(surviving_tokens(lp, torch.tensor([371]), 8, 1e-3)[0]) < 2.0
