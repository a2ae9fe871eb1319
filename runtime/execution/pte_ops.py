"""The host kernel for each operator a ``.pte`` names.

An ExecuTorch program calls out variants (``aten::convolution.out``,
``quantized_decomposed::quantize_per_tensor.out``, ``cortex_m::quantized_conv2d.out``). The
ops of a CPU library with a host arithmetic of its own (``cortex_m::``: CMSIS-NN's integer
arithmetic, bit-exact with the device; ``CpuBackend.host_arithmetic``, found by
``runtime.execution.cpu_libraries``) run that, not ExecuTorch's Python references, which round
differently. Other ops: where torch has a kernel for the out variant (ATen's own, ExecuTorch's
quantized kernels loaded by ``executorch.kernels.quantized``) it writes straight into the planned
output tensor; otherwise the functional variant runs and its result is copied into the planned
output — the same values.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch

from etforge.core.common.errors import EtforgeError
from etforge.runtime.execution import kernel_memo
from etforge.runtime.execution.cpu_libraries import argument_reads, host_kernel, host_libraries

_KEYS = ("CPU", "CompositeExplicitAutograd", "CompositeImplicitAutograd")
#: False only inside ``executorch_references()`` (bench/verify.py's before/after timing).
_OWN = [True]


@contextmanager
def executorch_references() -> Iterator[None]:
    """Run the CPU libraries' ops (``cortex_m``) as ExecuTorch's Python reference implementations
    instead of their host arithmetic (slower, and not the device's rounding): for measuring the difference."""
    _OWN[0] = False
    try:
        yield
    finally:
        _OWN[0] = True


def _register_libraries() -> None:
    """Out variants of the quantized ops, and each CPU library's operators (its plugin's
    ``HostArithmetic.register``)."""
    import executorch.kernels.quantized  # noqa: F401

    host_libraries()


@dataclass(frozen=True)
class Kernel:
    """One operator of the program: how to call it with the instruction's arguments."""

    name: str  # "aten::convolution.out"
    overload: torch._ops.OpOverload
    #: The functional overload run instead when the out variant has no host kernel.
    functional: torch._ops.OpOverload | None
    #: etforge's own out-variant kernel (every schema argument in order), used when set.
    own: Callable[..., Any] | None = None

    @property
    def schema(self) -> Any:
        return self.overload._schema

    def __call__(self, args: Sequence[Any]) -> Any:
        """Call with every schema argument in order (out arguments are the planned tensors)."""
        schema_args = self.schema.arguments
        if self.own is not None and _OWN[0]:
            single_out = (
                schema_args and schema_args[-1].is_out and not any(s.is_out for s in schema_args[:-1])
            )
            if single_out and kernel_memo.active():
                reads = argument_reads(self.name.split(".")[0], tuple(s.name for s in schema_args[:-1]))
                return kernel_memo.call(self.own, args[:-1], args[-1], reads)  # out last: one pure kernel
            return self.own(*args)
        pos = [a for s, a in zip(schema_args, args, strict=True) if not s.kwarg_only]
        kw = {s.name: a for s, a in zip(schema_args, args, strict=True) if s.kwarg_only}
        if self.functional is None:
            if self.name.startswith(_STRIDE_BLIND) and any(_strided(a) for a in args):
                return self._contiguous(args)
            try:
                return self.overload(*pos, **kw)
            except RuntimeError:
                if not any(_integer_channels_last(a) for a in args):
                    raise
                return self._contiguous(args)
        outs = [a for s, a in zip(schema_args, args, strict=True) if s.is_out]
        fpos = [a for s, a in zip(schema_args, args, strict=True) if not s.is_out and not s.kwarg_only]
        fkw = {s.name: a for s, a in zip(schema_args, args, strict=True) if not s.is_out and s.kwarg_only}
        result = self.functional(*fpos, **fkw)
        results = list(result) if isinstance(result, (tuple, list)) else [result]
        for out, value in zip(outs, results, strict=True):
            if tuple(out.shape) != tuple(value.shape):
                raise EtforgeError(
                    f"{self.name}: the reference implementation returns shape {list(value.shape)}, "
                    f"the program planned {list(out.shape)}"
                )
            out.copy_(value)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _contiguous(self, args: Sequence[Any]) -> Any:
        """The ATen kernel on contiguous copies of channels-last integer tensors, results copied
        back into the planned outputs.

        torch's CPU kernels refuse some int8 channels-last inputs the device's portable kernels
        take (``max_pool2d_with_indices`` checks the plane size against the element type's
        range: any int8 map over 127 values fails). Layout only: the values are the same.
        """
        schema_args = self.schema.arguments
        flat = [a.contiguous() if isinstance(a, torch.Tensor) and a.dim() == 4 else a for a in args]
        pos = [a for s, a in zip(schema_args, flat, strict=True) if not s.kwarg_only]
        kw = {s.name: a for s, a in zip(schema_args, flat, strict=True) if s.kwarg_only}
        self.overload(*pos, **kw)
        outs = [(a, f) for s, a, f in zip(schema_args, args, flat, strict=True) if s.is_out]
        for planned, computed in outs:
            if isinstance(planned, torch.Tensor) and planned is not computed:
                planned.copy_(computed)
        planned_outs = [p for p, _ in outs]
        return planned_outs[0] if len(planned_outs) == 1 else tuple(planned_outs)


#: Host out-variant kernels that read and write memory linearly, ignoring the tensors'
#: strides (ExecuTorch's AOT ``quantized_decomposed`` kernels: on channels-last tensors they
#: wrote other values than the device's, found by ``tests/test_device_conformance.py``).
_STRIDE_BLIND = ("quantized_decomposed::",)


def _strided(t: object) -> bool:
    return isinstance(t, torch.Tensor) and t.dim() == 4 and not t.is_contiguous()


def _integer_channels_last(t: object) -> bool:
    return (
        isinstance(t, torch.Tensor)
        and t.dim() == 4
        and not t.is_floating_point()
        and not t.is_contiguous()
        and t.is_contiguous(memory_format=torch.channels_last)
    )


def _sqrt_out(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """The portable kernel's ``std::sqrt`` is correctly rounded (IEEE 754); torch's vectorised
    float sqrt is not always (1.1523602f -> 1.0734805f, the device 1.0734804f): in double, whose
    square root rounded to float is the correctly rounded float square root."""
    wide = torch.float64 if x.is_floating_point() and x.dtype != torch.float64 else x.dtype
    out.copy_(torch.sqrt(x.to(wide)).to(out.dtype))
    return out


#: Portable kernels whose device arithmetic torch's CPU kernel does not reproduce bit for bit
#: (found by ``tests/test_device_conformance.py``), as etforge's own host kernels.
DEVICE_ARITHMETIC: dict[str, Callable[..., Any]] = {"aten::sqrt": _sqrt_out}


def _has_kernel(op: torch._ops.OpOverload) -> bool:
    name = op._schema.name + (f".{op._schema.overload_name}" if op._schema.overload_name else "")
    return any(torch._C._dispatch_has_kernel_for_dispatch_key(name, k) for k in _KEYS)


def _functional_of(packet: Any, out: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """The overload taking the out variant's non-out arguments (``default`` for custom ops)."""
    wanted = [(a.name, str(a.type)) for a in out._schema.arguments if not a.is_out]
    for name in packet.overloads():
        candidate = getattr(packet, name)
        if [(a.name, str(a.type)) for a in candidate._schema.arguments] == wanted and _has_kernel(candidate):
            return candidate
    return None


@cache
def kernel(name: str, overload: str) -> Kernel:
    """The kernel for operator ``name`` (``ns::op``; bare names are ATen) and ``overload``."""
    _register_libraries()
    ns, _, op = name.rpartition("::")
    full = f"{ns or 'aten'}::{op}" + (f".{overload}" if overload else "")
    try:
        packet = getattr(getattr(torch.ops, ns or "aten"), op)
        target = getattr(packet, overload or "default")
    except (AttributeError, RuntimeError):
        raise EtforgeError(f"operator {full}: no host implementation is registered in torch") from None
    own = host_kernel(f"{ns}::{op}") if overload == "out" else None
    if own is None and overload == "out":
        own = DEVICE_ARITHMETIC.get(f"{ns or 'aten'}::{op}")
    if own is not None:
        return Kernel(full, target, _functional_of(packet, target), own)
    if _has_kernel(target):
        return Kernel(full, target, None)
    functional = _functional_of(packet, target)
    if functional is None:
        raise EtforgeError(f"operator {full}: neither it nor a functional variant has a host kernel")
    return Kernel(full, target, functional)


def own_functional(target: Any) -> Callable[..., Any] | None:
    """A CPU library's host kernel for its functional op (``cortex_m``) as an Edge graph calls it (``host.py``),
    taking the functional arguments plus ``out``; for an op in ``DEVICE_ARITHMETIC`` its device
    arithmetic (the Edge run and ``model.pte``'s interpreter must compute alike, and as the
    device does); None for every other op."""
    schema = getattr(target, "_schema", None)
    if schema is None:
        return None
    if schema.name in DEVICE_ARITHMETIC and not schema.overload_name:
        return DEVICE_ARITHMETIC[schema.name]
    if not _OWN[0]:
        return None
    return host_kernel(schema.name)
