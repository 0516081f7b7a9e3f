"""What every model family gives the decoders: shared batch types, declared capabilities
and the Protocols that spell out each capability's methods and attributes.

A family's adapter turns audio into encoder states and, depending on what the model has,
offers a CTC output (``ctc_draft``), an attention decoder (``decoder_hidden``/``logits``
with prompts and suppress masks), packed encoder windows (``encode_packed``) or a
transducer's predictor and joint. It says which of these it has in ``capabilities``:
decoders and config validation read that declaration instead of probing for methods. It
also prices a segment in the batch budget (``segment_cost``), so generic code knows no
model's window or frame rate.

Each capability is a Protocol below (``PROTOCOLS``): an adapter that declares the
capability has every member of its Protocol, optional features included (an attribute
that is None or False where the model lacks the feature), so a decoder reads them
directly. ``contract_problems`` checks an adapter against the Protocols of what it declares;
the tests run it on every registered family.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Generic, Protocol, runtime_checkable

if TYPE_CHECKING:  # the batch types hold tensors; declaring capabilities must not import torch
    import numpy as np
    import torch

# Capability names, as decoder kinds list them in ``needs``.
CTC = "ctc"                        # CTCModel: ctc_draft, greedy CTC draft + frame entropies
ATTENTION_DECODER = "attention_decoder"  # ARDecoderModel: decoder_hidden / logits / batch_prompts / text
PACKABLE = "packable"              # PackableModel: encode_packed, several clips per encoder window
# The family can name its CTC output's vocabulary (blank, LM token ids, text rule:
# pipeline.text.ctc_vocabulary) from the model config alone, without loading the model:
# the CTC beam search's pool has no model but spells LM tokens and phrases and decodes text.
# A family's promise (ModelFamily.vocabulary), not an adapter's: it has no Protocol.
BEAM_VOCABULARY = "beam_vocabulary"
# TransducerModel: encoder frames, a predictor step and the joint of a transducer (RNN-T / TDT).
TRANSDUCER = "transducer"

# Trait names, as decoder kinds list them in ``traits`` and a family's options ask for them:
# AR_LOOP is a kind that runs Whisper's full greedy decoding loop (per-row prompts,
# language detection, timestamp rules).
AR_LOOP = "ar_loop"
TRAITS = frozenset({AR_LOOP})


@dataclass
class EncoderBatch:
    states: torch.Tensor        # [B, T, D]
    valid_frames: torch.Tensor  # [B] int64, states that cover real audio
    # Packed encodes only (``encode_packed(keep_windows=True)``): each clip's placement and
    # the states of the whole windows [W, T, D]. A clip alone in its window has exactly the
    # states a solo encode gives it, so a decoder that must read a whole window can use
    # them without encoding the clip again.
    placements: list | None = None
    window_states: torch.Tensor | None = None


@dataclass
class CTCDraftBatch:
    log_probs: torch.Tensor     # [B, T, C] over valid frames (padding beyond lengths)
    lengths: torch.Tensor       # [B]
    texts: list[str]            # greedy CTC text per row
    entropy: torch.Tensor       # [B, T] nats, 0 on padded frames
    max_entropy: torch.Tensor   # [B] over valid frames only


@runtime_checkable
class EncoderModel(Protocol):
    """Every adapter: audio in, encoder states out (pipeline.kinds.base.encode_then)."""

    capabilities: frozenset[str]
    device: torch.device
    dtype: torch.dtype          # of the states the decoders and heads see

    def encode(self, audios: list[np.ndarray]) -> EncoderBatch: ...

    def segment_cost(self, num_samples: int, packed: bool = False) -> int:
        """Padded encoder frames a segment of ``num_samples`` takes in a batch."""


@runtime_checkable
class PackableModel(EncoderModel, Protocol):
    """``packable``: several short clips per encoder window (pipeline.packing)."""

    window_samples: int         # the encoder window the clips share

    def encode_packed(self, audios: list[np.ndarray], gap_s: float = ...,
                      keep_windows: bool = False) -> EncoderBatch: ...

    def plan_packing(self, lengths: list[int], gap_s: float = ...) -> list: ...


@runtime_checkable
class CTCModel(EncoderModel, Protocol):
    """``ctc``: the greedy CTC draft of encoded audio (ctc_greedy, ctc_beam, SSD's gate)."""

    frame_stride_s: float | None    # seconds per CTC frame, for word times; None: not known
    # The CTC head as a module of its own, which ssd.adapt fits and swaps in place
    # (pipeline.kinds.ssd.adapt); None where the CTC output is part of the model's forward.
    ctc_head: Any | None

    def ctc_draft(self, enc: EncoderBatch) -> CTCDraftBatch: ...


@runtime_checkable
class ARDecoderModel(EncoderModel, Protocol):
    """``attention_decoder``: an autoregressive decoder over the encoder states, driven
    token by token with a KV cache (pipeline.decoding.ar.greedy, SSD's verification and
    fallback, the confidence's teacher-forced pass)."""

    eot_id: int
    vocab_size: int
    max_positions: int              # prompt + generated tokens the decoder can hold
    suppress_mask: torch.Tensor     # [V] bool: never emitted
    begin_suppress_ids: torch.Tensor  # never a transcript's first token
    # Greedy steps' token choice without the logits (pipeline.models.screened_argmax);
    # None: the argmax of the masked logits.
    next_tokens: Callable[[torch.Tensor], torch.Tensor] | None
    prompt_language: str | None     # the language every row is decoded in; None: not configured
    # The model's decoding options where its prompt follows them (MultitaskDecoderModel);
    # None: every row gets ``batch_prompts`` and plain greedy decoding.
    options: Any | None

    def batch_prompts(self, encoder_states: torch.Tensor) -> list[list[int]]: ...

    def decoder_hidden(self, input_ids: torch.Tensor, encoder_states: torch.Tensor, cache=None,
                       attention_mask: torch.Tensor | None = None, position_ids: torch.Tensor | None = None):
        """(hidden states [B, L, D], the grown cache)."""

    def logits(self, hidden: torch.Tensor) -> torch.Tensor: ...

    def text(self, token_ids: list[int]) -> str: ...

    def tokenize(self, text: str) -> list[int]: ...

    def static_step(self):
        """One token per row through the decoder's own layers over caller-owned K/V buffers
        (its family's static_step module), or None: greedy decoding keeps its eager loop."""


@runtime_checkable
class MultitaskDecoderModel(ARDecoderModel, Protocol):
    """An attention decoder whose prompt is Whisper's multitask format ("Robust Speech
    Recognition via Large-Scale Weak Supervision", §2.3): a language per row, detected or
    set, timestamp tokens and word times from its alignment heads, as ``options`` say. An
    ``ARDecoderModel`` whose ``options`` is not None is one (the ar kind's per-row path)."""

    options: Any                    # pipeline.models.whisper.prompting.WhisperOptions
    special: Any                    # its special tokens (WhisperTokens)
    tokenizer: Any                  # decode(ids) spells word pieces
    timestamp_rules: Any | None     # the timestamp tokens' logit rules; None without timestamps
    alignment_heads: list[tuple[int, int]]
    median_filter_width: int

    def language_prompts(self, encoder_states: torch.Tensor, languages=None): ...

    def detect_recordings(self, recordings: list[list[np.ndarray]]) -> list[tuple[str, float] | None]: ...


@runtime_checkable
class TransducerModel(EncoderModel, Protocol):
    """``transducer``: projected encoder frames, a predictor that carries its state and the
    joint of an RNN-T or TDT (pipeline.decoding.transducer's searches). A predictor state is
    a tuple of tensors whose rows are hypotheses.

    ``blank``: the blank's token id; ``vocab_size``: token outputs (blank included);
    ``durations``: a TDT's duration values (None for RNN-T); ``max_symbols``: the most
    tokens emitted at one frame (the one that reaches it moves on to the next frame)."""

    blank: int
    vocab_size: int
    durations: list[int] | None
    max_symbols: int
    frame_shift_s: float            # seconds per encoder frame (word times)
    tokenizer: Any                  # convert_ids_to_tokens(ids) -> pieces (word boundaries)

    def predictor_init(self, n: int): ...

    def predictor_step(self, tokens: torch.Tensor, state): ...

    def predictor_output(self, state) -> torch.Tensor: ...

    def select_state(self, state, index: torch.Tensor): ...

    def where_state(self, mask: torch.Tensor, new, old): ...

    def put_state(self, state, index: torch.Tensor, rows): ...

    def joint(self, frames: torch.Tensor, pred_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Token log-probs [..., V] and, for TDT, duration log-probs [..., D] (else None)."""

    def decode_text(self, ids) -> str: ...

    def vocabulary(self):
        """The non-blank tokens as phrase boosting and the LM spell text with them."""

    def drop_encoder(self) -> None:
        """Free the encoder where only the predictor and joint are needed (the beam pool)."""


# The Protocol of each capability an adapter can declare (BEAM_VOCABULARY is the family's).
PROTOCOLS: dict[str, type] = {CTC: CTCModel, ATTENTION_DECODER: ARDecoderModel, PACKABLE: PackableModel,
                              TRANSDUCER: TransducerModel}


def require(adapter, *needs: str, what: str = "this decoder") -> None:
    """Raise ValueError naming the first capability in ``needs`` that ``adapter`` lacks."""
    missing = [n for n in needs if n not in adapter.capabilities]
    if missing:
        raise ValueError(f"{what} needs a model with {missing[0]}; {type(adapter).__name__} "
                         f"offers {', '.join(sorted(adapter.capabilities)) or 'nothing'}")


def protocols_of(adapter, capabilities=None) -> list[type]:
    """The Protocols ``adapter`` must satisfy for ``capabilities`` (default: its own):
    EncoderModel, each capability's, and MultitaskDecoderModel where its options are set."""
    caps = adapter.capabilities if capabilities is None else capabilities
    out = [EncoderModel] + [PROTOCOLS[c] for c in sorted(caps) if c in PROTOCOLS]
    # the checker may meet an adapter without ``options``: ARDecoderModel's check names it
    if ARDecoderModel in out and getattr(adapter, "options", None) is not None:
        out.append(MultitaskDecoderModel)
    return out


def contract_problems(adapter, capabilities=None) -> list[str]:
    """What ``adapter`` lacks of the Protocols of ``capabilities`` (default: its own), each
    member checked once (``protocol_problems`` says what is checked); empty where it
    satisfies them all."""
    members: dict[str, tuple[type, Callable | None]] = {}
    for protocol in protocols_of(adapter, capabilities):
        for name, member in protocol_members(protocol).items():
            members.setdefault(name, member)
    return _member_problems(adapter, members)


def protocol_problems(adapter, protocol: type) -> list[str]:
    """What ``adapter`` lacks of ``protocol``: a member missing, an attribute that is a
    method or a method that is not one, or a method a caller of the Protocol cannot call
    as declared (``signature_problem``). ``isinstance`` with a runtime-checkable Protocol
    only sees that the names exist."""
    return _member_problems(adapter, protocol_members(protocol))


def protocol_members(protocol: type) -> dict[str, tuple[type, Callable | None]]:
    """Each member of ``protocol`` and its bases: the Protocol that declares it first (bases
    before their subclasses) and its declared function, or None for an attribute."""
    members: dict[str, tuple[type, Callable | None]] = {}
    for cls in reversed(protocol.__mro__):
        if cls in (object, Protocol, Generic):
            continue
        for name in vars(cls).get("__annotations__", {}):
            members.setdefault(name, (cls, None))
        for name, f in vars(cls).items():
            if inspect.isfunction(f) and not name.startswith("_"):
                members.setdefault(name, (cls, f))
    return members


def _member_problems(adapter, members: dict[str, tuple[type, Callable | None]]) -> list[str]:
    problems = []
    for name, (owner, declared) in members.items():
        where = f"{type(adapter).__name__}.{name} ({owner.__name__})"
        try:
            value = getattr(adapter, name)
        except AttributeError:
            problems.append(f"{where}: missing")
            continue
        if declared is None:
            if inspect.isroutine(value):
                problems.append(f"{where}: a method, declared an attribute")
        elif not inspect.isroutine(value):
            problems.append(f"{where}: not a method")
        else:
            problem = signature_problem(declared, value)
            if problem:
                problems.append(f"{where}: {problem}")
    return problems


def signature_problem(declared: Callable, actual: Callable) -> str | None:
    """Why a call that fits ``declared`` (a Protocol's function, ``self`` first) may not fit
    ``actual`` (the adapter's bound method or static function), or None: each declared
    parameter is taken under its name at its position, with a default where it has one, and
    any further parameter of ``actual`` has a default."""
    want = list(inspect.signature(declared).parameters.values())[1:]
    have = list(inspect.signature(actual).parameters.values())
    if any(p.kind == p.VAR_POSITIONAL for p in have) and any(p.kind == p.VAR_KEYWORD for p in have):
        return None
    named = [p for p in have if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    for i, w in enumerate(want):
        h = named[i] if i < len(named) else None
        if h is None or h.name != w.name or h.kind == h.KEYWORD_ONLY:
            return f"parameter {i + 1} is {h.name if h else 'missing'}, declared {w.name}"
        if w.default is not w.empty and h.default is h.empty:
            return f"{w.name} has no default"
    extra = [p.name for p in named[len(want):] if p.default is p.empty]
    return f"{', '.join(extra)} without a default" if extra else None
