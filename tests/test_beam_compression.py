"""FLToP frame compression (pipeline.decoding.ctc_beam.frames, ``compress_frames``): a run of
frames whose pruned token list is one and the same token is searched as one step. The
reference is the same search frame by frame (``compress_frames=False``): identical
transcripts, emission frames (timestamps), n-best lists, alignments and live-beam counts,
scores equal up to float summation order; with LM, boosting and both merges. Batched vs
single on the same peaky input: tests/test_beam_search.py."""
from __future__ import annotations

import pytest
import torch

from beam_reference import fusion_kwargs, peaky_log_probs
from shardscribe.pipeline.decoding.ctc_beam import CTCBeamSearch

torch.set_num_threads(1)


def _compare(a, b, atol=1e-4):
    assert a.tokens == b.tokens
    assert a.token_frames == b.token_frames
    finite = torch.isfinite(b.nbest_scores)
    assert torch.equal(torch.isfinite(a.nbest_scores), finite)
    assert torch.allclose(a.nbest_scores[finite], b.nbest_scores[finite], atol=atol)
    for i in range(len(b.tokens)):
        keep = finite[i].tolist()
        assert [x for x, f in zip(a.nbest_tokens[i], keep) if f] == [x for x, f in zip(b.nbest_tokens[i], keep) if f]
        assert [x for x, f in zip(a.nbest_frames[i], keep) if f] == [x for x, f in zip(b.nbest_frames[i], keep) if f]
    assert torch.equal(a.alignments[finite], b.alignments[finite])
    if b.avg_beams is not None:
        assert torch.allclose(a.avg_beams, b.avg_beams)


@pytest.mark.parametrize("merge", ["max", "logsumexp"])
@pytest.mark.parametrize("fusion", ["none", "lm", "lm+boost"])
@pytest.mark.parametrize("seed", range(3))
def test_compressed_equals_frame_by_frame(merge, fusion, seed):
    b, t, v1 = 6, 60, 7
    lp = peaky_log_probs(b, t, v1, seed)
    lengths = torch.tensor([60, 1, 37, 0, 52, 44])
    kw = dict(beam_size=5, merge=merge, prune_threshold=6.0, beta=0.3, flop_top_n=4, flop_ratio=0.02,
              track_beams=True, nbest=5)
    kw.update(fusion_kwargs(fusion, v1, seed))
    folded = CTCBeamSearch(**kw)
    plain = CTCBeamSearch(compress_frames=False, **kw)
    frames = folded.prepare(lp, lengths).frames
    assert frames.steps <= t - 8  # the test data really has runs to fold
    _compare(folded(lp, lengths), plain(lp, lengths))


def test_frame_map_and_step_scores():
    """Frames [blank, blank, a, a, blank(+b), blank] -> steps [2 blanks], [a a], [mixed], [blank]."""
    v1 = 3
    p = torch.full((6, v1), 1e-6)
    p[0, 0] = p[1, 0] = p[5, 0] = 1.0
    p[2, 1] = p[3, 1] = 1.0
    p[4, 0], p[4, 2] = 0.6, 0.4
    lp = (p / p.sum(-1, keepdim=True)).log()[None]
    search = CTCBeamSearch(3, flop_top_n=2, flop_ratio=0.1)
    frames = search.prepare(lp, torch.tensor([6])).frames
    assert frames.steps == 4
    assert frames.frame_map[0].tolist() == [0, 0, 1, 1, 2, 3]
    assert frames.weights[:4, 0].tolist() == [2.0, 2.0, 1.0, 1.0]
    assert float(frames.values[0, 0, 0]) == pytest.approx(float(lp[0, 0, 0] + lp[0, 1, 0]))
    assert float(frames.values[1, 0, 0]) == pytest.approx(float(lp[0, 2, 1] + lp[0, 3, 1]))
    res = search(lp)
    assert res.tokens[0] == [1] and res.token_frames[0] == [2]
    assert res.alignments[0, 0].tolist() == [0, 0, 1, 1, 0, 0]
