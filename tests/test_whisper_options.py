"""Whisper as users know it (model.language / task / initial_prompt / timestamps /
word_timestamps, any size), each checked against transformers' own ``generate`` on tiny
random checkpoints built here (tests/whisper_tiny.py), and the up-front refusals."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from whisper_tiny import NO_TS, PREV, build_tiny_whisper

MAX_NEW = 24


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def multilingual_dir(tmp_path_factory):
    return build_tiny_whisper(tmp_path_factory.mktemp("tiny-ml"))


@pytest.fixture(scope="module")
def multilingual(multilingual_dir):
    from shardscribe.pipeline.models.whisper.loader import load_whisper

    return load_whisper(str(multilingual_dir))


@pytest.fixture(scope="module")
def mel128(tmp_path_factory):
    # turbo / large-v3 shape: 128 mel bins; distil-whisper's: 2 decoder layers
    from shardscribe.pipeline.models.whisper.loader import load_whisper

    return load_whisper(str(build_tiny_whisper(tmp_path_factory.mktemp("tiny-128"), n_mels=128, seed=1)))


@pytest.fixture(scope="module")
def audios():
    rng = np.random.default_rng(0)
    out = []
    for seconds, hz in ((2.0, 220.0), (4.0, 440.0), (1.5, 330.0)):
        t = np.arange(int(seconds * 16000)) / 16000
        out.append((0.3 * np.sin(2 * np.pi * hz * t) + rng.normal(0, 0.05, t.size)).astype(np.float32))
    return out


def _decoder(model_processor, **options):
    from shardscribe.pipeline.kinds.ar.stage import ARSegmentDecoder
    from shardscribe.pipeline.models.whisper.adapter import WhisperAdapter
    from shardscribe.pipeline.models.whisper.prompting import WhisperOptions

    adapter = WhisperAdapter(*model_processor, options=WhisperOptions(**options))
    return ARSegmentDecoder(adapter, max_new_tokens=MAX_NEW)


def _ours(dec, audios):
    """Our token ids per segment, re-tokenised from nothing: the decoder's own loop."""
    from shardscribe.pipeline.decoding.ar.greedy import TokenRules, greedy_decode

    adapter = dec.adapter
    enc = adapter.encode(audios)
    prompts, _, _ = adapter.language_prompts(enc.states)
    return greedy_decode(adapter, enc.states, max_new_tokens=MAX_NEW, prompts=prompts,
                         rules=TokenRules.of(adapter, adapter.timestamp_rules))


def _generate(dec, audios, **kwargs):
    """transformers' greedy generate on the same features, with the adapter's suppress set
    (it also keeps <|startoftranscript|>, <|notimestamps|> and, without timestamps, the
    time tokens out: tokens a transcript never holds)."""
    adapter = dec.adapter
    suppress = adapter.suppress_mask.nonzero().squeeze(-1).tolist()
    out = adapter.model.generate(adapter.features(audios), max_new_tokens=MAX_NEW, suppress_tokens=suppress,
                                 **kwargs)
    return [_until_eot(row, adapter.eot_id) for row in out.tolist()]


def _until_eot(row, eot):
    return row[:row.index(eot)] if eot in row else row


@pytest.mark.parametrize("options, kwargs", [
    ({"language": "de"}, {"language": "de"}),
    ({"language": "fr", "task": "translate"}, {"language": "fr", "task": "translate"}),
    ({"language": "de", "initial_prompt": "Grüße aus Berlin"}, {"language": "de"}),
], ids=["fixed-language", "translate", "initial-prompt"])
def test_prompt_options_equal_generate(multilingual, audios, options, kwargs):
    dec = _decoder(multilingual, **options)
    if "initial_prompt" in options:
        prompt = dec.adapter.processor.get_prompt_ids(options["initial_prompt"], return_tensors="pt")
        assert prompt[0].item() == PREV
        kwargs = {**kwargs, "prompt_ids": prompt}
    ours = _ours(dec, audios)
    assert ours == _generate(dec, audios, **kwargs)
    assert all(len(t) > 3 for t in ours)
    results = dec.decode(audios)
    assert [r.text for r in results] == [dec.adapter.tokenizer.decode(t, skip_special_tokens=True).strip()
                                         for t in ours]
    assert {r.language for r in results} == {options["language"]} and {r.language_prob for r in results} == {None}


def test_detected_language_equals_generate(multilingual, audios):
    dec = _decoder(multilingual, language="auto")
    model = dec.adapter.model
    feats = dec.adapter.features(audios)
    expected_ids = model.detect_language(feats).tolist()
    names = {v: k.strip("<|>") for k, v in model.generation_config.lang_to_id.items()}
    results = dec.decode(audios)
    assert [r.language for r in results] == [names[i] for i in expected_ids]
    assert len(set(expected_ids)) > 1  # the rows really are told apart
    # the probability among the language tokens, from a plain forward pass
    sot = torch.full((len(audios), 1), model.config.decoder_start_token_id)
    logits = model(input_features=feats, decoder_input_ids=sot).logits[:, -1]
    lang = torch.tensor(sorted(names))
    probs = logits[:, lang].softmax(-1)
    for r, i, p in zip(results, expected_ids, probs):
        assert r.language_prob == pytest.approx(p[sorted(names).index(i)].item(), rel=1e-4)
    # language=None: generate detects too (task given: without it generate leaves the task token out)
    assert _ours(dec, audios) == _generate(dec, audios, task="transcribe")


def test_128_mel_model_equals_generate(mel128, audios):
    dec = _decoder(mel128, language="es")
    assert dec.adapter.features(audios).shape[1] == 128
    assert _ours(dec, audios) == _generate(dec, audios, language="es")


def test_timestamps_equal_generate_and_split_the_text(multilingual, audios):
    from shardscribe.pipeline.models.whisper.prompting import split_timestamps

    dec = _decoder(multilingual, language="de", timestamps=True)
    ours = _ours(dec, audios)
    adapter = dec.adapter
    out = adapter.model.generate(adapter.features(audios), language="de", return_timestamps=True,
                                 max_new_tokens=MAX_NEW, return_segments=True,
                                 suppress_tokens=adapter.suppress_mask.nonzero().squeeze(-1).tolist())
    for b, toks in enumerate(ours):
        # generate decodes a 30-s window again from its last closed span; its first pass is ours
        first = out["segments"][b][0]["result"].tolist()
        assert first[:len(adapter.prompt_ids)] == adapter.prompt_ids
        assert toks == _until_eot(first[len(adapter.prompt_ids):], adapter.eot_id)
        assert any(t > NO_TS for t in toks) and toks[0] > NO_TS
    results = dec.decode(audios)
    for toks, res, audio in zip(ours, results, audios):
        last = len(audio) / 16000  # times past the audio are clamped to its end
        # (the tokenizer's own output_offsets cannot read these ids: it takes the time tokens
        # to start after its last registered special token, <|endoftext|>)
        _, spans = split_timestamps(toks, NO_TS + 1)
        stamps = {round((t - NO_TS - 1) * 0.02, 3) for t in toks if t > NO_TS}
        assert len(spans) >= 2 and all(round(a, 3) in stamps and (e is None or round(e, 3) in stamps)
                                       for a, e, _ in spans)
        assert all(e is None or a <= e for a, e, _ in spans) and all(e is not None for _, e, _ in spans[:-1])
        assert [a for a, _, _ in spans] == sorted(a for a, _, _ in spans)
        assert sum((ids for _, _, ids in spans), []) == [t for t in toks if t <= NO_TS]
        assert [(s["start"], s["end"], s["text"]) for s in res.spans] == \
            [(round(min(a, last), 3), round(last if e is None else min(e, last), 3), adapter.text(ids))
             for a, e, ids in spans]
        assert res.text == adapter.text(toks) and not any("<|" in s["text"] for s in res.spans)
        assert "".join("".join(s["text"].split()) for s in res.spans) == "".join(res.text.split())


def test_word_times_equal_generate_token_timestamps(multilingual, audios):
    from shardscribe.pipeline.models.whisper.alignment import token_times

    dec = _decoder(multilingual, language="de", word_timestamps=True)
    adapter, model = dec.adapter, dec.adapter.model
    enc = adapter.encode(audios)
    prompts, _, _ = adapter.language_prompts(enc.states)
    ours = _ours(dec, audios)
    times = token_times(adapter, enc.states, enc.valid_frames.tolist(), prompts, ours, adapter.alignment_heads)
    attention = model.config._attn_implementation
    for b, audio in enumerate(audios):
        valid = int(enc.valid_frames[b])
        mask = torch.zeros(1, 3000, dtype=torch.long)
        mask[0, :2 * valid] = 1
        out = model.generate(adapter.features([audio]), language="de", max_new_tokens=MAX_NEW,
                             return_token_timestamps=True, attention_mask=mask,
                             suppress_tokens=adapter.suppress_mask.nonzero().squeeze(-1).tolist())
        model.config._attn_implementation = attention  # generate switched it to eager for the weights
        seq = out["sequences"][0].tolist()
        assert _until_eot(seq, adapter.eot_id) == ours[b]
        # generate feeds every token but the last it generates: all of ours where it ended
        # with end-of-text, all but our last where the token limit cut it off
        # (generate returns no end-of-text and no time for it)
        ended = len(ours[b]) < MAX_NEW
        fed = ours[b] if ended else ours[b][:-1]
        mine = times[b] if ended else token_times(adapter, enc.states[b:b + 1], [valid], prompts[b:b + 1], [fed],
                                                  adapter.alignment_heads)[0]
        mine, expected = mine[:len(fed)], out["token_timestamps"][0][:len(fed)].tolist()
        # (a random model's heads do not follow the audio: the path is nearly flat, but
        # it is generate's, frame for frame)
        assert len(fed) > 5 and mine == pytest.approx(expected, abs=1e-6)
    res = dec.decode(audios)
    for r, t, toks in zip(res, times, ours):
        assert r.words and all(w["start"] <= w["end"] for w in r.words)
        assert [w["start"] for w in r.words] == sorted(w["start"] for w in r.words)
        assert " ".join(w["word"] for w in r.words) == " ".join(r.text.split())


def test_english_only_model_refuses_language_and_translate():
    from shardscribe.pipeline.config import load_config
    from shardscribe.pipeline.models.preflight import ModelError, check_model

    check_model(load_config("ar", ["model.language=en", "model.word_timestamps=true"]).model)
    for override, message in (("model.language=de", "model.language=de: an English-only model"),
                              ("model.task=translate", "model.task=translate: an English-only model cannot "
                                                       "translate")):
        with pytest.raises(ModelError, match=message):
            check_model(load_config("ar", [override]).model)


def test_options_that_need_the_ar_loop_are_config_errors():
    from shardscribe.pipeline.config import ConfigError, load_config

    for overrides, message in ((["model.language=auto"], "model.language=auto: only decoder.kind=ar"),
                               (["model.timestamps=true"], "model.timestamps: only decoder.kind=ar"),
                               (["model.language=Deutsch"], "model.language: expected a language code")):
        with pytest.raises(ConfigError, match=message):
            load_config("ssd", overrides)
    with pytest.raises(ConfigError, match="model.task: expected one of transcribe, translate"):
        load_config("ar", ["model.task=summarize"])
    with pytest.raises(ConfigError, match="model.language: decoder.kind=ctc_greedy does not run"):
        load_config("ctc_greedy", ["model.language=de"])


def test_embedded_head_on_another_model_fails_up_front(tmp_path, samples_dir, multilingual_dir, capsys):
    """A 384-wide model that is not tiny.en (tiny multilingual), and a tiny random one
    through --model: one line naming model.ctc_head, exit 2, before any worker."""
    from shardscribe.jobs.cli import main

    tiny = tmp_path / "whisper-tiny"
    tiny.mkdir()
    (tiny / "config.json").write_text(json.dumps({"model_type": "whisper", "architectures": [
        "WhisperForConditionalGeneration"], "d_model": 384, "encoder_layers": 4, "num_mel_bins": 80,
        "vocab_size": 51865}))
    for args, message in ((["--set", f"model.source={tiny}"], "model.ctc_head=embedded: the embedded CTC head "
                           "reads Whisper tiny.en's encoder; model.source=" + str(tiny) + " is another model "
                           "(vocab_size 51865, tiny.en 51864)"),
                          (["--model", str(multilingual_dir)], "model.ctc_head=embedded: the head reads 384-wide")):
        code = main(["transcribe", "--input", str(samples_dir / "samples.jsonl"), "--output", str(tmp_path / "o"),
                     "--config", "ssd", *args])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and message in err, err
        assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("removed, says", [
    (["tokenizer.json"], "has no tokenizer files"),
    (["processor_config.json", "preprocessor_config.json"], "has no feature extractor files"),
])
def test_preflight_names_a_missing_tokenizer_or_feature_extractor(multilingual_dir, tmp_path, removed, says):
    """A Whisper checkpoint without part of its processor: one line from the driver's
    preflight, and ModelError from the loader (without tokenizer.json transformers builds a
    one-token tokenizer instead of failing: every transcript would be empty)."""
    import shutil

    from shardscribe.pipeline.config import load_config
    from shardscribe.pipeline.models.preflight import ModelError, check_model
    from shardscribe.pipeline.models.whisper.loader import load_whisper

    bad = tmp_path / "bad"
    shutil.copytree(multilingual_dir, bad, ignore=shutil.ignore_patterns(*removed))
    with pytest.raises(ModelError, match=f"model.source={bad}: the checkpoint {says}") as exc:
        check_model(load_config("ar", [f"model.source={bad}"]).model)
    assert len(str(exc.value).splitlines()) == 1
    with pytest.raises(ModelError, match=str(bad)):
        load_whisper(str(bad))
    check_model(load_config("ar", [f"model.source={multilingual_dir}"]).model)


def test_preflight_refuses_a_feature_extractor_of_other_mel_bins(multilingual_dir, tmp_path):
    """A feature extractor saved the transformers 5 way (inside processor_config.json) is
    checked against the encoder's mel bins too: 128-bin features into an 80-bin encoder is
    one line before any worker, not a shape error in every one."""
    import shutil

    from shardscribe.pipeline.config import load_config
    from shardscribe.pipeline.models.preflight import ModelError, check_model

    bad = tmp_path / "bad"
    shutil.copytree(multilingual_dir, bad)
    assert not (bad / "preprocessor_config.json").exists()
    config = json.loads((bad / "processor_config.json").read_text())
    config["feature_extractor"]["feature_size"] = 128
    (bad / "processor_config.json").write_text(json.dumps(config))
    with pytest.raises(ModelError, match="its feature extractor makes 128 mel bins, its encoder reads 80"):
        check_model(load_config("ar", [f"model.source={bad}"]).model)


def test_the_cli_refuses_a_whisper_checkpoint_without_its_feature_extractor(multilingual_dir, tmp_path,
                                                                           samples_dir, capsys):
    import shutil

    from shardscribe.jobs.cli import main

    bad = tmp_path / "bad"
    shutil.copytree(multilingual_dir, bad, ignore=shutil.ignore_patterns("processor_config.json"))
    code = main(["transcribe", "--input", str(samples_dir / "samples.jsonl"), "--output", str(tmp_path / "o"),
                 "--runner", "local", "--config", "ar", "--set", f"model.source={bad}"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "has no feature extractor files" in err, err
    assert not (tmp_path / "o").exists()


def test_row_language_is_the_one_decoded_longest():
    from shardscribe.pipeline.kinds.base import SegmentResult
    from shardscribe.pipeline.records import OUTPUT_SCHEMA, finalize_row, segment_dict, table

    segs = [segment_dict(0.0, 1.0, SegmentResult("a", "ar", language="en", language_prob=0.5)),
            segment_dict(1.0, 3.0, SegmentResult("b", "ar", language="de", language_prob=0.9,
                                                 spans=[{"start": 0.1, "end": 0.4, "text": "b"}])),
            segment_dict(3.0, 4.0, SegmentResult("c", "ar", language="de", language_prob=0.6))]
    row = finalize_row({"id": "x", "segments": segs})
    assert row["language"] == "de" and row["language_prob"] == pytest.approx((2 * 0.9 + 0.6) / 3)
    assert segs[1]["spans"] == [{"start": 1.1, "end": 1.4, "text": "b"}]  # recording seconds
    assert finalize_row({"id": "y", "segments": [segment_dict(0.0, 1.0, SegmentResult("a", "ar"))]})["language"] is None
    assert table([row], OUTPUT_SCHEMA).column("language").to_pylist() == ["de"]


def test_word_times_on_tiny_en_equal_generate(whisper_adapter, samples_dir):
    """The embedded tiny.en with its real alignment heads: word times that follow the
    speech, token for token generate's ``return_token_timestamps``."""
    from shardscribe.pipeline.audio import decode_audio
    from shardscribe.pipeline.decoding.ar.greedy import greedy_decode
    from shardscribe.pipeline.models.whisper.adapter import WhisperAdapter
    from shardscribe.pipeline.kinds.ar.stage import ARSegmentDecoder
    from shardscribe.pipeline.models.whisper.alignment import token_times
    from shardscribe.pipeline.models.whisper.prompting import WhisperOptions

    adapter = WhisperAdapter(whisper_adapter.model, whisper_adapter.processor,
                             options=WhisperOptions(word_timestamps=True))
    audio = decode_audio((samples_dir / "pump_flite_rms.flac").read_bytes())[0]
    enc = adapter.encode([audio])
    ours = greedy_decode(adapter, enc.states)[0]
    valid = int(enc.valid_frames[0])
    times = token_times(adapter, enc.states, [valid], [adapter.prompt_ids], [ours], adapter.alignment_heads)[0]
    mask = torch.zeros(1, 3000, dtype=torch.long)
    mask[0, :2 * valid] = 1
    attention = adapter.model.config._attn_implementation
    out = adapter.model.generate(adapter.features([audio]), return_token_timestamps=True, attention_mask=mask,
                                 suppress_tokens=adapter.suppress_mask.nonzero().squeeze(-1).tolist())
    adapter.model.config._attn_implementation = attention
    seq = out["sequences"][0].tolist()
    assert _until_eot(seq, adapter.eot_id) == ours and len(ours) < MAX_NEW
    # generate returns no end-of-text and no time for it; ours repeats the last for the end
    assert times[:-1] == pytest.approx(out["token_timestamps"][0].tolist(), abs=1e-6) and times[-1] == times[-2]
    words = ARSegmentDecoder(adapter)._words(ours, times, len(audio) / 16000)
    assert [w["word"] for w in words] == "Please replace the pump filter before Monday morning.".split()
    starts = [w["start"] for w in words]
    assert starts == sorted(starts) and len(set(starts)) == len(starts) and 2.5 < starts[-1] < len(audio) / 16000
