"""Where torch runs, resolved once: the ``device`` setting, and the precision that follows it.

The trainer's learner and the torch engine both take a `torch.device` from `resolve_device`
and thread it through; nothing else names a device.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from osmosis_ai._extras import import_optional
from osmosis_ai.errors import ConfigError

__all__ = [
    "DEVICE_SETTING",
    "Precision",
    "cpu_has_native_bf16",
    "free_memory_bytes",
    "is_out_of_memory",
    "resolve_device",
    "update_in_bf16",
]

#: What a ``device`` setting may say.
DEVICE_SETTING = re.compile(r"auto|cpu|mps|cuda(:\d+)?")
Precision = Literal["auto", "bf16", "fp32"]
#: What torch says when an allocation fails: the CPU allocator raises RuntimeError, CUDA and
#: MPS raise torch.OutOfMemoryError (a RuntimeError too).
_OOM_MESSAGES = (
    "DefaultCPUAllocator: can't allocate memory",
    "not enough memory",
    "CUDA out of memory",
    "MPS backend out of memory",
)


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is an allocation failure, on any device."""
    if isinstance(exc, MemoryError):
        return True
    return isinstance(exc, RuntimeError) and (
        type(exc).__name__ == "OutOfMemoryError" or any(m in str(exc) for m in _OOM_MESSAGES)
    )


def free_memory_bytes(device: Any, meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """Memory ``device`` could still allocate: the GPU's free memory, MPS's recommended
    working set less what it holds, or the machine's available memory for the CPU (Linux's
    ``MemAvailable``); ``None`` when it cannot be told."""
    import torch

    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type == "mps":
        return int(torch.mps.recommended_max_memory() - torch.mps.driver_allocated_memory())
    return available_memory_bytes(meminfo)


def available_memory_bytes(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """The machine's memory available without swapping (Linux's ``MemAvailable``); ``None``
    when it cannot be told."""
    try:
        lines = meminfo.read_text(encoding="ascii").splitlines()
    except OSError:
        return None
    for line in lines:
        name, _, value = line.partition(":")
        if name == "MemAvailable" and value.split():
            return int(value.split()[0]) * 1024  # kB
    return None


def resolve_device(setting: str, *, key: str = "device", feature: str = "A torch device") -> Any:
    """The `torch.device` ``setting`` names: ``auto`` (CUDA when torch sees a GPU, else the
    CPU), ``cpu``, ``cuda``, ``cuda:N`` or ``mps``.

    Raises:
        ConfigError: The setting is not one of those, or names a device torch does not see;
            the message names ``key`` and what torch sees.
        MissingExtraError: torch is not installed (the message names ``feature``).
    """
    torch = import_optional("torch", extra="train", feature=feature)

    if not DEVICE_SETTING.fullmatch(setting):
        raise ConfigError(
            f'{key} = "{setting}" is not a device; use "auto", "cpu", "cuda", "cuda:N" or "mps"'
        )
    if setting == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    if setting == "cpu":
        return torch.device("cpu")
    if setting == "mps":
        if not torch.backends.mps.is_available():
            raise ConfigError(
                f'{key} = "mps" but torch sees no MPS device (it needs Apple silicon and a '
                f"torch build with MPS; this is torch {torch.__version__})"
            )
        return torch.device("mps")
    if not torch.cuda.is_available():
        build = (
            f"torch {torch.__version__} is a CPU build"
            if torch.version.cuda is None
            else f"torch {torch.__version__} is built for CUDA {torch.version.cuda}; check the "
            "driver and CUDA_VISIBLE_DEVICES"
        )
        raise ConfigError(f'{key} = "{setting}" but torch sees no GPU ({build})')
    index = int(setting.partition(":")[2] or 0)
    count = torch.cuda.device_count()
    if index >= count:
        raise ConfigError(
            f'{key} = "{setting}" but torch sees {count} GPU{"s" if count > 1 else ""} '
            f"(cuda:0 to cuda:{count - 1})"
        )
    return torch.device(f"cuda:{index}")


#: Where Linux lists the CPU's flags.
CPUINFO = Path("/proc/cpuinfo")
#: Flags of x86 CPUs that compute bf16 natively.
_NATIVE_BF16 = frozenset({"avx512_bf16", "amx_bf16"})


def update_in_bf16(
    device: Any, precision: Precision, *, key: str = "precision", cpuinfo: Path = CPUINFO
) -> bool:
    """Whether the update's forward pass runs under bf16 autocast on ``device``.

    ``auto``: on CUDA when the GPU computes bf16 (compute capability 8.0+), on the CPU when
    it computes bf16 natively (AVX512-BF16 or AMX), never on MPS. The weights stay fp32.

    Raises:
        ConfigError: ``bf16`` on a GPU without bf16, or on an x86 CPU whose flags
            (``cpuinfo``) show no native bf16: emulated, step 1's update of the 135M model
            took 392 s on a 2-core AVX2 machine.
    """
    if precision == "fp32":
        return False
    if device.type == "cuda":
        import torch

        # Not torch.cuda.is_bf16_supported(): it counts emulated bf16 (slow on V100, T4)
        # and asks about the current GPU rather than this one.
        supported = torch.cuda.get_device_capability(device)[0] >= 8
        if precision == "bf16" and not supported:
            raise ConfigError(
                f'{key} = "bf16" but {device} does not compute bf16 (it needs compute '
                'capability 8.0 or newer); use "fp32" or "auto"'
            )
        return supported
    flags = _cpu_flags(cpuinfo) if device.type == "cpu" else None
    if flags is None:  # MPS, or a CPU whose flags are not read here: as asked
        return precision == "bf16"
    if flags & _NATIVE_BF16:
        return True
    if precision == "bf16":
        raise ConfigError(
            f'{key} = "bf16" but this CPU does not compute bf16 (it needs AVX512-BF16 or '
            'AMX; emulated, an update takes minutes instead of seconds); use "fp32" or "auto"'
        )
    return False


def cpu_has_native_bf16(cpuinfo: Path = CPUINFO) -> bool:
    """Whether this CPU computes bf16 natively (AVX512-BF16 or AMX; Linux only).

    Elsewhere bf16 is emulated, slower than fp32, so the trainer stays in fp32.
    """
    return bool((_cpu_flags(cpuinfo) or set()) & _NATIVE_BF16)


def _cpu_flags(cpuinfo: Path) -> set[str] | None:
    """The x86 CPU flags ``cpuinfo`` lists, or ``None`` where it lists none (not Linux, or
    another architecture, whose bf16 support is not read here)."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    lines = [line for line in text.splitlines() if line.startswith("flags")]
    return {word for line in lines for word in line.split()} if lines else None
