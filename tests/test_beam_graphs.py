"""CUDA-graph frame loop of the beam search: static-buffer plumbing on CPU (no capture),
and eager == graph replay where a GPU is present."""
from __future__ import annotations

import pytest
import torch

from beam_reference import BigramTable
from shardscribe.pipeline.decoding.ctc_beam import CTCBeamSearch
from shardscribe.pipeline.decoding.ctc_beam.loop_graphs import GraphedFrameLoop


def _inputs(device):
    g = torch.Generator().manual_seed(0)
    lp = (1.5 * torch.randn(4, 30, 7, generator=g)).log_softmax(-1).to(device)
    return lp, torch.tensor([30, 12, 25, 1], device=device)


def _run_static(search, lp, lengths, capture):
    inputs = search.prepare(lp, lengths)
    loop = GraphedFrameLoop(search.step, inputs.frames, inputs.fusion, inputs.lookups, inputs.beams,
                            search.track_beams, capture=capture)
    assert loop.ok
    return search.finish(inputs, *loop.run(inputs.frames, inputs.beams, inputs.lookups))


@pytest.mark.parametrize("flop", [None, 3])
def test_static_buffer_loop_equals_eager_on_cpu(flop):
    lp, lengths = _inputs("cpu")
    lm = BigramTable.random(6, seed=1)
    search = CTCBeamSearch(5, beta=0.2, lm=lm, alpha_lm=0.5, prune_threshold=7.0,
                           flop_top_n=flop, track_beams=True)
    eager = search(lp, lengths)
    static = _run_static(search, lp, lengths, capture=False)
    assert static.nbest_tokens == eager.nbest_tokens
    assert torch.equal(static.nbest_scores, eager.nbest_scores)
    assert torch.equal(static.avg_beams, eager.avg_beams)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("flop", [None, 3])
def test_cuda_graph_equals_eager(flop):
    lp, lengths = _inputs("cuda")
    lm = BigramTable.random(6, seed=1)
    lm.table, lm.eos = lm.table.cuda(), lm.eos.cuda()
    lm.init_states = lambda n, bos=True: torch.full((n,), 6, dtype=torch.int64, device="cuda")
    lm.advance = lambda s: (lm.table[s], torch.arange(6, device="cuda").expand(s.numel(), -1).clone())
    kw = dict(beam_size=5, beta=0.2, lm=lm, alpha_lm=0.5, prune_threshold=7.0, flop_top_n=flop)
    eager = CTCBeamSearch(use_cuda_graphs=False, **kw)(lp, lengths)
    graphed = _run_static(CTCBeamSearch(**kw), lp, lengths, capture=True)
    assert graphed.nbest_tokens == eager.nbest_tokens
    assert torch.equal(graphed.nbest_scores, eager.nbest_scores)
