"""Device and dtype names of the config, resolved for torch where the model runs, whether
this CPU computes in bfloat16 natively (AMX or AVX512-BF16) rather than emulating it in
float32, TF32 on CUDA, how many CPU threads a stage's torch ops use, and which failures
leave the device unusable.

``model.device`` and ``model.dtype`` default to ``auto``, resolved by :func:`load_target` in
the process that loads the model (a Ray worker on a GPU node; the driver may have none)."""
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


def is_cuda(device: str) -> bool:
    """Whether a resolved device name (``cuda``, ``cuda:N``) is a CUDA device."""
    return device == "cuda" or device.startswith("cuda:")


def cuda_bf16_native(device: str) -> bool:
    """Whether CUDA device ``device`` computes in bfloat16 in hardware (compute capability 8.0
    and later: Ampere, Hopper, ...). torch's own default also answers True where bfloat16
    is only emulated, which is slower than float32 there, so emulation does not count."""
    import torch

    if not torch.cuda.is_available():
        return False
    index = torch.device(device).index

    def native() -> bool:
        try:
            return bool(torch.cuda.is_bf16_supported(including_emulation=False))
        except TypeError:   # a torch before the argument: its answer did not count emulation
            return bool(torch.cuda.is_bf16_supported())

    if index is None:
        return native()
    with torch.cuda.device(index):
        return native()


def resolve_dtype_name(name: str, device: str, bf16_ok: bool = True) -> str:
    """model.dtype resolved for a model on ``device`` (``auto`` allowed): ``auto`` is
    bfloat16 on a CUDA device with native bfloat16 for a model that runs in it
    (``bf16_ok``), float32 everywhere else. A CUDA device without native bfloat16 (Turing,
    Volta) gets float32 rather than float16: float16's range overflows in checkpoints
    trained in bfloat16 or float32, and float32 gives what a CPU job's transcripts are
    measured in; ``model.dtype=float16`` asks for it. Any other name is returned as is."""
    if name != "auto":
        return name
    device = resolve_device(device)
    return "bfloat16" if is_cuda(device) and bf16_ok and cuda_bf16_native(device) else "float32"


def hashed_dtype_name(name: str) -> str:
    """model.dtype as config_hash sees it: ``auto`` as float32, which it was by default
    before ``auto`` existed and still is on the CPU. What auto picks depends on the device
    the model runs on, and ``model.device`` is no part of the hash either; so folders
    written under the old default resume under the new one. An explicit dtype is hashed as
    set."""
    return "float32" if name == "auto" else name


def runs_bf16(model_config) -> bool:
    """Whether ``model_config``'s checkpoint runs in bfloat16 under model.dtype=auto: yes,
    unless its family's options say otherwise (``runs_bf16(model_config)`` on the options
    dataclass: the shipped Whisper models, whose decoder flips words in bfloat16)."""
    check = getattr(model_config.options, "runs_bf16", None)
    return True if check is None else bool(check(model_config))


def enable_tf32(device: str) -> bool:
    """Let float32 matrix products and convolutions on CUDA run in TF32 (10-bit mantissa on
    tensor cores, several times float32's throughput on Ampere and later) when ``device``
    resolves to CUDA; True when it did. Set through the flags that both of torch's APIs read
    back (the newer ``fp32_precision`` reports "tf32" after them); process-wide, and only a
    CUDA model's process sets them. A CPU's products are untouched."""
    import torch

    if not is_cuda(resolve_device(device)):
        return False
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    return True


def load_target(model_config):
    """(device, torch dtype) that ``model_config``'s model loads on, resolved in the calling
    process, which is the one that loads it: model.device and model.dtype (``auto``: see
    :func:`resolve_device`, :func:`resolve_dtype_name`), with TF32 on for a CUDA device."""
    device = resolve_device(model_config.device)
    name = resolve_dtype_name(model_config.dtype, device, runs_bf16(model_config))
    enable_tf32(device)
    return device, torch_dtype(name)


def cuda_memory(device: str) -> tuple[int, int]:
    """(free bytes on CUDA device ``device``, bytes this process's tensors hold there)."""
    import torch

    free, _total = torch.cuda.mem_get_info(torch.device(device))
    return int(free), int(torch.cuda.memory_allocated(torch.device(device)))


# oneDNN's ISA names (ONEDNN_MAX_CPU_ISA / DNNL_MAX_CPU_ISA) at or above its first with
# bfloat16 products (AVX512_CORE_BF16); a cap below them makes torch's bfloat16 products
# run emulated, as on a CPU without the flags.
_ONEDNN_BF16_ISAS = ("ALL", "AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX512_CORE_AMX", "AVX10")


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as fh:
            return frozenset(next((line.split(":", 1)[1].split() for line in fh if line.startswith("flags")), []))
    except OSError:
        return frozenset()


def cpu_bf16_native(flags: frozenset[str] | None = None, capability: str | None = None,
                    environ: dict | None = None) -> bool:
    """True where this process computes bfloat16 products natively: the CPU has AMX or
    AVX512-BF16 (``flags``, default /proc/cpuinfo's; without them torch's dispatch level
    ``capability``, default torch.backends.cpu.get_cpu_capability()), and neither torch
    (ATEN_CPU_CAPABILITY below avx512, which ``capability`` reflects) nor oneDNN
    (ONEDNN_MAX_CPU_ISA / DNNL_MAX_CPU_ISA below AVX512_CORE_BF16, in ``environ``) is capped
    under them. Capping them is how a CPU with the flags runs the path of one without."""
    import torch

    env = os.environ if environ is None else environ
    if capability is None:
        capability = torch.backends.cpu.get_cpu_capability()
    capability = capability.lower()
    if capability in ("default", "avx2") or capability.startswith(("vsx", "zvector", "sve", "neon")):
        return False
    isa = (env.get("ONEDNN_MAX_CPU_ISA") or env.get("DNNL_MAX_CPU_ISA") or "").upper()
    if isa and not isa.startswith(_ONEDNN_BF16_ISAS):
        return False
    flags = cpu_flags() if flags is None else flags
    if flags:
        return "avx512_bf16" in flags or "amx_bf16" in flags
    return any(t in capability for t in ("amx", "bf16"))


def encoder_dtype_name(encoder_dtype: str | None, device: str, dtype: str) -> str | None:
    """model.encoder_dtype resolved on this machine: "auto" is bfloat16 on a CPU with
    native bfloat16 under a float32 model (model.dtype float32, or auto, which is float32
    on a CPU), else None (the model's dtype)."""
    if encoder_dtype != "auto":
        return encoder_dtype
    native = resolve_device(device) == "cpu" and dtype in ("float32", "auto") and cpu_bf16_native()
    return "bfloat16" if native else None


def quantize_name(quantize: str, device: str) -> str:
    """model.quantize resolved on this machine: ``auto`` is int8 on a CPU without native
    bfloat16 where torch has an int8 engine (fbgemm/x86 or oneDNN), else none; ``none``
    and ``int8`` are returned as set."""
    if quantize != "auto":
        return quantize
    import torch

    engines = set(torch.backends.quantized.supported_engines) & {"x86", "fbgemm", "onednn"}
    return "int8" if resolve_device(device) == "cpu" and engines and not cpu_bf16_native() else "none"


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
