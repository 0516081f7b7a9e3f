"""FlexCTC beam search on real CTC log-probs (pyctcdecode's libri_logits.json, 371 x 29)
against flashlight-text's LexiconFreeDecoder and pyctcdecode, and NGPU-LM fusion against
flashlight's KenLM on the same token-level ARPA."""
from __future__ import annotations

import json
import os
import re

import pytest
import torch

from pipeline.decoding.ctc_beam import CTCBeamSearch

pyctcdecode = pytest.importorskip("pyctcdecode")
pytest.importorskip("flashlight.lib.text.decoder")

from pipeline.decoding.reference_decoders import FlashlightCTC, PyCTCDecode  # noqa: E402

torch.set_num_threads(1)
LABELS = [" "] + [chr(c) for c in range(97, 123)] + ["'", ""]   # blank last (28)
BLANK = 28


def text(ids):
    return "".join(LABELS[i] for i in ids)


@pytest.fixture(scope="module")
def libri():
    path = os.path.join(os.path.dirname(pyctcdecode.__file__), "tests", "sample_data", "libri_logits.json")
    with open(path) as fh:
        return torch.tensor(json.load(fh), dtype=torch.float32).log_softmax(-1)


@pytest.fixture(scope="module")
def libri_arpa(tmp_path_factory):
    """A character 6-gram over the libri labels from real English text (lmplz)."""
    from pipeline.lm.arpa import tokens_line
    from pipeline.lm.build import find_lmplz, run_lmplz
    from pipeline.lm.sample_text import pydoc_sentences

    try:
        find_lmplz(build=False)
    except FileNotFoundError:
        pytest.skip("lmplz not built (bash scripts/build_kenlm.sh)")
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
def test_no_lm_top_hypothesis_matches_flashlight_and_pyctcdecode(libri, beam):
    ours = CTCBeamSearch(beam, blank=BLANK)(libri[None])
    fl_tokens, fl_score = FlashlightCTC(29, BLANK, beam, space=0).decode(libri.numpy())
    assert ours.tokens[0] == fl_tokens
    assert float(ours.scores[0]) == pytest.approx(fl_score, abs=1e-3)
    assert text(ours.tokens[0]) == PyCTCDecode(LABELS).decode(libri.numpy(), beam)


@pytest.mark.parametrize("temperature", [1.0, 4.0])
@pytest.mark.parametrize("alpha", [0.3, 0.8])
def test_ngpu_lm_fusion_matches_flashlight_kenlm(libri, libri_arpa, temperature, alpha):
    """Same ARPA, same weight (flashlight's log10 KenLM scores rescaled): same best
    hypothesis and the same eq. 1 score. Temperature 4 flattens the posteriors so the
    LM really changes the search."""
    from pipeline.lm.ngpu_lm import NGramLM

    lp = (libri / temperature).log_softmax(-1)
    lm = NGramLM.from_arpa(libri_arpa, 28)
    ours = CTCBeamSearch(8, blank=BLANK, lm=lm, alpha_lm=alpha)(lp[None])
    fl_tokens, fl_score = FlashlightCTC(29, BLANK, 8, space=0, arpa_path=libri_arpa,
                                        lm_weight=alpha).decode(lp.numpy())
    assert text(ours.tokens[0]) == text(fl_tokens)
    assert float(ours.scores[0]) == pytest.approx(fl_score, abs=2e-3)


def test_dense_fusion_table_is_exact(libri, libri_arpa):
    from pipeline.decoding.fusion_table import DenseFusionTable
    from pipeline.lm.ngpu_lm import NGramLM

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
    kenlm = pytest.importorskip("kenlm")
    from pipeline.lm.arpa import tokens_line
    from pipeline.lm.ngpu_lm import NGramLM

    lp = (libri / 4.0).log_softmax(-1)
    alpha, beta = 0.6, 0.4
    res = CTCBeamSearch(8, blank=BLANK, lm=NGramLM.from_arpa(libri_arpa, 28), alpha_lm=alpha, beta=beta)(lp[None])
    align = res.alignments[0, 0]
    acoustic = float(lp.gather(1, align[:, None]).sum())
    lm_log10 = kenlm.Model(libri_arpa).score(tokens_line(res.tokens[0]), bos=True, eos=True)
    expected = acoustic + alpha * lm_log10 * 2.302585092994046 + beta * len(res.tokens[0])
    assert float(res.scores[0]) == pytest.approx(expected, abs=2e-3)


def test_flop_on_real_log_probs_keeps_the_exact_result(libri, libri_arpa):
    """Seed 003's point: on real (peaky) posteriors, top-N + relative-threshold token
    pruning changes nothing, while it keeps ~1-2 of 29 tokens per frame."""
    from pipeline.decoding.flop import surviving_tokens
    from pipeline.lm.ngpu_lm import NGramLM

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
