"""The model-family registry: what a family loads, offers and needs.

A family entry names the module that loads it (imported only when a model is loaded, so
validating a config stays cheap), the capabilities it can offer for a given model config,
its window rule (the longest segment it reads) and, where it offers ``beam_vocabulary``,
the factory of its CTC vocabulary (``ctc_vocabulary``: built from the config alone, for
the beam pool, which has no model). ``load_model(model_config)`` is the
one factory the actors, runners and benchmarks call.

A family's own config keys are its ``options`` dataclass (``model.<key>``; validated by
its ``validate(key, model)``, and checked against the job by ``check_job(cfg, kind, kinds)`` where
it defines one). What config loading must know of a family is its entry too: which of its
keys belong to one model (``model_keys``: dropped when ``--model`` or ``--set`` changes the
model) and the shipped config a ``--model`` of it runs where the default does not fit
(``default_config``), so ``pipeline.config`` names no family.
"""
from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import Callable



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
    # The family's own model.* keys: a dataclass, or a function of model.source returning
    # one (or None) where the keys depend on which model the source names
    options: type | Callable | None = None
    # "module:function": (model config, the checkpoint's config.json or None for a shipped
    # model) -> None, raising ModelError where the family's options do not fit the checkpoint
    preflight: str | Callable | None = None
    # source names, besides "embedded", of models shipped with the family
    shipped: tuple[str, ...] = ()
    # short names of the shipped models for ``--model`` (``tiny.en``) -> their model.source
    names: tuple[tuple[str, str], ...] = ()
    # Keys of the family's options whose value belongs to one model (a CTC head is fitted on
    # one encoder): a config's value is dropped where ``--model`` names another shipped
    # model, or where ``--model`` or ``--set`` moves the job to a model without the key.
    model_keys: tuple[str, ...] = ()
    # model.source -> the shipped config ``--model`` runs with when no ``--config`` is given,
    # where the default one (conf/default.yaml) does not fit that model; None: the default
    default_config: Callable[[str], str | None] | None = None

    def config_for(self, source: str) -> str | None:
        """The shipped config a ``--model`` of this family at ``source`` runs with when no
        ``--config`` names one (None: conf/default.yaml)."""
        return self.default_config(source) if self.default_config is not None else None

    def options_class(self, source: str):
        """The dataclass of this family's own keys for ``source`` (None: it has none)."""
        opts = self.options
        if opts is None or dataclasses.is_dataclass(opts):
            return opts
        return opts(source)

    def load(self, model_config, device: str, dtype):
        return importlib.import_module(self.module).load(model_config, device=device, dtype=dtype)

    def loads_architecture(self, arch: str) -> bool:
        return any(arch == a or (a.startswith("*") and arch.endswith(a[1:])) for a in self.architectures)

    def loads_model_type(self, model_type) -> bool:
        return model_type in self.known_model_types()

    def known_model_types(self) -> tuple[str, ...]:
        types = self.model_types
        return tuple(_named(types) if isinstance(types, str) else types)

    def option_classes(self) -> list[type]:
        """Every options dataclass the family may use: its shipped model's ("embedded")
        and a checkpoint's (any other source)."""
        found = {self.options_class("embedded"), self.options_class("")} - {None}
        return sorted(found, key=lambda c: c.__name__)

    def check(self, model_config, checkpoint_config: dict | None) -> None:
        """The family's preflight of ``model_config`` (a no-op for a family with none)."""
        if self.preflight is not None:
            (self.preflight if callable(self.preflight) else _named(self.preflight))(model_config, checkpoint_config)

    def check_components(self, model_config) -> None:
        if self.components is not None:
            _named(self.components)(model_config)

    def ctc_vocabulary(self, model_config):
        """The CTC vocabulary of ``model_config``'s model, without loading the model (a
        checkpoint at a URL: from its config and tokenizer files in this node's cache)."""
        if self.vocabulary is None:
            raise ValueError(f"model family {self.name!r} names no CTC vocabulary")
        factory = self.vocabulary
        return (factory if callable(factory) else _named(factory))(self.on_this_node(model_config, weights=False))

    def on_this_node(self, model_config, weights: bool = True):
        """``model_config`` with its checkpoint on this node (pipeline.models.remote: a URL's
        copy in the node's cache; a hub id downloaded under model.allow_download)."""
        from .remote import local_model_config

        return local_model_config(model_config, weights, shipped=("embedded",) + self.shipped)


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


def option_default(name: str) -> tuple[bool, object]:
    """Whether some registered family's options have key ``name``, and its default there."""
    for family in FAMILIES.values():
        for cls in family.option_classes():
            for f in dataclasses.fields(cls):
                if f.name == name:
                    return True, (f.default_factory() if f.default is dataclasses.MISSING else f.default)
    return False, None


def option_classes() -> list[type]:
    """Every registered family's options dataclasses."""
    out = []
    for family in FAMILIES.values():
        out += [c for c in family.option_classes() if c not in out]
    return out


def load_model(model_config):
    """The adapter for ``model_config`` (a pipeline.config.ModelConfig), on its device; a
    checkpoint at a URL is loaded from this node's copy (pipeline.models.remote), fetched
    by the first process on the node that needs it."""
    import torch

    from ..device import load_target

    model_config = model_family(model_config.family).on_this_node(model_config)
    if model_config.num_threads:
        torch.set_num_threads(model_config.num_threads)
    # model.device and model.dtype "auto" are resolved here, in the process that loads the model.
    device, dtype = load_target(model_config)
    adapter = model_family(model_config.family).load(model_config, device=device, dtype=dtype)
    if model_config.compile:
        from .compile import compile_encoder

        compile_encoder(adapter)
    return adapter
