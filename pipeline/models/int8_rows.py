"""Int8 Linear layers with one activation scale per token, on torch's dynamic int8 kernels.

Token-wise dynamic quantisation of the activations ("ZeroQuant: Efficient and Affordable
Post-Training Quantization for Large-Scale Transformers", Yao et al. 2022, §4.1: each
token's row gets its own scale, computed at run time), with the weights' per-channel
int8 scales. torch's dynamic kernels (fbgemm/oneDNN, ``quantized::linear_dynamic``) take
one scale for the whole input: a row's result then depends on the other rows of the
call, so a clip's transcript depends on the clips batched with it, and SSD's
verification pass (every draft token in one call) disagrees with the AR loop (one token
a call) on near-ties.

Each row is divided by its largest magnitude, so every row spans [-1, 1], and one
anchor row holding +1 and -1 is appended: the call's range, and so its quantisation
parameters, are then the same for every input. Integer products are exact and every
other step is elementwise, so a row's output is a function of that row alone: bitwise
the same in any batch and in any call shape. The result is multiplied back by the row's
magnitude and the bias added in float32.
"""
from __future__ import annotations

import torch

# Rows whose magnitude is below this are treated as zero rows (no division by zero).
_TINY = 1e-12
# Rows a call of the int8 kernel takes: large enough for its GEMM to run at full speed,
# small enough that the scaled copy and the kernel's output stay in reused memory.
CHUNK_ROWS = 1024


class RowScaledInt8Linear(torch.nn.Module):
    """``inner``: a torch.ao dynamic int8 Linear without bias; ``bias``: the float one."""

    def __init__(self, inner: torch.nn.Module, bias: torch.Tensor | None):
        super().__init__()
        self.inner = inner
        self.in_features, self.out_features = inner.in_features, inner.out_features
        self.register_buffer("bias", None if bias is None else bias.detach().clone(), persistent=False)
        anchor = torch.zeros(inner.in_features)
        anchor[0], anchor[-1] = 1.0, -1.0
        self.register_buffer("anchor", anchor, persistent=False)

    @classmethod
    def from_float(cls, linear: torch.nn.Linear) -> "RowScaledInt8Linear":
        """The int8 twin of float32 ``linear`` (per-output-channel weight scales)."""
        bare = torch.nn.Linear(linear.in_features, linear.out_features, bias=False)
        bare.weight = linear.weight
        return cls(_dynamic_int8(bare), linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        rows = x.reshape(-1, shape[-1])
        if rows.dtype != torch.float32:
            rows = rows.float()
        n = rows.shape[0]
        # (amax and amin: torch's vectorised reductions; abs().amax() and the inf-norm run
        # at a tenth of their speed here, as does addcmul.)
        scale = torch.maximum(rows.amax(dim=1, keepdim=True), rows.amin(dim=1, keepdim=True).neg_()).clamp_min_(_TINY)
        out = torch.empty(n, self.out_features, dtype=torch.float32, device=rows.device)
        if n == 0:
            return out.reshape(*shape[:-1], self.out_features).to(x.dtype)
        # Rows go through in chunks, each with the anchor: the quantisation parameters are
        # the anchor's whatever the chunk, so chunking changes no result, and a chunk's
        # scaled copy is small enough for the allocator to reuse (a fresh copy of a whole
        # encoder batch costs more in page faults than the division itself).
        step = min(n, CHUNK_ROWS)
        scaled = torch.empty(step + 1, rows.shape[1], dtype=torch.float32, device=rows.device)
        scaled[step] = self.anchor
        for start in range(0, n, step):
            stop = min(n, start + step)
            size = stop - start
            torch.div(rows[start:stop], scale[start:stop], out=scaled[:size])
            if size < step:
                scaled[size] = self.anchor
            out[start:stop] = self.inner(scaled[:size + 1])[:size]
        out.mul_(scale)
        if self.bias is not None:
            out.add_(self.bias)
        return out.reshape(*shape[:-1], self.out_features).to(x.dtype)


def _dynamic_int8(linear: torch.nn.Linear) -> torch.nn.Module:
    """torch's dynamic int8 twin of ``linear`` (per-output-channel weight scales)."""
    import warnings

    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    with warnings.catch_warnings():
        # torch.ao's eager quantisation announces its move to torchao; it still works.
        warnings.simplefilter("ignore")
        return quantize_dynamic(torch.nn.Sequential(linear), {"0": per_channel_dynamic_qconfig})[0]


def quantize_rows(module: torch.nn.Module, skip: tuple[str, ...] = ()) -> int:
    """Replace, in place, every ``torch.nn.Linear`` under ``module`` whose attribute name is
    not in ``skip`` by its :class:`RowScaledInt8Linear`; returns how many."""
    done = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.Linear and name not in skip:
                setattr(parent, name, RowScaledInt8Linear.from_float(child))
                done += 1
    return done
