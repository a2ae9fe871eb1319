"""The host interpreter on cortex-m33 programs: every op the CPU backend emits runs, the cortex_m
ops run etforge's CMSIS-NN-exact kernels in both the ``model.pte`` interpreter and the Edge
runner, and a failure is one line naming the instruction and its op.

The kernels' bit-exactness against CMSIS-NN's C is ``tests/test_cortex_m_kernels.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from etforge.core.build import output
from etforge.core.build.report import build_report
from etforge.core.build.session import CompileResult, compile_model
from etforge.core.common.errors import EtforgeError
from etforge.core.registry.manager import registry
from etforge.plugins.targets import cortex_m_host
from etforge.runtime.execution.host import run_program
from etforge.runtime.execution.pte_interpreter import PteInterpreter

from support import run_cli


class _Fire(nn.Module):
    def __init__(self, cin: int, squeeze: int, expand: int) -> None:
        super().__init__()
        self.squeeze = nn.Conv2d(cin, squeeze, 1)
        self.e1 = nn.Conv2d(squeeze, expand, 1)
        self.e3 = nn.Conv2d(squeeze, expand, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.squeeze(x))
        return torch.cat([F.relu(self.e1(x)), F.relu(self.e3(x))], 1)


class SqueezeLike(nn.Module):
    """SqueezeNet's shape: ceil-mode max pools on maps over 127 values (a portable op on int8
    channels-last data, which torch's CPU kernel refuses), fire modules, a residual add and a
    global average pool (whose ties CMSIS-NN rounds half away from zero)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, stride=2)
        self.fire1 = _Fire(16, 8, 8)
        self.fire2 = _Fire(16, 8, 8)
        self.head = nn.Conv2d(16, 10, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.stem(x)), 3, 2, ceil_mode=True)
        x = self.fire1(x)
        x = F.max_pool2d(x + self.fire2(x), 3, 2, ceil_mode=True)
        return F.adaptive_avg_pool2d(F.relu(self.head(x)), 1).flatten(1)


def _data(seed: int, count: int) -> list[tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(1, 3, 48, 48, generator=g),) for _ in range(count)]


@pytest.fixture(scope="module")
def squeeze(tmp_path_factory: pytest.TempPathFactory) -> tuple[CompileResult, Path]:
    reg = registry()
    torch.manual_seed(0)
    calib = _data(1, 4)
    result = compile_model(SqueezeLike().eval(), calib[0], "cortex-m33", calibration=calib, reg=reg)
    d = tmp_path_factory.mktemp("squeeze")
    output.write_outputs(d, result, build_report(result, reg, "squeeze"))
    return result, d


def _interp(d: Path) -> PteInterpreter:
    return PteInterpreter((d / output.PTE).read_bytes(), str(d / output.PTE))


def test_ceil_mode_max_pool_program_runs_and_verifies(squeeze: tuple[CompileResult, Path]) -> None:
    result, d = squeeze
    interp = _interp(d)
    names = {s.name for s in interp.steps}
    assert "aten::max_pool2d_with_indices.out" in names
    assert {"cortex_m::quantized_avg_pool2d.out", "cortex_m::quantized_add.out"} <= names
    big = [interp.specs[i] for s in interp.steps if s.name.startswith("aten::max_pool") for i in s.args[:1]]
    assert all(spec.sizes[1] * spec.sizes[2] * spec.sizes[3] > 127 for spec in big)  # torch refuses these
    for (x,) in _data(7, 2):
        ours = interp.run((x,))
        edge = run_program(result.host_program, (x,))
        assert torch.equal(ours[0], edge[0])
    proc = run_cli("verify", str(d), "--samples", "4")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_cortex_m_ops_run_etforge_kernels(squeeze: tuple[CompileResult, Path]) -> None:
    """Every cortex_m op of the program resolves to etforge's kernel, not ExecuTorch's reference."""
    interp = _interp(squeeze[1])
    interp.run(_data(3, 1)[0])
    cortex = [k for k in interp.kernels if k.name.startswith("cortex_m::")]
    assert cortex and all(k.own is cortex_m_host.KERNELS[k.name.removesuffix(".out")] for k in cortex)


def test_a_failing_instruction_is_one_line_naming_it(squeeze: tuple[CompileResult, Path]) -> None:
    """A program whose average pool's kernel size no longer matches its planned output: the
    device kernel refuses it, the host names the instruction and op in one line."""
    interp = _interp(squeeze[1])
    step = next(s for s in interp.steps if s.name == "cortex_m::quantized_avg_pool2d.out")
    kernel_size = interp.initial[step.args[1]]  # an IntList: a reference to int values
    interp.initial[kernel_size.items[0]] = 1
    with pytest.raises(EtforgeError) as err:
        interp.run(_data(3, 1)[0])
    message = str(err.value)
    assert "\n" not in message
    assert f"instruction {step.index} (cortex_m::quantized_avg_pool2d.out) failed" in message
