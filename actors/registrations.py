"""What the plan ships to every actor besides the config: the decoder kind and the model
family it names. Registered in the actor's own process before the config is read, so a
kind or family that user code registered only in the driver is known in every Ray worker
(the driver's registry does not travel by itself)."""
from __future__ import annotations

from ..pipeline.kinds import DecoderKind, register_decoder_kind
from ..pipeline.models import ModelFamily, register_family


def adopt(kind: DecoderKind | None, family: ModelFamily | None) -> None:
    if kind is not None:
        register_decoder_kind(kind)
    if family is not None:
        register_family(family)
