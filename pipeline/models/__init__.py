"""Model families: one subpackage each (``pipeline/models/<family>/``), one registry entry
each.

A family's ``__init__`` registers it (``pipeline.models.registry``) with its options and
its ``load(model_config, device, dtype)`` returning an adapter (``pipeline.models.base``),
and imports no torch. Importing this package registers the built-in families; a family
of your own registers the same way from your code. ``load_model(model_config)`` is the
one factory the actors, runners and benchmarks call.
"""
from __future__ import annotations

from .registry import FAMILIES, ModelFamily, load_model, model_family, register_family
from . import whisper, granite_speech, ctc, transducer  # noqa: F401,E402

# The family a config that names none loads (model.family): Whisper, tiny.en embedded.
DEFAULT_FAMILY = whisper.FAMILY.name

__all__ = ["DEFAULT_FAMILY", "FAMILIES", "ModelFamily", "load_model", "model_family", "register_family"]
