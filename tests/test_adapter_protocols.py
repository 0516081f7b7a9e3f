"""Every registered model family's adapter satisfies the Protocols of the capabilities it
declares (pipeline.models.base): each member present, of the right kind (a method or an
attribute), and each method callable as the Protocol declares it (parameter names, order
and defaults). The adapters are built by the registry's factory (``load_model``) on the
tiny random checkpoints the family tests use and on the shipped models; the check itself
is shown to fail on adapters with a member taken away or changed."""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Callable

import pytest

from shardscribe.pipeline.config import ModelConfig
from shardscribe.pipeline.models import FAMILIES, load_model, model_family
from shardscribe.pipeline.models.base import (ATTENTION_DECODER, BEAM_VOCABULARY, CTC, PROTOCOLS, ARDecoderModel, CTCModel,
                                  EncoderModel, MultitaskDecoderModel, contract_problems, protocol_members,
                                  protocol_problems, protocols_of)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@dataclass(frozen=True)
class Case:
    family: str
    name: str
    # (tmp folder, session model cache) -> the model config the family's factory loads
    config: Callable


def _model_config(family: str, source, cache, **options) -> ModelConfig:
    mc = ModelConfig(family=family, source=str(source), device="cpu", dtype="float32", cache_dir=str(cache))
    return mc.with_values(**options) if options else mc


def _tiny_whisper(root, cache):
    from whisper_tiny import build_tiny_whisper

    return _model_config("whisper", build_tiny_whisper(root), cache)


def _ctc_checkpoint(name: str):
    def build(root, cache):
        from test_ctc_family import saved_checkpoint

        saved_checkpoint(name, root)
        return _model_config("ctc", root, cache)
    return build


def _granite(with_vocab: bool):
    def build(root, cache):
        from test_granite_adapter import CTC_VOCAB, _model, _tokenizer
        from test_granite_family import N_MELS

        tok = _tokenizer()
        _model(tok).save_pretrained(root)
        tok.save_pretrained(root)
        (root / "preprocessor_config.json").write_text(json.dumps({"n_mels": N_MELS}))
        if not with_vocab:
            return _model_config("granite_speech", root, cache)
        (root / "ctc_vocab.json").write_text(json.dumps(CTC_VOCAB))
        return _model_config("granite_speech", root, cache, ctc_vocab=str(root / "ctc_vocab.json"))
    return build


def _parakeet_transducer(kind: str):
    def build(root, cache):
        from transducer_reference import build as build_checkpoint

        build_checkpoint(kind, root)
        return _model_config("transducer", root, cache)
    return build


CASES = [
    # the whisper family's shipped tiny.en, alone and with its CTC head, and a checkpoint
    Case("whisper", "embedded", lambda root, cache: _model_config("whisper", "embedded", cache)),
    Case("whisper", "embedded+ctc_head",
         lambda root, cache: _model_config("whisper", "embedded", cache, ctc_head="embedded")),
    Case("whisper", "tiny_random", _tiny_whisper),
    Case("granite_speech", "ctc_vocab", _granite(True)),
    Case("granite_speech", "no_ctc_vocab", _granite(False)),
    Case("ctc", "embedded", lambda root, cache: _model_config("ctc", "embedded", cache)),
    Case("ctc", "wav2vec2", _ctc_checkpoint("wav2vec2")),
    Case("ctc", "parakeet", _ctc_checkpoint("parakeet")),
    Case("transducer", "embedded", lambda root, cache: _model_config("transducer", "embedded", cache)),
    Case("transducer", "embedded_rnnt", lambda root, cache: _model_config("transducer", "embedded_rnnt", cache)),
    Case("transducer", "parakeet_rnnt", _parakeet_transducer("rnnt")),
    Case("transducer", "parakeet_tdt", _parakeet_transducer("tdt")),
]


def test_every_registered_family_is_checked_with_its_shipped_model():
    assert {c.family for c in CASES} == set(FAMILIES)
    for name, family in FAMILIES.items():
        if family.has_embedded:
            assert any(c.family == name and c.name.startswith("embedded") for c in CASES), name


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.family}-{c.name}")
def test_each_family_satisfies_the_protocols_of_what_it_declares(case, tmp_path, model_cache, request):
    mc = case.config(tmp_path, model_cache)
    family = model_family(case.family)
    declared = family.capabilities(mc)
    # the session's converted tiny.en stands for the whisper family's own load of it
    adapter = (request.getfixturevalue("whisper_adapter") if (case.family, case.name) == ("whisper", "embedded")
               else load_model(mc))
    # what the family promises before loading is what the loaded adapter says it has
    assert declared <= adapter.capabilities
    caps = declared | adapter.capabilities
    assert contract_problems(adapter, caps) == []
    for protocol in protocols_of(adapter, caps):
        assert isinstance(adapter, protocol)
    if BEAM_VOCABULARY in caps:
        # the family's promise, not the adapter's: its vocabulary from the config alone
        assert family.vocabulary is not None and family.ctc_vocabulary(mc).size > 0


def test_every_capability_but_the_familys_vocabulary_has_a_protocol():
    from shardscribe.pipeline.models import base

    names = {v for k, v in vars(base).items() if k.isupper() and isinstance(v, str)}
    assert set(PROTOCOLS) == names - {BEAM_VOCABULARY} - base.TRAITS
    assert set(protocol_members(EncoderModel)) <= set(protocol_members(ARDecoderModel))


# --- the check itself ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def granite():
    """A granite-speech adapter with its CTC vocabulary, built in memory (no checkpoint)."""
    from shardscribe.pipeline.models.granite_speech.adapter import GraniteSpeechAdapter
    from test_granite_adapter import CTC_VOCAB, _model, _tokenizer

    tok = _tokenizer()
    return GraniteSpeechAdapter(_model(tok), tok, CTC_VOCAB)


def _changed(adapter, **members):
    """A copy of ``adapter`` whose class is a subclass with ``members`` in place of its own."""
    twin = copy.copy(adapter)
    twin.__class__ = type(f"Changed{type(adapter).__name__}", (type(adapter),), members)
    return twin


def _taken_away(name: str):
    """A class member that reads as absent: getting it raises AttributeError."""
    def absent(self):
        raise AttributeError(name)
    return property(absent)


def test_the_check_passes_the_adapter_as_built(granite):
    assert CTC in granite.capabilities and ATTENTION_DECODER in granite.capabilities
    assert contract_problems(granite) == []


@pytest.mark.parametrize("members, says", [
    ({"ctc_draft": _taken_away("ctc_draft")}, "ctc_draft (CTCModel): missing"),
    ({"eot_id": _taken_away("eot_id")}, "eot_id (ARDecoderModel): missing"),
    ({"decoder_hidden": lambda self, input_ids, states, cache=None, attention_mask=None, position_ids=None: None},
     "decoder_hidden (ARDecoderModel): parameter 2 is states, declared encoder_states"),
    ({"segment_cost": lambda self, num_samples, packed: 0}, "segment_cost (EncoderModel): packed has no default"),
    ({"text": lambda self, token_ids, strip: ""}, "text (ARDecoderModel): strip without a default"),
    ({"next_tokens": lambda self, hidden: hidden}, "next_tokens (ARDecoderModel): a method, declared an attribute"),
    ({"static_step": None}, "static_step (ARDecoderModel): not a method"),
], ids=["missing-method", "missing-attribute", "renamed-parameter", "lost-default", "extra-parameter",
        "attribute-as-method", "method-as-attribute"])
def test_the_check_reports_a_member_taken_away_or_changed(granite, members, says):
    problems = contract_problems(_changed(granite, **members))
    assert [p.split(".", 1)[1] for p in problems] == [says]


def test_a_declared_capability_brings_its_protocol_and_options_the_multitask_one(granite):
    """Declaring a capability is a promise to its Protocol: an adapter that declared CTC
    without ctc_draft fails, and one whose decoding options are set must also have the
    multitask format's members (the ar kind's per-row path reads them)."""
    lacking = _changed(granite, ctc_draft=_taken_away("ctc_draft"))
    assert contract_problems(lacking, {ATTENTION_DECODER}) == []
    assert contract_problems(lacking, {ATTENTION_DECODER, CTC})
    assert protocols_of(granite) == [EncoderModel, ARDecoderModel, CTCModel]
    optioned = _changed(granite, options=object())
    assert MultitaskDecoderModel in protocols_of(optioned)
    missing = {p.split(": ")[0].split(".", 1)[1] for p in protocol_problems(optioned, MultitaskDecoderModel)}
    assert {"language_prompts (MultitaskDecoderModel)", "detect_recordings (MultitaskDecoderModel)",
            "special (MultitaskDecoderModel)"} <= missing
