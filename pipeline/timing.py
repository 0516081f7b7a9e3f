"""Wall-clock timing that is honest on a GPU: the device is synchronised before the clock
is read, so asynchronous CUDA kernels are counted where they run."""
from __future__ import annotations

import time


def synchronize(device=None) -> None:
    """Wait for ``device`` (a torch device, a tensor, or None for the current CUDA device
    when CUDA is in use); a no-op on CPU."""
    import torch

    if device is None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        return
    dev = device.device if isinstance(device, torch.Tensor) else torch.device(device)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def timed(fn, *args, device=None, **kwargs):
    """``fn(*args, **kwargs)`` and its seconds, ``device`` synchronised before and after."""
    synchronize(device)
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    synchronize(device)
    return out, time.perf_counter() - t0
