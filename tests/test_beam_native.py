"""The native CPU frame loop (pipeline.decoding.ctc_beam.loop_native) against the torch frame
step it replaces: identical transcripts, emission frames, n-best lists, scores (bit for
bit: same float summation order), alignments of live hypotheses and live-beam counts
(on inputs without exact score ties),
with and without FLToP and frame compression, dense LM and boosting tables, an insertion
bonus alone, blank at either end, pruning off and on, and preselect 1-3. The torch step
is itself checked against brute force and flashlight-text (test_beam_search.py,
test_beam_references.py)."""
from __future__ import annotations

import pytest
import torch

from beam_reference import BigramTable, fusion_kwargs, peaky_log_probs
from shardscribe.pipeline.decoding.ctc_beam import CTCBeamSearch
from shardscribe.pipeline.decoding.ctc_beam import loop_native
from shardscribe.pipeline.decoding.ctc_beam.fusion_table import DenseFusionTable

torch.set_num_threads(1)


def _same(a, b):
    assert a.tokens == b.tokens
    assert a.token_frames == b.token_frames
    assert a.nbest_tokens == b.nbest_tokens
    assert a.nbest_frames == b.nbest_frames
    assert torch.equal(a.nbest_scores, b.nbest_scores)
    finite = torch.isfinite(b.nbest_scores)
    assert torch.equal(a.alignments[finite], b.alignments[finite])
    if b.avg_beams is not None:
        assert torch.equal(a.avg_beams, b.avg_beams)


def _both(kw, lp, lengths):
    native = CTCBeamSearch(native=True, **kw)
    eager = CTCBeamSearch(native=False, **kw)
    out = native(lp, lengths), eager(lp, lengths)
    # a silent fallback to the torch step would make every comparison trivially equal
    assert native.last_loop == "native"
    assert eager.last_loop == "eager"
    return out


def test_library_builds_here():
    # setup.sh installs a C compiler; without one the search silently uses the torch step,
    # which would hide a broken native build from every other test in this file
    assert loop_native.available()


@pytest.mark.parametrize("fusion", ["none", "beta", "lm", "lm+boost"])
@pytest.mark.parametrize("flop", ["off", "on", "on-uncompressed"])
@pytest.mark.parametrize("seed", range(3))
def test_native_loop_equals_torch_step(fusion, flop, seed):
    b, t, v1 = 6, 60, 7
    lp = peaky_log_probs(b, t, v1, seed)
    lengths = torch.tensor([60, 1, 37, 0, 52, 44])
    kw = dict(beam_size=5, prune_threshold=6.0, track_beams=True, nbest=5)
    if fusion != "none":
        kw.update(beta=0.3)
    kw.update(fusion_kwargs(fusion, v1, seed, dense_lm=True))
    if flop != "off":
        kw.update(flop_top_n=4, flop_ratio=0.02, compress_frames=flop == "on")
    search = CTCBeamSearch(**kw)
    # the native loop serves dense tables only: both models must have been folded
    assert all(isinstance(m, DenseFusionTable) for m in (search.lm, search.boost) if m is not None)
    native, eager = _both(kw, lp, lengths)
    _same(native, eager)


@pytest.mark.parametrize("blank", [0, 6])
@pytest.mark.parametrize("prune", [None, 3.0])
@pytest.mark.parametrize("preselect", [1, 2, 3])
def test_native_loop_equals_torch_step_on_flat_posteriors(blank, prune, preselect):
    """Less peaky input: many live hypotheses, many recombinations and pruned columns."""
    g = torch.Generator().manual_seed(blank * 7 + preselect)
    lp = (1.5 * torch.randn(4, 30, 7, generator=g)).log_softmax(-1)
    lengths = torch.tensor([30, 25, 8, 30])
    lm = BigramTable.random(6, 11)
    lm.num_states = 7
    kw = dict(beam_size=6, blank=blank, beta=0.2, lm=lm, alpha_lm=0.5, prune_threshold=prune,
              preselect=preselect, track_beams=True)
    native, eager = _both(kw, lp, lengths)
    _same(native, eager)
    native, eager = _both(dict(kw, flop_top_n=3, flop_ratio=0.05), lp, lengths)
    _same(native, eager)


@pytest.mark.parametrize("blank", [0, 39])
@pytest.mark.parametrize("prune", [None, 8.0])
@pytest.mark.parametrize("fusion", ["none", "lm+boost"])
def test_native_loop_equals_torch_step_with_more_viable_columns_than_the_sorted_head(blank, prune, fusion):
    """40 columns of flat posteriors: most frames have more viable columns than the loop
    keeps sorted (VIABLE_HEAD), so the unsorted tail's per-column bound is exercised."""
    g = torch.Generator().manual_seed(blank + (0 if prune is None else 1))
    lp = (0.8 * torch.randn(3, 25, 40, generator=g)).log_softmax(-1)
    lengths = torch.tensor([25, 19, 7])
    kw = dict(beam_size=6, blank=blank, prune_threshold=prune, track_beams=True, nbest=6)
    kw.update(fusion_kwargs(fusion, 40, blank, dense_lm=True))
    if fusion != "none":
        kw.update(beta=0.2)
    native, eager = _both(kw, lp, lengths)
    _same(native, eager)


def test_unsupported_configurations_fall_back_to_the_torch_step():
    lp = peaky_log_probs(2, 20, 5, 0)
    generic = BigramTable.random(4, 0)  # no state count: no dense table
    search = CTCBeamSearch(4, lm=generic, alpha_lm=0.5)
    inputs = search.prepare(lp, torch.tensor([20, 20]))
    assert loop_native.run_loop(search.step, inputs.frames, inputs.beams, inputs.lookups, False) is None
    lse = CTCBeamSearch(4, merge="logsumexp")
    inputs = lse.prepare(lp, torch.tensor([20, 20]))
    assert loop_native.run_loop(lse.step, inputs.frames, inputs.beams, inputs.lookups, False) is None
    # and the results still equal the torch step, which is what ran
    fallback = CTCBeamSearch(4, lm=generic, alpha_lm=0.5)
    _same(fallback(lp), CTCBeamSearch(4, lm=generic, alpha_lm=0.5, native=False)(lp))
    assert fallback.last_loop == "eager"
    lse(lp)
    assert lse.last_loop == "eager"


def test_build_is_cached_and_reports_compiler_errors(tmp_path, monkeypatch):
    first = loop_native.build(tmp_path)
    assert first.exists() and loop_native.build(tmp_path) == first
    monkeypatch.setenv("CC", "false")
    with pytest.raises(RuntimeError, match="failed"):
        loop_native.build(tmp_path / "other")


def test_native_loop_on_real_log_probs_with_a_kenlm_built_lm(tmp_path):
    """pyctcdecode's libri logits (371 frames, blank last) with a character 6-gram that
    lmplz builds from real text, folded into a dense table: exact and FLToP searches."""
    import json
    import os
    import re

    import pyctcdecode

    from shardscribe.pipeline.lm.arpa import tokens_line
    from shardscribe.pipeline.lm.build import find_lmplz, run_lmplz
    from shardscribe.pipeline.lm.ngpu_lm import NGramLM
    from shardscribe.pipeline.training.sample_text import pydoc_sentences

    find_lmplz(build=False)  # built by scripts/setup.sh --test: missing, the test fails
    labels = [" "] + [chr(c) for c in range(97, 123)] + ["'"]
    index = {c: i for i, c in enumerate(labels)}
    with open(tmp_path / "corpus.txt", "w") as fh:
        for sentence in pydoc_sentences()[:3000]:
            s = re.sub(" +", " ", re.sub(r"[^a-z' ]+", " ", sentence.lower())).strip()
            if s:
                fh.write(tokens_line([index[c] for c in s]) + "\n")
    run_lmplz(tmp_path / "corpus.txt", tmp_path / "lm.arpa", order=6)
    path = os.path.join(os.path.dirname(pyctcdecode.__file__), "tests", "sample_data", "libri_logits.json")
    with open(path) as fh:
        libri = torch.tensor(json.load(fh), dtype=torch.float32)
    lp = torch.stack([libri.log_softmax(-1), (libri / 3.0).log_softmax(-1)])
    lengths = torch.tensor([371, 300])
    lm = NGramLM.from_arpa(str(tmp_path / "lm.arpa"), 28)
    for extra in ({}, dict(flop_top_n=8, flop_ratio=1e-3)):
        kw = dict(beam_size=8, blank=28, lm=lm, alpha_lm=0.6, beta=0.5, prune_threshold=12.0, track_beams=True,
                  **extra)
        native, eager = _both(kw, lp, lengths)
        assert isinstance(CTCBeamSearch(**kw).lm, DenseFusionTable)
        # these logits are quantised (0.4% distinct values), so alignments of equal score
        # exist and the torch TopK and the native selection may keep different ones of
        # them (timestamps one frame apart); transcripts and scores are the same
        assert native.tokens == eager.tokens
        assert torch.equal(native.nbest_scores, eager.nbest_scores)
        for u in range(2):
            pairs = lambda r: sorted(zip(r.nbest_scores[u].tolist(), map(tuple, r.nbest_tokens[u])))  # noqa: E731
            assert pairs(native) == pairs(eager)


@pytest.fixture(scope="module")
def token_arpa(tmp_path_factory):
    """A 4-gram over 12 tokens (KenLM's lmplz) from random token text with repeated
    patterns, so that its back-off graph has explicit arcs at every order."""
    import random

    from shardscribe.pipeline.lm.arpa import tokens_line
    from shardscribe.pipeline.lm.build import find_lmplz, run_lmplz

    find_lmplz(build=False)
    rng = random.Random(5)
    patterns = [[rng.randrange(12) for _ in range(rng.randint(2, 6))] for _ in range(15)]
    out = tmp_path_factory.mktemp("graph-lm")
    with open(out / "corpus.txt", "w") as fh:
        for _ in range(400):
            fh.write(tokens_line([t for _ in range(rng.randint(1, 5)) for t in rng.choice(patterns)]) + "\n")
    run_lmplz(out / "corpus.txt", out / "lm.arpa", order=4)
    return str(out / "lm.arpa")


@pytest.mark.parametrize("blank", [0, 12])
@pytest.mark.parametrize("flop", [False, True])
@pytest.mark.parametrize("boost", [False, True])
@pytest.mark.parametrize("chains", [True, False])
def test_native_loop_reads_back_off_graphs_like_the_torch_step(token_arpa, blank, flop, boost, chains,
                                                               monkeypatch):
    """An LM (and a boosting tree) kept as back-off graphs, as a token n-gram too large for
    a dense table is (``dense_fusion_max_bytes=0`` here): the native loop's lookups (a
    binary search per level, or the shortcut to the root for a label no arc of the
    state's back-off chain has) give the torch step's scores bit for bit, on inputs where
    the LM changes the best path; also without the chain signatures (a graph over
    ``CHAIN_MAX_BYTES``)."""
    if not chains:
        monkeypatch.setattr(loop_native, "CHAIN_MAX_BYTES", 0)
    from shardscribe.pipeline.lm.boosting import BoostingTree
    from shardscribe.pipeline.lm.ngpu_lm import NGramLM

    g = torch.Generator().manual_seed(blank + 2 * flop + 4 * boost)
    lp = (2.0 * torch.randn(5, 40, 13, generator=g)).log_softmax(-1)
    lengths = torch.tensor([40, 33, 7, 40, 21])
    lm = NGramLM.from_arpa(token_arpa, 12)
    kw = dict(beam_size=6, blank=blank, beta=0.3, lm=lm, alpha_lm=0.8, prune_threshold=8.0, track_beams=True,
              nbest=4, dense_fusion_max_bytes=0)
    if flop:
        kw.update(flop_top_n=5, flop_ratio=0.01)
    if boost:
        kw.update(boost=BoostingTree.from_phrases([[[1, 2, 3], [4, 5]]], vocab_size=12, context_score=1.5),
                  alpha_boost=0.7)
    native, eager = _both(kw, lp, lengths)
    _same(native, eager)
    plain = CTCBeamSearch(**{k: v for k, v in kw.items() if k not in ("lm", "alpha_lm")})(lp, lengths)
    assert plain.tokens != native.tokens


def _check_flop_prune(ratio, blank: int, v1: int, n: int):
    """The native FLToP scan against a plain sort of every frame (value descending, ties to
    the earlier column; blank is id 0), on frames with ties, -inf columns, rivals near the
    best and a last block that is not whole."""
    import math

    g = torch.Generator().manual_seed(blank + v1 + n + int(1e4 * (ratio or 0)))
    b, t = 3, 40
    x = torch.randn(b, t, v1, generator=g)
    x = torch.round(x * 2) / 2                         # many exact ties
    x[:, :, ::7] = float("-inf")
    win = torch.randint(0, v1, (b, t), generator=g)
    x.scatter_(2, win[..., None], 12.0)
    x[:, ::3, v1 - 4] = 11.5                          # a rival in the last, partial block
    x[:, 5, :] = float("-inf")
    x[:, 5, blank] = 0.0
    lp = x.log_softmax(-1)
    lengths = torch.tensor([40, 17, 0])
    values, tokens = loop_native.flop_prune(lp, lengths, blank, n, ratio)
    n = min(n, v1)
    values, tokens = values.view(t, b, n), tokens.view(t, b, n)
    for bi in range(b):
        for ti in range(t):
            if ti >= int(lengths[bi]):
                assert values[ti, bi, 0] == 0.0 and torch.isinf(values[ti, bi, 1:]).all()
                continue
            row = lp[bi, ti].tolist()
            floor = max(row) + math.log(ratio) if ratio else -math.inf
            ids = [0 if e == blank else (e + 1 if e < blank else e) for e in range(v1)]
            kept = sorted(((v, e) for e, v in enumerate(row) if v >= floor and v != -math.inf),
                          key=lambda p: (-p[0], p[1]))[:n]
            got = [(float(v), int(i)) for v, i in zip(values[ti, bi], tokens[ti, bi]) if v != -math.inf]
            assert got == [(v, ids[e]) for v, e in kept]


@pytest.mark.parametrize("ratio", [None, 5e-4, 0.3])
@pytest.mark.parametrize("blank", [0, 517, 1024])
def test_native_flop_prune_equals_a_brute_force_sort_on_a_large_vocabulary(ratio, blank):
    """The scan skips blocks of columns with vector compares and a bound on the N-th best."""
    _check_flop_prune(ratio, blank, 1025, 8)


@pytest.mark.parametrize("ratio", [None, 5e-4])
@pytest.mark.parametrize("v1, n", [(20, 4), (1025, 40), (1025, 70), (7, 9)])
def test_native_flop_prune_at_the_edges_of_its_bound(ratio, v1, n):
    """Fewer columns than a block, more kept columns than blocks (no bound but the floor),
    more than the old 64-entry cap, more than the vocabulary."""
    _check_flop_prune(ratio, v1 - 1, v1, n)


@pytest.fixture
def portable_build(monkeypatch):
    """The native library built without the SSE2 branch (as for a CPU without it), then
    the usual one again."""
    loop_native._library.cache_clear()
    monkeypatch.setattr(loop_native, "CFLAGS", loop_native.CFLAGS + ("-U__SSE2__",))
    yield
    monkeypatch.undo()
    loop_native._library.cache_clear()


@pytest.mark.parametrize("ratio, v1, n", [(5e-4, 1025, 8), (None, 20, 4), (5e-4, 1025, 40)])
def test_native_flop_prune_without_sse2_equals_the_brute_force_sort(portable_build, ratio, v1, n):
    assert loop_native.available()
    _check_flop_prune(ratio, 0, v1, n)


@pytest.mark.parametrize("flop", [True, False])
def test_search_over_a_list_of_utterances_equals_the_padded_batch(flop):
    """Each utterance's own log-probs (FLToP reads them in place; without FLToP they are
    padded) give the padded batch's result, an empty utterance included."""
    g = torch.Generator().manual_seed(3)
    rows = [(1.2 * torch.randn(t, 40, generator=g)).log_softmax(-1) for t in (25, 1, 0, 17)]
    lengths = torch.tensor([r.shape[0] for r in rows])
    padded = torch.zeros(len(rows), 25, 40)
    for i, r in enumerate(rows):
        padded[i, :r.shape[0]] = r
    lm = BigramTable.random(39, 5)
    lm.num_states = 40  # small enough for a dense table: the native loop serves it
    kw = dict(beam_size=4, blank=39, beta=0.2, lm=lm, alpha_lm=0.5, prune_threshold=8.0)
    if flop:
        kw.update(flop_top_n=5, flop_ratio=0.01)
    search = CTCBeamSearch(**kw)
    _same(search(rows), search(padded, lengths))
    assert search.last_loop == "native"
