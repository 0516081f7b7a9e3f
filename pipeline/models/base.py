"""What every model family gives the decoders: shared batch types and declared capabilities.

A family's adapter turns audio into encoder states and, depending on what the model has,
offers a CTC output (``ctc_draft``), an attention decoder (``decoder_hidden``/``logits``
with prompts and suppress masks) and packed encoder windows (``encode_packed``). It says
which of these it has in ``capabilities``: decoders and config validation read that
declaration instead of probing for methods. It also prices a segment in the batch budget
(``segment_cost``), so generic code knows no model's window or frame rate.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the batch types hold tensors; declaring capabilities must not import torch
    import torch

# Capability names, as decoder kinds list them in ``needs``.
CTC = "ctc"                        # ctc_draft: greedy CTC draft + frame entropies
ATTENTION_DECODER = "attention_decoder"  # decoder_hidden / logits / batch_prompts / text / tokenize
PACKABLE = "packable"              # encode_packed / plan_packing: several clips per encoder window
# The family can name its CTC output's vocabulary (blank, LM token ids, text rule:
# pipeline.text.ctc_vocabulary) from the model config alone, without loading the model:
# the CTC beam search's pool has no model but spells LM tokens and phrases and decodes text.
BEAM_VOCABULARY = "beam_vocabulary"
# Encoder frames, a predictor step and the joint of a transducer (RNN-T / TDT):
# pipeline.decoding.transducer.TransducerModel.
TRANSDUCER = "transducer"


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


def require(adapter, *needs: str, what: str = "this decoder") -> None:
    """Raise ValueError naming the first capability in ``needs`` that ``adapter`` lacks."""
    missing = [n for n in needs if n not in adapter.capabilities]
    if missing:
        raise ValueError(f"{what} needs a model with {missing[0]}; {type(adapter).__name__} "
                         f"offers {', '.join(sorted(adapter.capabilities)) or 'nothing'}")
