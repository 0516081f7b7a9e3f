"""The transducer model family (transformers' ParakeetForRNNT / ParakeetForTDT, the models
of "Pushing the Limits of Beam Search Decoding for Transducer-based ASR models") on tiny
random checkpoints saved here: batched greedy decoding through the adapter equals the
model's own ``generate`` token for token on every bundled sample (its first 3 s), and a padded batch
equals each clip alone.

transformers 5.x's TDT ``generate`` takes its argmax over the token and duration logits
together (its sampling step sees the whole joint output), so the reference masks the
duration columns out of that argmax with a logits processor; its own duration rule is
untouched. It also has no ``max_symbols`` guard for zero-duration tokens, so the TDT
checkpoint here is biased against duration 0 and ``generate`` always ends.
"""
from __future__ import annotations

import pytest
import torch

from shardscribe.pipeline.decoding.transducer.greedy import transducer_greedy
from shardscribe.pipeline.models.transducer.adapter import load_transducer_adapter
from transducer_reference import build


@pytest.fixture(scope="module", params=["rnnt", "tdt"])
def checkpoint(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    model, processor = build(request.param, root, max_symbols=3, blank_bias=3.0, zero_duration_bias=-100.0)
    return request.param, model, processor, load_transducer_adapter(str(root))


def _generate(model, processor, audio):
    """transformers alone on one clip: the emitted tokens of ``generate`` over the frames
    its encoder counts as audio."""
    from transformers import LogitsProcessorList

    v = model.config.vocab_size

    def tokens_only(ids, scores):
        return scores.masked_fill(torch.arange(scores.shape[-1]) >= v, float("-inf"))

    inputs = processor.feature_extractor(audio, sampling_rate=16000, return_tensors="pt")
    with torch.no_grad():
        n = int(model.get_audio_features(**inputs, output_attention_mask=True).attention_mask.sum())
        out = model.generate(**inputs, max_new_tokens=n * model.config.max_symbols_per_step + 1,
                             logits_processor=LogitsProcessorList([tokens_only]))
    t, tokens = 0, []
    for tok, dur in zip(out.sequences[0, 1:].tolist(), out.durations[0, 1:].tolist()):
        if t >= n:
            break
        if tok != model.config.blank_token_id:
            tokens.append(tok)
        t += dur
    assert t >= n, "generate stopped before the end of the audio"
    return tokens


def test_greedy_equals_generate_on_every_sample(checkpoint, sample_audio):
    kind, model, processor, adapter = checkpoint
    assert adapter.capabilities == frozenset({"transducer"})
    assert (adapter.durations is not None) == (kind == "tdt")
    texts = []
    for clip, audio in sample_audio.items():
        audio = audio[:3 * 16000]      # generate steps one token at a time: keep it short
        ref = _generate(model, processor, audio)
        enc = adapter.encode([audio])
        assert int(enc.valid_frames[0]) == adapter.segment_cost(len(audio))
        out = transducer_greedy(adapter, enc.states, enc.valid_frames)
        assert out.tokens[0] == ref, clip
        texts.append(adapter.decode_text(ref))
    assert len(set(texts)) >= len(texts) - 1, texts       # the random model says different things


def test_a_padded_batch_equals_each_clip_alone(checkpoint, sample_audio):
    _, _, _, adapter = checkpoint
    audios = list(sample_audio.values())
    enc = adapter.encode(audios)
    batch = transducer_greedy(adapter, enc.states, enc.valid_frames)
    for i, audio in enumerate(audios):
        alone = adapter.encode([audio])
        n = int(alone.valid_frames[0])
        assert int(enc.valid_frames[i]) == n
        torch.testing.assert_close(enc.states[i, :n], alone.states[0, :n], atol=1e-4, rtol=0)
        assert transducer_greedy(adapter, alone.states, alone.valid_frames).tokens[0] == batch.tokens[i]


def test_a_bad_source_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="not a directory"):
        load_transducer_adapter(str(tmp_path / "nope"))
    from test_ctc_family import saved_checkpoint   # a CTC Parakeet: not a transducer

    saved_checkpoint("parakeet", tmp_path / "ctc")
    with pytest.raises(ValueError, match="not a transducer"):
        load_transducer_adapter(str(tmp_path / "ctc"))


def test_preflight_names_a_missing_tokenizer_before_any_worker(tmp_path):
    """A Parakeet transducer without its tokenizer: one line from the driver's preflight and
    a ModelError naming the folder from the loader."""
    import shutil

    from shardscribe.pipeline.config import load_config
    from shardscribe.pipeline.models.preflight import ModelError, check_model

    build("tdt", tmp_path / "tdt")
    shutil.copytree(tmp_path / "tdt", tmp_path / "bad", ignore=shutil.ignore_patterns("tokenizer*"))
    bad = tmp_path / "bad"
    with pytest.raises(ModelError, match=f"model.source={bad}: the checkpoint has no tokenizer files") as exc:
        check_model(load_config("transducer_greedy", [f"model.source={bad}"]).model)
    assert len(str(exc.value).splitlines()) == 1
    with pytest.raises(ModelError, match=str(bad)):
        load_transducer_adapter(str(bad))
    check_model(load_config("transducer_greedy", [f"model.source={tmp_path / 'tdt'}"]).model)


def test_greedy_decoder_honours_the_configured_max_symbols(tmp_path, sample_audio):
    """``transducer.max_symbols`` bounds the tokens per frame of ``transducer_greedy``, as it
    does the beam search's: on an RNN-T biased against blank, which emits several tokens per
    frame by default, a cap of 1 leaves at most one token on each frame it read."""
    from shardscribe.pipeline.config import load_config
    from shardscribe.pipeline.kinds.transducer_greedy.stage import build as build_greedy

    build("rnnt", tmp_path, max_symbols=3, blank_bias=-3.0)
    adapter = load_transducer_adapter(str(tmp_path))
    audio = sample_audio["fox_flite_slt"][:16000]
    frames = adapter.segment_cost(len(audio))
    cfg = load_config(None, ["decoder.kind=transducer_greedy", "model.family=transducer",
                             f"model.source={tmp_path}"])
    default = build_greedy(adapter, cfg).decode([audio])[0]
    assert default.tokens > frames                       # the default does emit several per frame
    cfg = load_config(None, ["decoder.kind=transducer_greedy", "model.family=transducer",
                             f"model.source={tmp_path}", "transducer.max_symbols=1"])
    capped = build_greedy(adapter, cfg).decode([audio])[0]
    assert 0 < capped.tokens <= frames
