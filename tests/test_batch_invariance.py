"""Batching must not change a model's output: for every registered model family (whisper,
ctc, transducer, granite_speech), on tiny random checkpoints built here, clips of clearly
different lengths decoded in one batch through the segment runner (length-sorted,
padded-token-budget batches, pipeline.batching) get exactly the text each gets decoded
alone, and encoder states equal to the clip's alone within float tolerance.

The ctc cases include the wav2vec2 default, ``feat_extract_norm="group"``, with a feature
extractor that does return an attention mask: the group norm of the conv feature encoder
takes its statistics over the padding too, so only equal-length buckets keep it invariant
(pipeline.models.ctc.adapter.padding_leaks).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from shardscribe.pipeline.config import load_config
from shardscribe.pipeline.kinds import decoder_kind
from shardscribe.pipeline.models import load_model
from shardscribe.pipeline.segment_runner import transcribe_prepared

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SECONDS = (0.7, 2.1, 3.6)      # clearly different lengths: every clip but the longest is padded
MAX_NEW = 6                    # autoregressive steps: enough to see the audio's effect, cheap


def _whisper(root):
    from whisper_tiny import build_tiny_whisper

    build_tiny_whisper(root, multilingual=False, decoder_layers=1)
    return "ar", ["model.family=whisper", f"model.source={root}", f"decoder.max_new_tokens={MAX_NEW}"]


def _ctc(name, mask_on_group_norm=False):
    def build(root):
        from test_ctc_family import BUILDERS

        make, norm = BUILDERS[name]
        model, processor = make(root, norm)
        if mask_on_group_norm:   # the extractor returns a mask the model's group norm ignores
            processor.feature_extractor.return_attention_mask = True
        model.save_pretrained(root)
        processor.save_pretrained(root)
        return "ctc_model_greedy", [f"model.source={root}"]
    return build


def _transducer(root):
    from transducer_reference import build

    build("tdt", root)
    return "transducer_greedy", [f"model.source={root}"]


def _granite(root):
    import json

    from test_granite_adapter import CTC_VOCAB, _model, _tokenizer
    from test_granite_family import N_MELS

    tok = _tokenizer()
    _model(tok).save_pretrained(root)
    tok.save_pretrained(root)
    (root / "preprocessor_config.json").write_text(json.dumps({"n_mels": N_MELS}))
    (root / "ctc_vocab.json").write_text(json.dumps(CTC_VOCAB))
    return "ar", ["model.family=granite_speech", f"model.source={root}", f"decoder.max_new_tokens={MAX_NEW}",
                  f"model.ctc_vocab={root / 'ctc_vocab.json'}"]


CASES = {   # case: (model family, checkpoint builder)
    "whisper": ("whisper", _whisper),
    "ctc_wav2vec2_layer_norm": ("ctc", _ctc("wav2vec2")),
    "ctc_wav2vec2_group_norm": ("ctc", _ctc("wav2vec2_group_norm")),
    "ctc_wav2vec2_group_norm_with_mask": ("ctc", _ctc("wav2vec2_group_norm", mask_on_group_norm=True)),
    "ctc_parakeet": ("ctc", _ctc("parakeet")),
    "transducer_tdt": ("transducer", _transducer),
    "granite_speech": ("granite_speech", _granite),
}


def test_every_registered_family_has_a_case():
    from shardscribe.pipeline.models import FAMILIES

    assert {family for family, _ in CASES.values()} >= set(FAMILIES)


@pytest.fixture(scope="module")
def clips(sample_audio):
    audio = sample_audio["fox_flite_slt"]
    return [np.resize(audio, int(s * 16000)) * (0.6 + 0.2 * i) for i, s in enumerate(SECONDS)]


def _texts(decoder, audios, budget):
    rows = [{"id": str(i), "audio": str(i), "seg_start": [0.0], "seg_end": [len(a) / 16000], "seg_audio": [a],
             "error": None} for i, a in enumerate(audios)]
    out = transcribe_prepared(rows, decoder, budget, pending_as_bytes=False)
    assert all(r["error"] is None for r in out), out
    return [r["text"] for r in out]


def _states(enc):
    """What the decoders read: granite's audio embeddings and its encoder's hidden states
    (the CTC head's input); every other family's encoder states."""
    hidden = getattr(enc, "hidden", None)
    return [(enc.states, enc.valid_frames)] + ([(hidden, enc.frames)] if hidden is not None else [])


@pytest.fixture(scope="module", params=sorted(CASES))
def loaded(request, tmp_path_factory):
    family, build = CASES[request.param]
    kind_config, sets = build(tmp_path_factory.mktemp(request.param))
    cfg = load_config(kind_config, sets)
    assert cfg.model.family == family
    adapter = load_model(cfg.model)
    return request.param, adapter, decoder_kind(cfg.decoder.kind).build_first_stage(adapter, cfg)


def test_a_batch_decodes_as_each_clip_alone(loaded, clips):
    _, _, decoder = loaded
    batched = _texts(decoder, clips, 10 ** 9)     # one batch
    alone = _texts(decoder, clips, 1)             # over budget: each clip its own batch
    assert batched == alone
    assert any(alone), alone                      # the random model says something


def test_a_batch_encodes_as_each_clip_alone(loaded, clips):
    case, adapter, _ = loaded
    batch = _states(adapter.encode(clips))
    for i, clip in enumerate(clips):
        for (states, valid), (one, one_valid) in zip(batch, _states(adapter.encode([clip]))):
            n = int(one_valid[0])
            assert int(valid[i]) == n
            torch.testing.assert_close(states[i, :n].float(), one[0, :n].float(), atol=1e-4, rtol=1e-4)
