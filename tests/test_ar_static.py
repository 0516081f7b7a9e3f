"""The static-cache greedy loop (pipeline.decoding.ar.static) and its CUDA-graph replay
(pipeline.decoding.ar.graphs) against the eager loop: the same tokens, on the CPU
without capture; on CUDA with it (those tests skip without CUDA)."""
from __future__ import annotations

import logging

import pytest
import torch

from shardscribe.pipeline.decoding.ar.greedy import TokenRules, greedy_decode
from shardscribe.pipeline.decoding.ar.static import runs_static
from shardscribe.pipeline.decoding.ar.graphs import StaticDecoding, bucket
from shardscribe.pipeline.decoding.drafting.drafters import NO_DRAFT, CTCLookahead
from shardscribe.pipeline.decoding.ssd.decoder import AR_FALLBACK, SelfSpeculativeDecoder

pytestmark = pytest.mark.usefixtures("one_torch_thread")



class Counted(StaticDecoding):
    """StaticDecoding counting the calls it gave a runner: the static loop really ran."""
    runs = 0

    def runner(self, *args):
        got = super().runner(*args)
        self.runs += got is not None
        return got


STATIC_CPU = Counted(cpu_static=True)
CLIPS = 5


@pytest.fixture(scope="module")
def encoded(whisper_adapter, sample_audio):
    """Clips of different lengths, each row's AR transcript, and prefixes of 0-2 of its
    tokens (prompt + prefix lengths differ: left padding) with the eager loop's tokens."""
    audios = [sample_audio[k] for k in sorted(sample_audio)][:CLIPS]
    enc = whisper_adapter.encode(audios)
    full = greedy_decode(whisper_adapter, enc.states)
    prefixes = [f[:i % 3] for i, f in enumerate(full)]
    return enc, full, prefixes, greedy_decode(whisper_adapter, enc.states, prefixes)


def test_static_loop_equals_eager_loop(whisper_adapter, encoded):
    """Rows that end at different steps, and a limit that cuts some of them: the eager
    loop's tokens."""
    enc, full, prefixes, eager = encoded
    assert len({len(f) for f in full}) > 1
    runs = STATIC_CPU.runs
    assert greedy_decode(whisper_adapter, enc.states, prefixes, static=STATIC_CPU) == eager
    assert greedy_decode(whisper_adapter, enc.states, prefixes, 5, static=STATIC_CPU) == [e[:5] for e in eager]
    # every row ends at its first token (its whole transcript is the prefix)
    assert greedy_decode(whisper_adapter, enc.states[:2], full[:2], static=STATIC_CPU) == [[], []]
    assert STATIC_CPU.runs == runs + 3


def test_static_loop_keeps_cross_out_and_timer(whisper_adapter, encoded):
    enc, full = encoded[:2]
    cross, timer = [], {}
    assert greedy_decode(whisper_adapter, enc.states[:1], cross_out=cross, timer=timer, static=STATIC_CPU) == full[:1]
    eager_cross = []
    greedy_decode(whisper_adapter, enc.states[:1], max_new_tokens=1, cross_out=eager_cross)
    assert len(cross) == len(eager_cross) and timer["decode"] > 0
    for (k, v), (ek, ev) in zip(cross, eager_cross):
        assert torch.equal(k, ek) and torch.equal(v, ev)


def _fallback(adapter, enc, full, static, drop_cross=False):
    """SSD on corrupted drafts (prefixes j = 0..2): the verification pass, then the seeded
    fallback; the rows' final tokens."""
    bad = adapter.tokenize("zebra")[0]
    js = [min(i % 3, len(f) - 1) for i, f in enumerate(full)]
    drafts = [adapter.text(f[:j] + [bad] + f[j + 1:]) for f, j in zip(full, js)]
    ssd = SelfSpeculativeDecoder(adapter, tau_ctc=0.0, tau_slm=0.01)
    ssd.static = static
    rows = ssd.first_pass(enc.states, drafts, torch.zeros(len(drafts)))
    pending = [i for i, r in enumerate(rows) if r.stage is None]
    assert pending and all(rows[i].seed is not None for i in pending)
    if drop_cross:
        for i in pending:
            rows[i].seed.cross_source = None
    cross = []
    ssd.fallback(enc.states[pending], [rows[i] for i in pending], cross_out=cross)
    assert all(rows[i].stage == AR_FALLBACK for i in pending)
    return [r.tokens for r in rows], cross


def test_ssd_seeded_fallback_equal_with_and_without_static_cache(whisper_adapter, encoded):
    """The verification pass's seeds copied into the static cache continue exactly as the
    eager fallback does (which tests/test_ssd.py proves equal to full AR), with the seeds'
    cross-attention K/V or without them (projected first)."""
    enc, full = encoded[:2]
    enc, full = type(enc)(states=enc.states[:3], valid_frames=enc.valid_frames[:3]), full[:3]
    runs = STATIC_CPU.runs
    for drop_cross in (False, True):
        static, cross = _fallback(whisper_adapter, enc, full, STATIC_CPU, drop_cross)
        assert static == full and len(cross) == len(whisper_adapter.model.model.decoder.layers)
    assert STATIC_CPU.runs == runs + 2


def test_granite_speech_static_loop_equals_eager_prefilled_and_seeded():
    """granite-speech's decoder-only LLM (toy dims, random weights: every row runs to the
    limit): prompts with audio embeddings and ragged prefixes, and seeds from a
    verification pass's cache (SSD eqs. 6-7)."""
    from shardscribe.jobs.bench.regimes import TOY_GRANITE, random_granite
    from shardscribe.pipeline.decoding.ar.greedy import seeds_from_cache
    from shardscribe.pipeline.decoding.ssd.verify import verify_drafts

    adapter = random_granite(TOY_GRANITE, torch.device("cpu"), torch.float32)
    feats = torch.randn(3, 40, adapter.model.config.encoder_config.input_dim, generator=torch.Generator().manual_seed(0))
    states = adapter.encode_features(feats).states
    full = greedy_decode(adapter, states, max_new_tokens=10)
    prefixes = [f[:i] for i, f in enumerate(full)]
    runs = STATIC_CPU.runs
    assert greedy_decode(adapter, states, prefixes, 8, static=STATIC_CPU) == greedy_decode(adapter, states, prefixes, 8)
    ver = verify_drafts(adapter, states, [f[:6] for f in full], 0.0)
    js = [2, 4, 1]

    def seeded(static):
        seeds = seeds_from_cache(ver.cache, [0, 1, 2], ver.lead.tolist(), [ver.prompt_end + j for j in js],
                                 [f[j] for f, j in zip(full, js)])
        return greedy_decode(adapter, states, [f[:j] for f, j in zip(full, js)], 5, seeds=seeds, static=static)

    assert seeded(STATIC_CPU) == seeded(None) == [f[j:j + 5] for f, j in zip(full, js)]
    assert STATIC_CPU.runs == runs + 2


def test_calls_the_static_loop_cannot_run_take_the_eager_one(whisper_adapter):
    rules = TokenRules.of(whisper_adapter)
    assert runs_static(whisper_adapter, NO_DRAFT, rules)
    assert not runs_static(whisper_adapter, CTCLookahead([[1]], [0], 2), rules)
    assert not runs_static(whisper_adapter, NO_DRAFT, TokenRules.of(whisper_adapter, lambda logits, h: None))
    # default on a CPU: the eager loop (no runner)
    assert StaticDecoding().runner(whisper_adapter, torch.ones((1, 2), dtype=torch.long), 4, [], [(None, None)]) \
        is None


def test_bucketed_buffers_and_capture_failure_fall_back_with_one_log_line(whisper_adapter, encoded, caplog,
                                                                          monkeypatch):
    """The graph runner's bucket (the batch padded to a power of two with finished rows,
    the columns to a power of two or the model's positions) decodes the same tokens; where capture fails (here: no CUDA)
    it logs once and later calls take the eager loop."""
    enc, full, prefixes, eager = encoded
    whisper_adapter.__dict__.pop("_ar_graphs", None)
    static = StaticDecoding()
    monkeypatch.setattr(StaticDecoding, "applies", lambda self, device: True)
    monkeypatch.setattr(StaticDecoding, "runner", lambda self, adapter, mask, limit, s, c:
                        self._graph(adapter, mask, limit, s, c))
    with caplog.at_level(logging.WARNING, logger="shardscribe.pipeline.decoding.ar.graphs"):
        try:
            assert greedy_decode(whisper_adapter, enc.states[:3], prefixes[:3], static=static) == eager[:3]
            assert greedy_decode(whisper_adapter, enc.states[:1], static=static) == full[:1]
        finally:
            pool = whisper_adapter.__dict__.pop("_ar_graphs", {})
    assert pool.get("failed") and len(caplog.records) == 1
    assert (bucket(1), bucket(3), bucket(8), bucket(65)) == (1, 4, 8, 128)


def test_use_cuda_graphs_is_not_in_config_hash():
    from shardscribe.pipeline.config import config_hash, load_config

    cfg = load_config("ar")
    off = load_config("ar", overrides=["decoder.use_cuda_graphs=false"])
    assert off.decoder.use_cuda_graphs is False and config_hash(cfg) == config_hash(off)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _cuda_whisper(dtype):
    """A random-weight Whisper (toy dims, tiny.en's vocabulary) on CUDA: the GPU machine
    lacks the embedded model, so its tokenizer comes from the processor directory the GPU
    check carries ($PROCESSOR, or wheels/processor) where there is one."""
    import os
    from pathlib import Path

    from shardscribe.jobs.bench.regimes import TOY_WHISPER, random_whisper

    dirs = [os.environ.get("PROCESSOR"), str(Path(__file__).resolve().parent.parent / "wheels" / "processor")]
    found = next((d for d in dirs if d and (Path(d) / "config.json").is_file()), None)
    try:
        return random_whisper(TOY_WHISPER, torch.device("cuda"), dtype, found)
    except Exception as exc:    # no processor directory and no embedded model here
        pytest.skip(f"no Whisper tokenizer: {exc}")


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_graph_replay_equals_the_uncaptured_step_and_the_eager_loop(dtype):
    """Random weights: rows run to the limit, from ragged prompts + prefixes (8 rows and
    prompt + prefix + limit = 32 columns: the graph's bucket is the call's own shape, so
    the replayed kernels are the uncaptured step's and the tokens equal bit for bit). In
    float32 also the eager loop's (in bfloat16 a random model's near-flat logits may tie
    differently across attention kernels). Then SSD's seeded fallback, from a verification
    pass's cache, through the graph."""
    from shardscribe.pipeline.decoding.ar.greedy import seeds_from_cache
    from shardscribe.pipeline.decoding.ssd.verify import verify_drafts

    adapter = _cuda_whisper(dtype)
    states = torch.randn(8, 1500, adapter.model.config.d_model, generator=torch.Generator().manual_seed(0))
    states = states.to("cuda", dtype)
    prefixes = [[11, 13, 17][:i % 4] for i in range(8)]
    limit = 32 - len(adapter.prompt_ids) - 3
    uncaptured = greedy_decode(adapter, states, prefixes, limit, static=StaticDecoding(capture=False))
    graphs = StaticDecoding()
    replayed = greedy_decode(adapter, states, prefixes, limit, static=graphs)
    again = greedy_decode(adapter, states[:7], prefixes[:7], limit, static=graphs)   # the same bucket, replayed
    assert not adapter.__dict__.get("_ar_graphs", {}).get("failed")
    assert replayed == uncaptured and again == uncaptured[:7]
    if dtype == torch.float32:
        assert replayed == greedy_decode(adapter, states, prefixes, limit)
    full = [p + t for p, t in zip(prefixes, uncaptured)]
    js = [3] + [1 + i % 3 for i in range(7)]
    ver = verify_drafts(adapter, states, [f[:8] for f in full], 0.0)

    def seeded(static):
        seeds = seeds_from_cache(ver.cache, list(range(8)), ver.lead.tolist(), [ver.prompt_end + j for j in js],
                                 [f[j] for f, j in zip(full, js)])
        return greedy_decode(adapter, states, [f[:j] for f, j in zip(full, js)], limit, seeds=seeds, static=static)

    assert seeded(graphs) == seeded(StaticDecoding(capture=False))
