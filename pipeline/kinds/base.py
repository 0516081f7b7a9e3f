"""The contract between the generic segment runner and a decoder kind.

A first stage turns a batch of segments' audio into ``SegmentResult``s. A result that is
not final yet has stage ``pending`` and carries the decoder's own ``pending`` state: a
small dataclass (a ``PendingState``) that the decoder's second stage reads back, in the
same process or after a trip through Arrow to another actor pool. The runner moves that
state without knowing its fields.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    from ..models.base import EncoderModel

PENDING = "pending"


class PendingState:
    """Base of a decoder's pending state: a dataclass whose fields are numpy arrays (or
    None; a first stage may keep a torch tensor for a second stage in its own process,
    packed as a numpy array should it travel) and JSON values (ints, floats, strings, lists
    of ints). ``to_bytes`` packs it as
    safetensors (the arrays as raw buffers, never as Python floats, and no pickle) for the
    Arrow column of the intermediate schema; ``from_bytes`` rebuilds it."""

    def to_bytes(self) -> bytes:
        import torch
        from safetensors.numpy import save

        arrays, values = {}, {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                # A tensor a first stage kept for a second stage in its own process.
                value = value.detach().cpu()
                value = (value.float() if value.is_floating_point() else value).numpy()
            if isinstance(value, np.ndarray):
                arrays[f.name] = np.ascontiguousarray(value)
            else:
                values[f.name] = value
        return save(arrays, metadata={"values": json.dumps(values)})

    @classmethod
    def from_bytes(cls, data: bytes):
        from safetensors.numpy import load

        return cls(**json.loads(_metadata(data)["values"]), **load(data))


def _metadata(data: bytes) -> dict:
    """The ``__metadata__`` of a safetensors buffer (its JSON header)."""
    size = int.from_bytes(data[:8], "little")
    return json.loads(data[8:8 + size]).get("__metadata__", {})


@dataclass
class SegmentResult:
    text: str
    stage: str
    tokens: int = 0
    t_encode_s: float = 0.0
    t_decode_s: float = 0.0
    error: str | None = None
    max_entropy: float | None = None
    min_prob: float | None = None
    prefix_len: int | None = None
    drafted: int | None = None
    generated: int | None = None
    pending: PendingState | None = dataclasses.field(default=None, repr=False)
    key_phrases: list[str] | None = None   # the recording's key phrases (input contract)
    # [{word, start, end}], seconds from the segment's start (null times for decoders
    # without an alignment); one feature dict per word for the confidence
    # (pipeline.confidence), which fills each word's ``confidence`` and the segment's
    words: list[dict] | None = None
    # [{start, end, text}], seconds from the segment's start (Whisper with timestamps)
    spans: list[dict] | None = None
    language: str | None = None       # the language the segment was decoded in (Whisper)
    language_prob: float | None = None  # its detection probability (model.language=auto)
    word_features: list[dict] | None = dataclasses.field(default=None, repr=False)
    confidence: float | None = None


class FirstStage(Protocol):
    """Decodes segments: ``segment_cost`` prices one in the batch budget (padded encoder
    frames), ``decode`` returns one result per audio, final or pending."""

    name: str

    def segment_cost(self, audio: np.ndarray) -> int: ...

    def decode(self, audios: list[np.ndarray]) -> list[SegmentResult]: ...


class SecondStage(Protocol):
    """Finishes pending results in place: ``pending_type`` rebuilds their state from
    bytes, ``cost`` prices one in the budget, ``finish`` returns the seconds it spent."""

    name: str
    pending_type: type

    def cost(self, result: SegmentResult) -> int: ...

    def finish(self, results: list[SegmentResult]) -> float: ...


def encode_then(adapter: EncoderModel, audios: list[np.ndarray], after_encode, packed: bool = False):
    """Encode ``audios`` (several short clips per encoder window when ``packed``) and run
    ``after_encode(encoder_batch)``; returns its result and the encoder's and its own
    seconds per segment (the per-stage timings of each row)."""
    from ..timing import timed

    enc, t_enc = timed(adapter.encode_packed if packed else adapter.encode, audios, device=adapter.device)
    out, t_after = timed(after_encode, enc, device=adapter.device)
    return out, t_enc / len(audios), t_after / len(audios)
