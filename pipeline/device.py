"""Device and dtype names of the config, resolved for torch, whether this CPU computes
in bfloat16 natively (AMX or AVX512-BF16) rather than emulating it in float32, how many
CPU threads a stage's torch ops use, and which failures leave the device unusable."""
from __future__ import annotations

import os
from contextlib import contextmanager


# CUDA errors after which the process's context is unusable: every later call on the device
# fails the same way, whatever its input. Out of memory is not one of them: a smaller batch
# succeeds, which is what the segment runner's halving tries.
STICKY_DEVICE_ERRORS = ("device-side assert triggered", "illegal memory access", "unspecified launch failure",
                        "misaligned address", "illegal instruction", "uncorrectable ECC error")


class DeviceFault(RuntimeError):
    """The accelerator failed for good in this process. Isolating the failing segment by
    halving its batch would turn every recording after it into an error row, so the job
    stops instead; the rows committed before it stay, and a rerun resumes after them."""


def is_device_fault(exc: BaseException) -> bool:
    """Whether ``exc`` is a CUDA error that poisons the context (torch raises
    ``torch.AcceleratorError`` for those; older builds a RuntimeError naming the error)."""
    text = str(exc)
    if "out of memory" in text.lower():
        return False
    import torch

    accelerator_error = getattr(torch, "AcceleratorError", ())
    return (bool(accelerator_error) and isinstance(exc, accelerator_error)) or \
        any(m in text for m in STICKY_DEVICE_ERRORS)


def device_fault(exc: BaseException, where: str) -> DeviceFault:
    """The job-stopping error for ``exc``, raised ``from`` it by the caller."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
    return DeviceFault(f"the device failed {where} ({type(exc).__name__}: {first}); nothing more can run on it in "
                       "this process, so the job stops here: the rows committed so far stay, and the same command "
                       "resumes after them")


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


def encoder_dtype_name(encoder_dtype: str | None, device: str, dtype: str) -> str | None:
    """model.encoder_dtype resolved on this machine: "auto" is bfloat16 on a CPU with
    native bfloat16 under a float32 model, else None (the model's dtype)."""
    if encoder_dtype != "auto":
        return encoder_dtype
    native = resolve_device(device) == "cpu" and dtype == "float32" and cpu_bf16_native()
    return "bfloat16" if native else None


def cross_kv_dtype_name(cross_kv_dtype: str | None, encoder: str | None, dtype: str,
                        quantize: str = "none") -> str | None:
    """model.cross_kv_dtype resolved: "auto" follows the encoder's resolved dtype
    (``encoder``, None: the model's) unless the model's Linear layers are quantised (the
    projections are int8 then); None where the projection keeps the model's own."""
    if cross_kv_dtype == "auto":
        cross_kv_dtype = encoder if quantize == "none" else None
    return None if cross_kv_dtype in (None, dtype) else cross_kv_dtype


def check_dtype(device: str, name: str, key: str) -> None:
    """Raise ValueError (naming ``key``) for bfloat16 on a CPU without native support, where
    torch would run it emulated, slower than float32."""
    if name == "bfloat16" and resolve_device(device) == "cpu" and not cpu_bf16_native():
        raise ValueError(f"{key}=bfloat16: this CPU has neither AMX nor AVX512-BF16; use float32")


def worker_threads(configured: int = 0) -> int:
    """Intra-op threads for a model stage: ``configured`` (model.num_threads) when > 0, else
    OMP_NUM_THREADS (Ray sets it to an actor's CPU share; a user may set it), else the
    physical cores this process may run on."""
    if configured > 0:
        return configured
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    return physical_cores()


def physical_cores() -> int:
    """The physical cores this process may run on."""
    try:
        cpus = os.sched_getaffinity(0)
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
    return _physical_cores(cpus)


def _physical_cores(cpus: set[int]) -> int:
    """Cores among logical CPUs ``cpus`` (hyperthreads of one core count once, as torch's
    own default does); the CPU count where the kernel does not say."""
    cores = set()
    for cpu in cpus:
        try:
            with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list") as fh:
                cores.add(fh.read().strip())
        except OSError:
            return len(cpus)
    return max(1, len(cores))


@contextmanager
def torch_threads(n: int | None = None):
    """Run the block with torch's intra-op thread count at ``n`` (None: as it is now), and
    put back the count found on entry afterwards. torch's count is process-wide: stages
    that share a process (the in-process runner) would otherwise inherit each other's, and
    importing silero-vad sets it to 1 for the whole process."""
    import torch

    before = torch.get_num_threads()
    if n is not None and n != before:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)
