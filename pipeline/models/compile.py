"""``model.compile``: the encoder under ``torch.compile`` (TorchDynamo graph capture +
TorchInductor code generation: "PyTorch 2: Faster Machine Learning Through Dynamic Python
Bytecode Transformation and Graph Compilation", Ansel et al., ASPLOS 2024), compiled in
place with static shapes (``dynamic=False``): one specialised graph per input shape.

Shapes stay few because batches are buckets: Whisper's encoder always reads 30-s windows
(only the batch size varies); a CTC checkpoint that masks its padding pads each batch up to
whole seconds (``CTCModelAdapter.use_static_shapes``). Where shapes still vary (a model run
in equal-length buckets, Parakeet transducers), dynamo recompiles per shape up to its
``recompile_limit`` and runs eager beyond it, so the key never changes what is computed.
"""
from __future__ import annotations

import logging

from torch import nn

log = logging.getLogger(__name__)


def encoder_module(adapter) -> nn.Module | None:
    """The module that maps a batch's features to encoder states, found on any family's
    adapter: the embedded transducer's Whisper, granite's conformer, Whisper's and
    Parakeet's ``encoder``, else a CTC checkpoint's whole forward (its head is one linear)."""
    inner = getattr(adapter, "whisper", None)
    if inner is not None:
        return encoder_module(inner)
    if isinstance(getattr(adapter, "encoder", None), nn.Module):
        return adapter.encoder
    model = getattr(adapter, "model", None)
    if not isinstance(model, nn.Module):
        return None
    for owner in (getattr(model, "model", None), model):
        if isinstance(getattr(owner, "encoder", None), nn.Module):
            return owner.encoder
    return model


def compile_encoder(adapter):
    """``adapter`` with its encoder compiled in place (the adapter's own calls go through
    the compiled graph); unchanged, with one log line, where it has no encoder module."""
    module = encoder_module(adapter)
    if module is None:
        log.warning("model.compile: %s has no encoder module to compile; running eager", type(adapter).__name__)
        return adapter
    module.compile(dynamic=False)
    static = getattr(adapter, "use_static_shapes", None)
    if static is not None:
        static()
    return adapter
