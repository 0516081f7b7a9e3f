"""Device and dtype names of the config, resolved for torch, and whether this CPU computes
in bfloat16 natively (AMX or AVX512-BF16) rather than emulating it in float32."""
from __future__ import annotations


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def torch_dtype(name: str):
    import torch

    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[name]


def cpu_bf16_native() -> bool:
    """True where the CPU has AMX or AVX512-BF16 (read from /proc/cpuinfo's flags, else
    from torch's dispatch level: ``avx512_bf16`` / ``amx``)."""
    import torch

    try:
        with open("/proc/cpuinfo") as fh:
            flags = next((line.split(":", 1)[1].split() for line in fh if line.startswith("flags")), [])
    except OSError:
        flags = []
    if flags:
        return "avx512_bf16" in flags or "amx_bf16" in flags
    return any(t in torch.backends.cpu.get_cpu_capability().lower() for t in ("amx", "bf16"))


def check_dtype(device: str, name: str, key: str) -> None:
    """Raise ValueError (naming ``key``) for bfloat16 on a CPU without native support, where
    torch would run it emulated, slower than float32."""
    if name == "bfloat16" and resolve_device(device) == "cpu" and not cpu_bf16_native():
        raise ValueError(f"{key}=bfloat16: this CPU has neither AMX nor AVX512-BF16; use float32")
