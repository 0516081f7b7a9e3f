"""Word timestamps from CTC best paths (pipeline.decoding.ctc_words): exact on frame paths
built with known token runs, for the three word conventions (a space character, ``|``,
SentencePiece ``▁``); and on real model outputs, the words of greedy and beam segments
spell the text the model's own decoding (greedy: ``processor.batch_decode``) or the search
gave, in time order inside the segment, with the model's frame stride."""
from __future__ import annotations

import json

import pytest
import torch

from shardscribe.pipeline.decoding.ctc_words import token_runs, words_from_path
from shardscribe.pipeline.text import charset
from shardscribe.pipeline.text.ctc_vocabulary import CharsetVocabulary, TokenizerVocabulary
from test_ctc_family import saved_checkpoint

torch.set_num_threads(1)


def _path(runs, blank, total):
    """A frame path with ``runs`` [(label, first_frame, n_frames)] and blanks elsewhere."""
    path = [blank] * total
    for label, first, n in runs:
        path[first:first + n] = [label] * n
    return path


def test_token_runs_split_repeats_at_blanks():
    # "l l" held over two frames, a blank, then "l" again: two tokens, the first 2 frames long
    assert token_runs([0, 5, 5, 0, 5, 7, 7, 0], blank=0) == ([5, 5, 7], [1, 4, 5], [3, 5, 7])


def test_charset_words_from_a_known_path():
    vocab = CharsetVocabulary()
    ids = charset.encode("Hi yo")           # H i ' ' y o
    runs = [(ids[0], 3, 2), (ids[1], 6, 1), (ids[2], 8, 1), (ids[3], 12, 3), (ids[4], 16, 2)]
    words = words_from_path(_path(runs, charset.BLANK, 20), charset.BLANK, vocab, 0.02)
    assert words == [{"word": "Hi", "start": 0.06, "end": 0.14}, {"word": "yo", "start": 0.24, "end": 0.36}]


def test_delimiter_and_piece_vocabularies_from_known_paths(tmp_path):
    from transformers import Wav2Vec2CTCTokenizer

    chars = ["<pad>", "<unk>", "|", "a", "b", "c"]
    (tmp_path / "vocab.json").write_text(json.dumps({c: i for i, c in enumerate(chars)}))
    tok = Wav2Vec2CTCTokenizer(str(tmp_path / "vocab.json"), unk_token="<unk>", pad_token="<pad>",
                               word_delimiter_token="|", bos_token=None, eos_token=None)
    vocab = TokenizerVocabulary(tok, blank=0, size=len(chars))
    # "ab|c": the delimiter belongs to no word
    path = _path([(3, 1, 1), (4, 2, 2), (2, 5, 1), (5, 7, 1)], 0, 10)
    assert words_from_path(path, 0, vocab, 0.02) == [{"word": "ab", "start": 0.02, "end": 0.08},
                                                     {"word": "c", "start": 0.14, "end": 0.16}]

    from test_ctc_family import PIECES, _parakeet

    _, processor = _parakeet(tmp_path)
    blank = len(PIECES) - 1
    vocab = TokenizerVocabulary(processor.tokenizer, blank=blank, size=len(PIECES))
    the, th, e, a = (PIECES.index(p) for p in ("▁the", "th", "e", "▁a"))
    # "▁the ▁a th e" -> "the athe": a "▁" piece opens a word, a bare piece continues one
    path = _path([(the, 0, 1), (a, 3, 2), (th, 6, 1), (e, 9, 1)], blank, 12)
    words = words_from_path(path, blank, vocab, 0.08)
    assert [w["word"] for w in words] == processor.tokenizer.decode([the, a, th, e]).split() == ["the", "athe"]
    assert [(w["start"], w["end"]) for w in words] == [(0.0, 0.08), (0.24, 0.8)]


@pytest.fixture(scope="module", params=["parakeet", "wav2vec2"])
def checkpoint(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    return root, saved_checkpoint(request.param, root)[2]


def _assert_timed_words(words, text, duration_s, stride):
    assert " ".join(w["word"] for w in words) == " ".join(text.split())
    for w in words:
        assert 0.0 <= w["start"] < w["end"] <= duration_s + stride + 1e-9, w
    assert all(a["end"] <= b["start"] for a, b in zip(words, words[1:])), words


def test_greedy_words_spell_the_models_own_text(checkpoint, sample_audio):
    from shardscribe.pipeline.kinds.ctc_greedy.stage import CTCGreedySegmentDecoder

    root, adapter = checkpoint
    decoder = CTCGreedySegmentDecoder(adapter, vocabulary=TokenizerVocabulary.from_pretrained(str(root)))
    clips = sorted(sample_audio)
    results = decoder.decode([sample_audio[c] for c in clips])
    assert any(r.words for r in results)
    for clip, res in zip(clips, results):
        draft = adapter.ctc_draft(adapter.encode([sample_audio[clip]]))
        assert res.text == draft.texts[0].strip()
        _assert_timed_words(res.words, res.text, len(sample_audio[clip]) / 16000, adapter.frame_stride_s)


def test_beam_words_spell_the_beam_text_where_it_is_not_greedy(checkpoint, sample_audio):
    """A per-row key phrase pulls the beam away from greedy; the words follow the beam."""
    from shardscribe.pipeline.config import load_config
    from shardscribe.pipeline.kinds.ctc_beam.stages import CTCLogProbsDecoder, build_search

    root, adapter = checkpoint
    clips = sorted(sample_audio)
    pending = CTCLogProbsDecoder(adapter).decode([sample_audio[c] for c in clips])
    greedy = [adapter.ctc_draft(adapter.encode([sample_audio[c]])).texts[0].strip() for c in clips]
    # no FLToP: the random models' frames are nearly flat, and "the" is rarely in a frame's top 8
    finisher = build_search(load_config("ctc_model_beam", [f"model.source={root}", "beam.use_cuda_graphs=false",
                                                           "beam.alpha_boost=5.0", "beam.flop_top_n=null",
                                                           "beam.flop_ratio=null"]))
    for res in pending:
        res.key_phrases = ["the"]
    finisher.finish(pending)
    assert any(r.text != g for r, g in zip(pending, greedy))
    for clip, res in zip(clips, pending):
        _assert_timed_words(res.words, res.text, len(sample_audio[clip]) / 16000, adapter.frame_stride_s)


def test_embedded_model_greedy_words(sample_audio):
    from shardscribe.pipeline.config import load_config
    from shardscribe.pipeline.kinds.ctc_greedy.stage import build
    from shardscribe.pipeline.models import load_model

    cfg = load_config("ctc_greedy", ["model.family=ctc"])
    decoder = build(load_model(cfg.model), cfg)
    clips = sorted(sample_audio)
    for clip, res in zip(clips, decoder.decode([sample_audio[c] for c in clips])):
        _assert_timed_words(res.words, res.text, len(sample_audio[clip]) / 16000, 0.02)


def _two_segment_recording(audio) -> dict:
    """A prepared recording (records.PREPARED_SCHEMA) holding ``audio`` twice: a segment at
    its start, and one 40 s in, as VAD cuts a long file (or a NeMo span at an offset)."""
    d = len(audio) / 16000
    return {"id": "rec", "audio": "rec.wav", "offset_s": None, "duration_s": 40.0 + d,
            "seg_start": [0.0, 40.0], "seg_end": [d, 40.0 + d], "seg_audio": [audio, audio], "error": None}


@pytest.mark.parametrize("kind", ["ctc_greedy", "ctc_beam"])
def test_output_words_stay_inside_their_segment_and_the_recording(kind, sample_audio):
    """The model's last frame also covers padding past the audio (Whisper's 20-ms frames
    over 2.965 s here), so a decoder's last word can end after the audio; in the output
    every word lies inside its own segment, and so inside the recording."""
    from shardscribe.pipeline.config import load_config
    from shardscribe.pipeline.kinds import decoder_kind
    from shardscribe.pipeline.models import load_model
    from shardscribe.pipeline.segment_runner import complete_pending, transcribe_prepared

    audio = sample_audio["fox_flite_slt"]
    assert (len(audio) / 16000 / 0.02) % 1 > 0            # a partial last frame: the case at hand
    cfg = load_config(kind)
    spec = decoder_kind(kind)
    first = spec.build_first_stage(load_model(cfg.model), cfg)
    rows = transcribe_prepared([_two_segment_recording(audio)], first, cfg.batching.max_tokens,
                               pending_as_bytes=False)
    if spec.two_stage:
        rows = complete_pending(rows, spec.build_second_stage(cfg, first), cfg.batching.max_tokens)
    row = rows[0]
    assert row["error"] is None and row["text"]
    for seg in row["segments"]:
        assert seg["words"]
        for w in seg["words"]:
            assert seg["start"] <= w["start"] <= w["end"] <= seg["end"], (seg["start"], seg["end"], w)
            assert 0.0 <= w["start"] <= w["end"] <= row["duration_s"], w
