"""Model families: one subpackage each, one registry entry each.

A family entry names the module that loads it (imported only when a model is loaded, so
validating a config stays cheap), the capabilities it can offer for a given model config,
its window rule (the longest segment it reads) and, where it offers ``beam_vocabulary``,
the factory of its CTC vocabulary (``ctc_vocabulary``: built from the config alone, for
the beam pool, which has no model). ``load_model(model_config)`` is the
one factory the actors, runners and benchmarks call.

Adding a family: write ``pipeline/models/<name>/`` with a ``load(model_config, device, dtype)`` returning
an adapter (see ``pipeline.models.base``) and register a ``ModelFamily`` for it below, or
from your own package with ``register_family``.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from pipeline.models.base import ATTENTION_DECODER, BEAM_VOCABULARY, CTC, PACKABLE, TRANSDUCER


@dataclass(frozen=True)
class ModelFamily:
    name: str
    module: str                     # defines load(model_config, device, dtype) -> adapter
    # model config -> capabilities a model of this family will have (known before loading)
    capabilities: Callable[[object], frozenset]
    max_segment_s: float            # the longest segment the encoder reads
    max_segment_cost: int           # batch-budget cost of the longest segment (padded frames)
    # capability name -> what to set (or use instead) when it is missing, for the error message
    hint: Callable[[str], str] = lambda capability: ""
    # "module:function" (or a callable): model config -> pipeline.text.ctc_vocabulary.CTCVocabulary
    # of the model's CTC output; imported only when used, like ``module``
    vocabulary: str | Callable | None = None
    # transformers architecture names (or, starting with "*", name suffixes) it loads, so
    # ``--model DIR`` finds the family from the checkpoint's config.json
    architectures: tuple[str, ...] = ()
    # config.json ``model_type`` values it loads (what the loader accepts), by which the
    # driver judges a checkpoint whose config names no architecture; or "module:attribute" of
    # a mapping keyed by them, imported only then, like ``module``
    model_types: tuple[str, ...] | str = ()
    # False where the loader reads a config that names no model_type at all (it builds
    # its own config class instead of transformers' Auto* lookup by model_type)
    needs_model_type: bool = True
    has_embedded: bool = False      # model.source: embedded names a model shipped with the package
    # "module:function": (model config) -> None, raising pipeline.models.preflight.ModelError
    # where the checkpoint's tokenizer or feature extractor cannot be loaded. The driver runs
    # it before any worker starts, so a checkpoint missing them is one line, not a worker's
    # traceback; it loads what the family's loader loads, without the weights.
    components: str | None = None

    def load(self, model_config, device: str, dtype):
        return importlib.import_module(self.module).load(model_config, device=device, dtype=dtype)

    def loads_architecture(self, arch: str) -> bool:
        return any(arch == a or (a.startswith("*") and arch.endswith(a[1:])) for a in self.architectures)

    def loads_model_type(self, model_type) -> bool:
        return model_type in self.known_model_types()

    def known_model_types(self) -> tuple[str, ...]:
        types = self.model_types
        return tuple(_named(types) if isinstance(types, str) else types)

    def check_components(self, model_config) -> None:
        if self.components is not None:
            _named(self.components)(model_config)

    def ctc_vocabulary(self, model_config):
        """The CTC vocabulary of ``model_config``'s model, without loading the model."""
        if self.vocabulary is None:
            raise ValueError(f"model family {self.name!r} names no CTC vocabulary")
        factory = self.vocabulary
        return (factory if callable(factory) else _named(factory))(model_config)


def _named(ref: str):
    """The object a "module:attribute" string names."""
    module, attr = ref.split(":")
    return getattr(importlib.import_module(module), attr)


FAMILIES: dict[str, ModelFamily] = {}


def register_family(family: ModelFamily) -> ModelFamily:
    FAMILIES[family.name] = family
    return family


def model_family(name: str) -> ModelFamily:
    try:
        return FAMILIES[name]
    except KeyError:
        raise KeyError(f"no model family {name!r} (known: {', '.join(sorted(FAMILIES))})") from None


def load_model(model_config):
    """The adapter for ``model_config`` (a pipeline.config.ModelConfig), on its device."""
    import torch

    from pipeline.device import resolve_device, torch_dtype

    if model_config.num_threads:
        torch.set_num_threads(model_config.num_threads)
    return model_family(model_config.family).load(model_config, device=resolve_device(model_config.device),
                                                  dtype=torch_dtype(model_config.dtype))


_BEAM_VOCAB_HINT = "ctc_beam has no vocabulary for this family's CTC outputs yet; use ctc_greedy"

register_family(ModelFamily(
    "whisper", "pipeline.models.whisper",
    capabilities=lambda m: frozenset({ATTENTION_DECODER, PACKABLE} | ({CTC, BEAM_VOCABULARY} if m.ctc_head else set())),
    max_segment_s=30.0, max_segment_cost=1500,
    hint=lambda cap: "set model.ctc_head (embedded, or a head directory)" if cap in (CTC, BEAM_VOCABULARY) else "",
    # every head this family loads, embedded or a directory, is over the character set
    vocabulary="pipeline.text.ctc_vocabulary:embedded_vocabulary",
    architectures=("WhisperForConditionalGeneration",), model_types=("whisper",), needs_model_type=False,
    has_embedded=True,
    components="pipeline.models.whisper:check_components"))
register_family(ModelFamily(
    "granite_speech", "pipeline.models.granite_speech",
    capabilities=lambda m: frozenset({ATTENTION_DECODER} | ({CTC} if m.ctc_vocab else set())),
    max_segment_s=60.0, max_segment_cost=3000,
    hint=lambda cap: ("set model.ctc_vocab (a JSON list naming the encoder's CTC outputs, blank first)"
                      if cap == CTC else _BEAM_VOCAB_HINT if cap == BEAM_VOCABULARY
                      else "it cannot pack encoder windows: --set ssd.pack_gate=false" if cap == PACKABLE else ""),
    architectures=("GraniteSpeechForConditionalGeneration",), model_types=("granite_speech",),
    components="pipeline.models.granite_speech:check_components"))
# Any transformers CTC checkpoint. Frame rates differ per model (wav2vec2: 320 samples,
# Parakeet: 1280), but the window rule must be known before a model is loaded: the segment
# cost is priced at the finest common stride, wav2vec2's 20 ms, so 30 s cost 1500 frames
# and no model of the family can exceed the budget that admits one segment. Its embedded
# model (Whisper's encoder + CTC head) packs windows like the whisper family.
register_family(ModelFamily(
    "ctc", "pipeline.models.ctc",
    capabilities=lambda m: frozenset({CTC, BEAM_VOCABULARY} | ({PACKABLE} if m.source == "embedded" else set())),
    max_segment_s=30.0, max_segment_cost=1500,
    hint=lambda cap: ("use --config ctc_model_greedy or ctc_model_beam, or --set decoder.pack_windows=false"
                      if cap == PACKABLE else ""),
    vocabulary="pipeline.models.ctc:ctc_vocabulary",
    # AutoModelForCTC loads the model types of this mapping
    architectures=("*ForCTC",), model_types="transformers.models.auto.modeling_auto:MODEL_FOR_CTC_MAPPING_NAMES",
    has_embedded=True, components="pipeline.models.ctc:check_components"))
# transformers' ParakeetForRNNT / ParakeetForTDT ("Pushing the Limits of Beam Search Decoding
# for Transducer-based ASR models"): encoder frames, predictor step and joint; and the
# embedded TDT over Whisper tiny.en. Parakeet's frames are 80 ms (30 s: 375 frames), the
# embedded one's 40 ms (30 s: 750): priced at the finer, as the ctc family does.
register_family(ModelFamily(
    "transducer", "pipeline.models.transducer",
    capabilities=lambda m: frozenset({TRANSDUCER}),
    max_segment_s=30.0, max_segment_cost=750,
    hint=lambda cap: "use --config transducer_greedy or transducer_beam" if cap != TRANSDUCER else "",
    architectures=("ParakeetForRNNT", "ParakeetForTDT", "ShardscribeWhisperTDT"),
    model_types=("parakeet_rnnt", "parakeet_tdt"), has_embedded=True,
    components="pipeline.models.transducer:check_components"))
