"""The static-buffer transducer loops against the eager ones: greedy label-looping ("Label-
Looping: Highly Efficient Decoding for Transducers") equals transducer_greedy, and the
static ALSD++ / AES++ ("Pushing the Limits of Beam Search Decoding for Transducer-based ASR
models") equal the eager searches, token for token and score for score, on tiny random
Parakeet RNN-T / TDT checkpoints (tests/transducer_reference.py) where the rules matter:
max_symbols hits, zero durations, rows of different lengths (one empty), beams that
differ from greedy, LM and boosting fusion. On the CPU the loops run without capture; the
GPU's masked arithmetic (every row through the joint and the predictor) is checked on the
CPU through a model whose calls always see the same row count. CUDA-graph replay against
eager runs where CUDA is."""
from __future__ import annotations

import logging

import pytest
import torch

from beam_reference import BigramTable
from shardscribe.pipeline.decoding.transducer.greedy import transducer_greedy
from shardscribe.pipeline.decoding.transducer.label_looping import LabelLoopingGreedy
from shardscribe.pipeline.decoding.transducer.loop_graphs import GraphCache
from shardscribe.pipeline.decoding.transducer.search import TransducerBeamSearch
from shardscribe.pipeline.decoding.transducer.static_state import frame_bucket
from shardscribe.pipeline.lm.boosting import BoostingTree
from shardscribe.pipeline.models.transducer.adapter import load_transducer_adapter
from transducer_reference import build

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
LENGTHS = torch.tensor([23, 4, 17, 0, 11])


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Two symbols per frame and no blank bias: frames fill up to max_symbols; the TDT
    favours duration 0, so tokens stay on their frame and the guard decides."""
    out = {}
    for kind in ("rnnt", "tdt"):
        root = tmp_path_factory.mktemp(kind)
        build(kind, root, durations=(0, 1, 2), max_symbols=2, blank_bias=0.0, zero_duration_bias=2.0)
        out[kind] = load_transducer_adapter(str(root))
        out[kind].root = str(root)
    return out


def _frames(seed=3, t=23):
    return torch.randn(len(LENGTHS), t, 24, generator=torch.Generator().manual_seed(seed)) * 1.5


def _short(seed):
    """Beam inputs: the same rows, a third as long."""
    return _frames(seed, t=8), torch.tensor([8, 3, 6, 0, 5])


class FixedRows:
    """The model with every predictor and joint call padded to ``rows`` rows. A CPU matmul
    can round a row differently at another row count, and the eager loops step subsets of
    rows where the GPU path steps all of them, masked; at one row count both give every
    row the same bits, so the GPU path's logic can be compared exactly on the CPU."""

    def __init__(self, model, rows: int = 64):
        self.model, self.rows = model, rows

    def __getattr__(self, name):
        return getattr(self.model, name)

    def _pad(self, x, dim):
        pad = list(x.shape)
        pad[dim] = self.rows - x.shape[dim]
        return torch.cat([x, x.new_zeros(pad)], dim)

    def predictor_step(self, tokens, state):
        n = tokens.shape[0]
        h, c, out = state
        h, c, out = self.model.predictor_step(self._pad(tokens, 0), (self._pad(h, 1), self._pad(c, 1), None))
        return h[:, :n], c[:, :n], out[:n]

    def joint(self, frames, pred_out):
        n = frames.shape[0]
        tok, dur = self.model.joint(self._pad(frames, 0), self._pad(pred_out, 0))
        return tok[:n], None if dur is None else dur[:n]


def _same(a, b):
    assert a.tokens == b.tokens
    assert a.frames == b.frames
    assert torch.equal(a.scores.cpu(), b.scores.cpu()), (a.scores, b.scores)


@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
def test_static_label_looping_equals_eager_greedy(models, kind):
    model = models[kind]
    greedy = LabelLoopingGreedy(model, loop="static")
    frames = _frames()
    ref = transducer_greedy(model, frames, LENGTHS)
    _same(greedy(frames, LENGTHS), ref)
    assert greedy.last_loop == "static"
    # the rules are exercised: a frame reaches max_symbols, and an empty row stays empty
    assert any(fr.count(f) == model.max_symbols for fr in ref.frames for f in set(fr))
    assert ref.tokens[3] == [] and all(len(x) for i, x in enumerate(ref.tokens) if i != 3)


@pytest.mark.parametrize("kind,inner,max_symbols", [("rnnt", 2, None), ("tdt", 3, None), ("tdt", 1, 1)])
def test_masked_label_looping_equals_eager_greedy(models, kind, inner, max_symbols):
    """What a GPU runs (predictor masked over every row, several joints per label, the end
    read every few steps) on the CPU, at a fixed row count."""
    model = FixedRows(models[kind])
    frames = _frames(seed=5)
    ref = transducer_greedy(model, frames, LENGTHS, max_symbols)
    out = LabelLoopingGreedy(model, max_symbols, loop="static", masked=True, inner=inner, check_every=3)(
        frames, LENGTHS)
    _same(out, ref)


CASES = [("tdt", "alsd"), ("rnnt", "alsd"), ("rnnt", "aes")]


@pytest.mark.parametrize("kind,algorithm", CASES)
def test_static_beam_equals_eager(models, kind, algorithm):
    model = models[kind]
    frames, lengths = _short(seed=7)
    ref = TransducerBeamSearch(model, 4, algorithm=algorithm, loop="eager")(frames, lengths)
    out = TransducerBeamSearch(model, 4, algorithm=algorithm, loop="static")(frames, lengths)
    _same(out, ref)
    assert ref.tokens != transducer_greedy(model, frames, lengths).tokens    # the beam matters here
    fixed = FixedRows(model)
    ref = TransducerBeamSearch(fixed, 4, algorithm=algorithm, loop="eager")(frames, lengths)
    search = TransducerBeamSearch(fixed, 4, algorithm=algorithm, loop="static", masked=True, check_every=4)
    _same(search(frames, lengths), ref)
    assert search.last_loop == "static"


@pytest.mark.parametrize("kind,algorithm,pruning", [("tdt", "alsd", "late"), ("rnnt", "aes", "early")])
def test_static_beam_with_fusion_equals_eager(models, kind, algorithm, pruning):
    model = models[kind]
    lm = BigramTable.random(model.vocab_size - 1, 3)
    if pruning == "late":
        lm.num_states = model.vocab_size        # the dense-table lookup path
    tree = BoostingTree.from_phrases([[[3, 5, 7], [2, 2]]], model.vocab_size - 1, context_score=1.5)
    kw = dict(algorithm=algorithm, lm=lm, alpha_lm=0.6, boost=tree, alpha_boost=0.5, pruning=pruning)
    frames, lengths = _short(seed=11)
    ref = TransducerBeamSearch(model, 3, loop="eager", **kw)(frames, lengths)
    _same(TransducerBeamSearch(model, 3, loop="static", **kw)(frames, lengths), ref)


def test_buckets_and_capture_failure(caplog):
    assert [frame_bucket(n) for n in (1, 16, 17, 24, 25, 33, 100, 375)] == [16, 16, 24, 24, 32, 48, 128, 384]
    cache, calls = GraphCache(), []

    def fails():
        calls.append(1)
        raise RuntimeError("operation not permitted when stream is capturing")
    with caplog.at_level(logging.WARNING):
        assert cache.get("a", fails) is None and cache.get("b", fails) is None
    assert len(calls) == 1 and len([r for r in caplog.records if "CUDA graph" in r.getMessage()]) == 1


def test_use_cuda_graphs_is_an_execution_key(models):
    from shardscribe.pipeline.config import config_hash, load_config
    from shardscribe.pipeline.kinds.transducer_greedy.stage import build as build_greedy

    cfg = load_config("transducer_greedy")
    before = config_hash(cfg)
    assert cfg.transducer.use_cuda_graphs is True
    cfg.transducer.use_cuda_graphs = False
    assert config_hash(cfg) == before
    decoder = build_greedy(models["rnnt"], cfg)
    assert decoder.greedy.use_cuda_graphs is False


# ------------------------------------------------------------------------------ CUDA
@CUDA
@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
def test_cuda_graph_greedy_equals_eager(models, kind):
    model = load_transducer_adapter(models[kind].root, device="cuda")
    greedy = LabelLoopingGreedy(model)
    for t in (23, 20):
        frames, lengths = _frames(t=t).cuda(), LENGTHS.clamp(max=t).cuda()
        ref = transducer_greedy(model, frames, lengths)
        _same(greedy(frames, lengths), ref)
        assert greedy.last_loop == "cuda_graph"


@CUDA
@pytest.mark.parametrize("kind,algorithm", CASES)
def test_cuda_graph_beam_equals_eager(models, kind, algorithm):
    model = load_transducer_adapter(models[kind].root, device="cuda")
    frames, lengths = _frames(seed=7).cuda(), LENGTHS.cuda()
    ref = TransducerBeamSearch(model, 4, algorithm=algorithm, loop="eager")(frames, lengths)
    search = TransducerBeamSearch(model, 4, algorithm=algorithm)
    for _ in range(2):      # captured, then replayed from the cache
        _same(search(frames, lengths), ref)
        assert search.last_loop == "cuda_graph"
