"""Which attention kernel a transformers model is loaded with: scaled-dot-product attention
(``torch.nn.functional.scaled_dot_product_attention``, "sdpa"), which dispatches to the
FlashAttention kernel ("FlashAttention: Fast and Memory-Efficient Exact Attention with
IO-Awareness", Dao et al. 2022) or the memory-efficient one on CUDA where dtype, mask and
head size allow, and to its fused math kernel on CPU; "eager" (transformers' own matmul +
softmax) for an architecture that has no sdpa path.

transformers 5.x already picks sdpa when it is asked for nothing
(``PreTrainedModel.get_correct_attn_implementation``: ``"sdpa" if requested_attention is
None``, eager where the class cannot). The loaders name it anyway, so the choice does
not rest on that default; they ask per class because an explicit ``"sdpa"`` for a class
without it raises instead of falling back.
"""
from __future__ import annotations


def attention_implementation(model_class) -> str:
    """``"sdpa"`` where ``model_class`` supports it (the flag transformers' own check reads),
    else ``"eager"``."""
    return "sdpa" if getattr(model_class, "_supports_sdpa", False) else "eager"
