"""Run CPU kernels in the firmware under QEMU and compare them with the host interpreter.

The dim-order rules in ``plugins/targets/dim_orders.py`` were written one kernel at a time
from reading ExecuTorch's C; this harness checks them on the device. A *batch* is one program
whose forward applies many cases (one operator call each, on shared inputs: contiguous and
channels-last 4-D tensors of odd sizes, broadcasting operands, 0-d and one-element tensors)
and returns every result, so one image and one QEMU run cover dozens of kernels. The program
is made the way etforge makes a Cortex-M program's CPU part: ``to_edge``, then
``dim_orders.align`` (the rewrite that gives each kernel the dim orders it accepts), then
``to_executorch`` with etforge's memory planning, and etforge's generated registration. Each
output is compared with the host interpreter's value for the same ``.pte``: bit for bit, or
within ``FLOAT_ULPS`` for the float operators in ``LIBM`` (newlib's libm on the device,
torch's vectorised math on the host: both correctly rounded to within a few ulp, neither
exact).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from etforge.core.common.errors import EtforgeError

#: Largest difference allowed between device and host for an operator in ``LIBM`` (their
#: transcendental functions come from different libraries), in units in the last place of the
#: output's largest magnitude.
FLOAT_ULPS = 4
#: Case-name prefixes whose float results come from a math library (``FLOAT_ULPS`` applies).
LIBM = (
    "exp",
    "log",
    "tanh",
    "sigmoid",
    "gelu",
    "softmax",
    "log_softmax",
    "erf",
    "pow",
    "elu",
    "silu",
)
#: Case-name prefixes of float accumulations (sums, means, norms): the device adds in its
#: kernel's order, torch in blocks; ``FLOAT_ULPS`` applies.
ACCUMULATE = (
    "mean",
    "sum",
    "var",
    "layer_norm",
    "cumsum",
    "group_norm",
    "batch_norm",
    "conv",
    "linear",
    "mm",
    "bmm",
    "avg_pool",
    "adaptive_avg",
    "upsample_bilinear",
)


@dataclass(frozen=True)
class Case:
    """One operator call: ``fn`` applied to the batch inputs named in ``args``."""

    name: str
    fn: Callable[..., torch.Tensor]
    args: tuple[str, ...]


@dataclass
class Outcome:
    case: str
    ok: bool
    detail: str = ""


@dataclass
class BatchResult:
    outcomes: list[Outcome] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  #: what ``dim_orders.align`` changed
    operators: list[str] = field(default_factory=list)  #: the kernels the program calls
    instructions: int = 0

    @property
    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.ok]


class _Batch(torch.nn.Module):
    def __init__(self, cases: Sequence[Case], names: Sequence[str]) -> None:
        super().__init__()
        self.cases = list(cases)
        self.names = list(names)

    def forward(self, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        by = dict(zip(self.names, xs, strict=True))
        return tuple(c.fn(*(by[a] for a in c.args)) for c in self.cases)


def build_program(cases: Sequence[Case], inputs: dict[str, torch.Tensor], out: Path) -> list[str]:
    """``out/model.pte`` and ``out/codegen`` for the batch; returns align's notes."""
    import executorch.kernels.quantized  # noqa: F401  (out variants of quantized_decomposed ops)
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge

    from etforge.codegen.generate import generate
    from etforge.core.serialize.memory_plan import planning_pass
    from etforge.plugins.targets.dim_orders import align

    names = sorted({a for c in cases for a in c.args}, key=list(inputs).index)
    example = tuple(inputs[n] for n in names)
    exported = torch.export.export(_Batch(cases, names).eval(), example, strict=False)
    edge = to_edge(exported, compile_config=EdgeCompileConfig(_check_ir_validity=False))
    notes = align(edge.exported_program())
    program = edge.to_executorch(ExecutorchBackendConfig(memory_planning_pass=planning_pass()))
    out.mkdir(parents=True, exist_ok=True)
    (out / "model.pte").write_bytes(program.buffer)
    generate(out / "model.pte", out / "codegen")
    (out / "inputs.json").write_text(json.dumps(names))
    return notes


def _span_ulps(host: torch.Tensor, dev: torch.Tensor) -> float:
    """Largest |device - host| in ulps of the host output's largest magnitude (NaN equals NaN;
    a per-value ulp would call any difference near zero huge)."""
    both_nan = torch.isnan(host) & torch.isnan(dev)
    diff = (dev.double() - host.double()).abs().masked_fill(both_nan, 0.0)
    top = float(host.abs().masked_fill(torch.isnan(host), 0).max()) if host.numel() else 0.0
    ulp = float(torch.finfo(torch.float32).eps) * max(top, float(torch.finfo(torch.float32).tiny))
    return float(diff.max()) / ulp if diff.numel() else 0.0


def compare(name: str, host: torch.Tensor, dev: torch.Tensor) -> Outcome:
    """Device vs host for one case: bit for bit, or ``FLOAT_ULPS`` for a ``LIBM`` case."""
    if host.dtype != dev.dtype or tuple(host.shape) != tuple(dev.shape):
        return Outcome(
            name, False, f"device {dev.dtype}{list(dev.shape)}, host {host.dtype}{list(host.shape)}"
        )
    h, d = host.contiguous().reshape(-1), dev.contiguous().reshape(-1)
    same = h.numpy().tobytes() == d.numpy().tobytes()
    if same:
        return Outcome(name, True)
    if h.dtype == torch.float32 and name.startswith(LIBM + ACCUMULATE):
        u = _span_ulps(h, d)
        if u <= FLOAT_ULPS:
            return Outcome(name, True, f"{u:.2f} ulp of the largest value")
        return Outcome(name, False, f"{u:.1f} ulps of the largest value apart (> FLOAT_ULPS={FLOAT_ULPS})")
    off = int((h != d).sum()) if h.dtype != torch.bool else int((h ^ d).sum())
    return Outcome(name, False, f"{off} of {h.numel()} values differ")


def run_batch(
    cases: Sequence[Case], inputs: dict[str, torch.Tensor], work: Path, samples: int = 1, seed: int = 0
) -> BatchResult:
    """Build, run on QEMU and compare one batch (inputs re-drawn per sample from ``seed``,
    keeping each input's shape, dtype and memory format)."""
    from etforge.runtime.execution.pte_interpreter import PteInterpreter
    from etforge.runtime.firmware import device

    key = hashlib.sha256(repr([c.name for c in cases]).encode()).hexdigest()[:12]
    out = work / f"batch-{key}"
    notes = build_program(cases, inputs, out)
    interp = PteInterpreter((out / "model.pte").read_bytes(), str(out / "model.pte"))
    names = json.loads((out / "inputs.json").read_text())
    batches = [
        tuple(_redraw(inputs[n], seed * 1000 + s * 100 + k) for k, n in enumerate(names))
        for s in range(samples)
    ]
    dev = device.run_program(out, interp, batches)
    result = BatchResult(notes=notes, operators=sorted({str(o.name) for o in interp.plan.operators}))
    result.instructions = dev.qemu.instructions[0] if dev.qemu.instructions else 0
    for batch, device_outs in zip(batches, dev.outputs, strict=True):
        host_outs = interp.run(list(batch))
        if len(host_outs) != len(cases):
            raise EtforgeError(f"{out}: {len(host_outs)} outputs for {len(cases)} cases")
        for case, h, d in zip(cases, host_outs, device_outs, strict=True):
            result.outcomes.append(compare(case.name, h, d))
    return result


def _redraw(like: torch.Tensor, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if like.dtype.is_floating_point:
        t = torch.randn(like.shape, generator=g).to(like.dtype)
    elif like.dtype == torch.bool:
        t = torch.randint(0, 2, like.shape, generator=g).bool()
    else:
        info = torch.iinfo(like.dtype)
        t = torch.randint(max(info.min, -128), min(info.max, 127) + 1, like.shape, generator=g).to(like.dtype)
    if like.dim() == 4 and like.is_contiguous(memory_format=torch.channels_last) and not like.is_contiguous():
        t = t.contiguous(memory_format=torch.channels_last)
    return t


def missing() -> str | None:
    """Why the device runs cannot happen here (tools, QEMU, sources), else None."""
    import shutil

    from etforge.runtime.firmware import build, sources

    tools = build.missing_tools() + [t for t in ("qemu-system-arm",) if shutil.which(t) is None]
    if tools:
        return f"firmware tools not installed: {', '.join(tools)} (.ci/setup installs them)"
    try:
        sources.locate()
    except EtforgeError as e:
        return str(e)
    return None
