"""Device resolution (``device = ...``) and the precision that follows it, on this machine's
torch (a CPU build in CI, so the GPU branches are checked through their errors)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from osmosis_ai.errors import ConfigError
from osmosis_ai.gateway.policies.torch_device import (
    cpu_has_native_bf16,
    resolve_device,
    update_in_bf16,
)

GPU = torch.cuda.is_available()


def test_auto_is_cuda_when_torch_sees_a_gpu_else_the_cpu() -> None:
    assert resolve_device("auto") == torch.device("cuda:0" if GPU else "cpu")
    assert resolve_device("cpu") == torch.device("cpu")


@pytest.mark.parametrize("setting", ["cuda", "cuda:0", "cuda:3"])
def test_a_gpu_that_is_not_there_is_named_with_what_torch_sees(setting: str) -> None:
    if GPU:  # on a GPU machine: one more device than it has
        setting = f"cuda:{torch.cuda.device_count()}"
    with pytest.raises(ConfigError) as error:
        resolve_device(setting, key="[training] device")
    message = str(error.value)
    assert message.startswith(f'[training] device = "{setting}" but torch sees ')
    if torch.version.cuda is None:  # a CPU build, as in CI
        assert message == (
            f'[training] device = "{setting}" but torch sees no GPU '
            f"(torch {torch.__version__} is a CPU build)"
        )


def test_mps_without_apple_silicon_and_unknown_devices_are_refused() -> None:
    if not torch.backends.mps.is_available():
        with pytest.raises(ConfigError, match='device = "mps" but torch sees no MPS device'):
            resolve_device("mps")
    for bad in ("gpu", "cuda:", "cuda:x", "CPU", ""):
        with pytest.raises(ConfigError, match="is not a device; use"):
            resolve_device(bad)


def test_the_update_runs_in_bf16_where_the_device_computes_it(tmp_path: Path) -> None:
    cpu = torch.device("cpu")
    assert update_in_bf16(cpu, "auto") is cpu_has_native_bf16()
    assert update_in_bf16(cpu, "fp32") is False
    assert update_in_bf16(torch.device("mps"), "auto") is False  # no bf16 autocast by default
    native, emulated, unknown = (tmp_path / name for name in ("native", "emulated", "unknown"))
    native.write_text("processor: 0\nflags\t: fpu avx2 avx512f amx_bf16\n")
    emulated.write_text("processor: 0\nflags\t: fpu avx2\n")
    unknown.write_text("processor: 0\nFeatures\t: fp asimd bf16\n")  # aarch64: not read
    assert update_in_bf16(cpu, "bf16", cpuinfo=native) is True
    assert update_in_bf16(cpu, "auto", cpuinfo=native) is True
    assert update_in_bf16(cpu, "auto", cpuinfo=emulated) is False
    # Asked for where the flags say it is emulated: refused with the setting to use.
    with pytest.raises(ConfigError) as refused:
        update_in_bf16(cpu, "bf16", key="training.precision", cpuinfo=emulated)
    assert str(refused.value).startswith(
        'training.precision = "bf16" but this CPU does not compute bf16'
    )
    assert str(refused.value).endswith('use "fp32" or "auto"')
    # Where the flags are not read, an explicit "bf16" is taken as asked.
    assert update_in_bf16(cpu, "bf16", cpuinfo=unknown) is True
    assert update_in_bf16(cpu, "auto", cpuinfo=unknown) is False


def test_native_bf16_is_read_from_the_cpu_flags(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor: 0\nflags\t: fpu sse avx512f\n")
    assert not cpu_has_native_bf16(cpuinfo)  # AVX512 without bf16: emulated, slower
    cpuinfo.write_text("processor: 0\nflags\t: fpu avx512f avx512_bf16 amx_bf16\n")
    assert cpu_has_native_bf16(cpuinfo)
    assert not cpu_has_native_bf16(tmp_path / "missing")
