"""``ctc_beam`` on ``ctc``-family models: the batched beam search of "FlexCTC: GPU-powered
CTC Beam Decoding" over a real checkpoint's own vocabulary (pipeline.text.ctc_vocabulary),
on tiny random checkpoints built here (tests/test_ctc_family.py's builders): a
Wav2Vec2ForCTC with characters and a ``|`` word delimiter (blank 0) and a ParakeetForCTC
with SentencePiece-style ``▁`` pieces (blank last). The search pool builds its vocabulary
from the config alone (``build_search``), as it does in a job.

- beam 1 without LM is the family's greedy text; LM weight 0 is no LM;
- an LM from ``build-lm --tokenizer DIR`` (KenLM) at a strong weight changes the best
  path, and every n-best score is the acoustic score of its alignment + alpha x KenLM's own
  sentence log-prob over the same LM token ids, so the text is that sum's argmax: the LM
  ids build-lm wrote are the ones the search feeds the LM;
- a per-row key phrase spelt in the model's tokens is boosted into its row only;
- the CLI end to end with a broken file: rows in = rows out.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, manifest_with_random_bytes, transcribe_cli
from shardscribe.pipeline.config import load_config
from shardscribe.pipeline.kinds.base import SegmentResult
from shardscribe.pipeline.kinds.ctc_beam.stages import BeamPending, build_search
from shardscribe.pipeline.text.ctc_vocabulary import lm_index
from test_ctc_family import saved_checkpoint

torch.set_num_threads(1)
ALPHA = 2.0   # strong enough that the LM rewrites the random models' flat paths


@pytest.fixture(scope="module", params=["parakeet", "wav2vec2"])
def checkpoint(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    return request.param, root, saved_checkpoint(request.param, root)[2]


@pytest.fixture(scope="module")
def drafts(checkpoint, sample_audio):
    """Each bundled clip's log-probs [1, T, V], lengths and greedy text, from the adapter."""
    _, _, adapter = checkpoint
    out = {}
    for clip, audio in sample_audio.items():
        d = adapter.ctc_draft(adapter.encode([audio]))
        out[clip] = (d.log_probs.cpu(), d.lengths.cpu(), d.texts[0])
    return out


@pytest.fixture(scope="module")
def lm_dir(checkpoint, tmp_path_factory):
    """A 3-gram over the model's own LM token ids, built by the CLI from real English text."""
    from shardscribe.pipeline.lm.build import find_lmplz
    from shardscribe.pipeline.training.sample_text import pydoc_sentences

    find_lmplz(build=False)   # KenLM comes with setup; missing, the test fails
    _, root, _ = checkpoint
    tmp = tmp_path_factory.mktemp("lm")
    (tmp / "text.txt").write_text("\n".join(pydoc_sentences()) + "\n")
    proc = subprocess.run([sys.executable, "-m", "shardscribe.jobs.cli", "build-lm", "--tokenizer", str(root),
                           "--text", str(tmp / "text.txt"), "--order", "3", "--output", str(tmp / "out")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp / "out"


def _finisher(root, *sets):
    return build_search(load_config("ctc_model_beam", [f"model.source={root}", "beam.use_cuda_graphs=false", *sets]))


def _finish(finisher, drafts, clips, key_phrases=None):
    results = [SegmentResult("", "pending", pending=BeamPending(drafts[c][0][0, :int(drafts[c][1][0])].numpy()),
                             key_phrases=(key_phrases or {}).get(c)) for c in clips]
    finisher.finish(results)
    return [r.text for r in results]


def test_the_vocabulary_comes_from_the_tokenizer(checkpoint):
    name, root, adapter = checkpoint
    vocab = _finisher(root).vocab
    assert (vocab.blank, vocab.size) == (adapter.blank, adapter.vocab_size)
    ids = vocab.ctc_ids("Hello the world")                 # folded to the lower-case vocabulary
    assert vocab.decode(ids) == "hello the world" and not vocab.cased
    assert adapter.blank not in ids
    # LM ids: the non-blank rank (wav2vec2's blank 0 shifts every id down, Parakeet's last blank none)
    assert vocab.lm_token_ids("hello") == [i - (i > adapter.blank) for i in vocab.ctc_ids("hello")]


def test_beam_one_without_lm_is_the_greedy_text(checkpoint, drafts):
    _, root, _ = checkpoint
    clips = sorted(drafts)
    texts = _finish(_finisher(root, "beam.size=1"), drafts, clips)
    assert texts == [drafts[c][2].strip() for c in clips]
    assert all(texts)


def test_lm_weight_zero_is_no_lm(checkpoint, drafts, lm_dir):
    _, root, _ = checkpoint
    clips = sorted(drafts)
    assert _finish(_finisher(root, f"beam.lm_path={lm_dir}", "beam.alpha_lm=0"), drafts, clips) == \
        _finish(_finisher(root), drafts, clips)


def test_lm_text_is_the_argmax_of_acoustic_plus_alpha_kenlm(checkpoint, drafts, lm_dir):
    import kenlm

    from shardscribe.pipeline.lm.arpa import tokens_line

    _, root, _ = checkpoint
    plain = _finisher(root)
    fused = _finisher(root, f"beam.lm_path={lm_dir}", f"beam.alpha_lm={ALPHA}")
    vocab, model = fused.vocab, kenlm.Model(str(lm_dir / "lm.arpa"))
    changed = 0
    for clip, (lp, lengths, _) in sorted(drafts.items()):
        ours = fused.search(lp, lengths)
        changed += ours.tokens[0] != plain.search(lp, lengths).tokens[0]
        n = int(lengths[0])
        totals = []
        for i, (toks, score) in enumerate(zip(ours.nbest_tokens[0], ours.nbest_scores[0].tolist())):
            if not math.isfinite(score):
                continue
            align = ours.alignments[0, i, :n]
            acoustic = float(lp[0, :n].gather(1, align[:, None]).sum())
            lm_ln = model.score(tokens_line(lm_index(toks, vocab.blank)), bos=True, eos=True) * math.log(10.0)
            assert score == pytest.approx(acoustic + ALPHA * lm_ln, abs=2e-3), (clip, i)
            totals.append((acoustic + ALPHA * lm_ln, toks))
        assert len(totals) > 1
        best = max(t for t, _ in totals)
        assert best == pytest.approx(totals[0][0], abs=2e-3)     # the search's best is the argmax
        assert _finish(fused, drafts, [clip]) == [vocab.decode(ours.tokens[0]).strip()]
    assert changed >= 1                                          # the LM changed a best path


def test_a_row_key_phrase_is_boosted_into_that_row_only(checkpoint, drafts):
    _, root, _ = checkpoint
    clips = sorted(drafts)[:2]
    # Without FLToP: the random Parakeet's frames are nearly flat over its 35 pieces, and the
    # piece "▁the" is never among a frame's top 8, so pruning would leave nothing to boost.
    sets = ("beam.flop_top_n=null", "beam.flop_ratio=null")
    plain = _finish(_finisher(root, *sets), drafts, clips)
    phrase = "the"                              # spelt with the model's own tokens by its vocabulary
    assert not any(phrase in t for t in plain)
    boosted = _finish(_finisher(root, "beam.alpha_boost=5.0", *sets), drafts, clips, key_phrases={clips[0]: [phrase]})
    assert phrase in boosted[0] and boosted[0] != plain[0]
    assert boosted[1] == plain[1]


@pytest.fixture(scope="module")
def manifest(tmp_path_factory, samples_dir, sample_manifest):
    """The bundled clips, a file of random bytes and a missing file; every clip but one
    has a per-row key phrase."""
    root = tmp_path_factory.mktemp("beam-in")
    path, lines = manifest_with_random_bytes(root, samples_dir, sample_manifest, at=1)
    lines.insert(3, {"id": "missing", "audio": str(root / "missing.flac")})
    for i, line in enumerate(lines):
        if i % 2 == 0:
            line["key_phrases"] = ["the"]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path, lines


def test_cli_beam_with_lm_on_a_ctc_checkpoint(checkpoint, lm_dir, manifest, tmp_path):
    """``--model DIR --config ctc_beam``: the family comes from the checkpoint and the
    embedded config's window packing is dropped. Ray for one checkpoint, the in-process
    runner for the other (the same actors)."""
    name, root, _ = checkpoint
    path, lines = manifest
    dst = tmp_path / "out"
    runner = "ray" if name == "parakeet" else "local"
    summary, rows = transcribe_cli(dst, "--runner", runner, "--input", str(path), "--config", "ctc_beam",
                                   "--model", str(root), "--set", f"beam.lm_path={lm_dir}",
                                   "--set", "batching.recordings_per_batch=3", "--set", "ray.num_cpus=4")
    assert summary["rows_in"] == summary["rows_out"] == len(lines) == len(rows)
    assert summary["errors"] == 2
    for bad in ("random", "missing"):
        assert rows[bad]["error"] and rows[bad]["text"] is None
    for line in lines:
        if line["id"] not in ("random", "missing"):
            row = rows[line["id"]]
            assert row["error"] is None and row["decoder"] == "ctc_beam" and row["text"], row
            for seg in row["segments"]:
                assert seg["stage"] == "beam"
                assert " ".join(w["word"] for w in seg["words"]) == " ".join(seg["text"].split())
                assert all(seg["start"] <= w["start"] < w["end"] <= seg["end"] for w in seg["words"])


def test_the_embedded_vocabulary_is_the_charset():
    from shardscribe.pipeline.models import model_family
    from shardscribe.pipeline.text import charset

    vocab = model_family("whisper").ctc_vocabulary(load_config("ctc_beam").model)
    assert (vocab.blank, vocab.size, vocab.cased) == (charset.BLANK, charset.NUM_CLASSES, True)
    assert vocab.lm_token_ids("The Check") == charset.lm_token_ids("The Check")
    assert vocab.decode(charset.encode("The Check")) == "The Check"


def test_case_folding_follows_the_vocabulary(tmp_path):
    """An upper-case character vocabulary (like wav2vec2-base-960h's) spells phrases and LM
    text upper-cased and skips case variants; a mixed-case one keeps case and its variants."""
    from transformers import Wav2Vec2CTCTokenizer

    from shardscribe.pipeline.text.ctc_vocabulary import TokenizerVocabulary

    for letters, cased, spelt in (("ABCDEHT", False, "THE CAB"), ("abcdehtABCDEHT", True, "the CAB")):
        chars = ["<pad>", "<unk>", "|"] + list(letters)
        (tmp_path / "vocab.json").write_text(json.dumps({c: i for i, c in enumerate(chars)}))
        tok = Wav2Vec2CTCTokenizer(str(tmp_path / "vocab.json"), unk_token="<unk>", pad_token="<pad>",
                                   word_delimiter_token="|", bos_token=None, eos_token=None)
        vocab = TokenizerVocabulary(tok, blank=0, size=len(chars))
        assert vocab.cased is cased
        assert vocab.decode(vocab.ctc_ids("the CAB")) == spelt


def test_build_lm_on_a_checkpoint_counts_non_blank_tokens(checkpoint, lm_dir):
    _, _, adapter = checkpoint
    assert json.loads((lm_dir / "lm.json").read_text())["vocab_size"] == adapter.vocab_size - 1


@pytest.mark.parametrize("seed", range(3))
def test_exhaustive_search_over_pieces_with_blank_last_equals_brute_force(tmp_path, seed):
    """A SentencePiece-style vocabulary with its blank last (as Parakeet's): a beam as wide
    as the alignment space finds brute force's best transcript and score, LM included (LM
    ids = CTC ids below the blank), and the vocabulary spells it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from beam_reference import BigramTable, brute_force
    from shardscribe.pipeline.decoding.ctc_beam import CTCBeamSearch
    from shardscribe.pipeline.text.ctc_vocabulary import TokenizerVocabulary

    pieces = ["▁a", "b", "▁", "<pad>"]
    spm = Tokenizer(models.Unigram([(p, -1.0) for p in pieces], unk_id=None))
    spm.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    spm.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    vocab = TokenizerVocabulary(PreTrainedTokenizerFast(tokenizer_object=spm, pad_token="<pad>"), blank=3, size=4)
    g = torch.Generator().manual_seed(seed)
    lp = (1.5 * torch.randn(1, 5, 4, generator=g)).log_softmax(-1)
    lm = BigramTable.random(3, seed)
    ref = brute_force(lp[0], beta=0.3, fusion=[(lm, 0.9)], blank=3)
    res = CTCBeamSearch(4 ** 5, blank=3, beta=0.3, lm=lm, alpha_lm=0.9)(lp)
    assert tuple(res.tokens[0]) == ref[0][0]
    assert float(res.scores[0]) == pytest.approx(ref[0][1], abs=1e-4)
    greedy = [c for i, c in enumerate(lp[0].argmax(-1).tolist()) if c != 3 and (i == 0 or c != lp[0, i - 1].argmax())]
    if seed == 0:
        assert greedy != res.tokens[0]        # an input where the search is not greedy
    assert vocab.decode(res.tokens[0]).strip() == "".join(pieces[i] for i in ref[0][0]).replace("▁", " ").strip()


def test_lm_search_on_the_models_tokens_matches_flashlight(checkpoint, drafts, lm_dir):
    """flashlight-text's lexicon-free decoder on the same log-probs and the same
    token-level ARPA (build-lm --tokenizer DIR): the same best hypothesis with the same
    eq. 1 score, on clips where the LM moves the best path away from greedy. The first
    frame is made a sure blank: flashlight starts every hypothesis on its silence token
    (here the word delimiter / lone ``▁``), so emitting it on frame 0 would be a repeat for it."""
    from shardscribe.pipeline.decoding.ctc_beam import CTCBeamSearch
    from shardscribe.pipeline.training.references.ctc_decoders import FlashlightCTC
    from shardscribe.pipeline.lm.ngpu_lm import NGramLM
    from shardscribe.pipeline.text.ctc_vocabulary import TokenizerVocabulary

    name, root, adapter = checkpoint
    vocab = TokenizerVocabulary.from_pretrained(str(root))
    silence = vocab.ctc_ids("a b")[1] if name == "wav2vec2" else vocab.tokenizer.convert_tokens_to_ids("▁")
    arpa = str(lm_dir / "lm.arpa")
    lm = NGramLM.from_arpa(arpa, vocab.size - 1)
    moved = 0
    for clip in sorted(drafts)[:4]:
        lp, n, _ = drafts[clip]
        lp = lp[0, :int(n[0])].clone()
        lp[0] = -1e4
        lp[0, vocab.blank] = 0.0
        ours = CTCBeamSearch(8, blank=vocab.blank, lm=lm, alpha_lm=ALPHA)(lp[None])
        greedy = CTCBeamSearch(1, blank=vocab.blank)(lp[None])
        moved += ours.tokens[0] != greedy.tokens[0]
        fl_tokens, fl_score = FlashlightCTC(vocab.size, vocab.blank, 8, space=silence, arpa_path=arpa,
                                            lm_weight=ALPHA).decode(lp.numpy())
        assert ours.tokens[0] == fl_tokens, clip
        assert float(ours.scores[0]) == pytest.approx(fl_score, abs=2e-3)
    assert moved >= 1


def test_a_key_phrase_is_spelt_exactly_in_the_models_tokens_or_not_at_all(checkpoint):
    """Hand-spelt against the tiny vocabularies (tests/test_ctc_family.py): a phrase that
    loses a letter ("naïve" was "nave") or spells only separators (" - " was two ``|`` on
    wav2vec2, "." the ``▁`` on Parakeet) is None; punctuation the vocabulary lacks is left
    out and the space around it kept once; case is folded to the vocabulary's."""
    from test_ctc_family import CHARS, PIECES

    name, root, adapter = checkpoint
    vocab = _finisher(root).vocab
    for phrase in ("naïve", " - ", ".", "é é", "lazy dög", "|", "3 mm"):
        assert vocab.phrase_token_ids(phrase) is None, phrase
    table = CHARS if name == "wav2vec2" else PIECES
    spelt = {"wav2vec2": {"Lazy dog.": list("lazy|dog"), "a - b": list("a|b"), "e-mail": list("email")},
             "parakeet": {"Lazy dog.": ["▁", *"lazy", "▁", *"dog"], "a - b": ["▁a", "▁", "b"],
                          "e-mail": ["▁", *"email"]}}[name]
    for phrase, pieces in spelt.items():
        assert vocab.phrase_token_ids(phrase) == lm_index([table.index(p) for p in pieces], adapter.blank), phrase
