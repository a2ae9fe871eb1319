"""Execute an Edge program on the host: delegate calls through LiteRT, everything else eagerly.

This is how ``etforge verify`` and the tests see what the device would compute for the
NPU partitions without the device: the payload's LiteRT model runs in the reference
interpreter; CPU ops run as their Edge/ATen (or Cortex-M reference) implementations.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind

from etforge.core.common.errors import EtforgeError
from etforge.core.front.signature import user_output_positions
from etforge.core.graph import layout
from etforge.core.litert import payload
from etforge.runtime.execution import kernel_memo, litert_run, pte_ops
from etforge.runtime.execution.cpu_libraries import argument_reads


def stored_inputs(blob: payload.Blob, args: Sequence[torch.Tensor]) -> list[Any]:
    """A delegate's inputs as its LiteRT model holds them: each in its ExecuTorch dim order
    (the bytes the device runtime hands over); results are viewed back in logical order."""
    orders = blob.header.get("input_dim_orders") or [list(range(a.dim())) for a in args]
    return [a.detach().permute(d).contiguous().numpy() for a, d in zip(args, orders, strict=True)]


def _delegate_call(lowered: Any, args: Sequence[torch.Tensor], kernels: str) -> tuple[torch.Tensor, ...]:
    blob = payload.unpack_for_host(bytes(lowered.processed_bytes))
    if not blob.format.startswith("litert"):
        raise RuntimeError(f"partition {blob.partition}: payload {blob.format!r} runs on the device only")
    outs = litert_run.run(blob.data, stored_inputs(blob, args), kernels)
    out_orders = blob.header.get("output_dim_orders") or [list(range(o.ndim)) for o in outs]
    return tuple(
        torch.from_numpy(o).permute(layout.inverse(d)) for o, d in zip(outs, out_orders, strict=True)
    )


class _Runner(torch.fx.Interpreter):
    def __init__(
        self,
        gm: torch.fx.GraphModule,
        kernels: str,
        calls: list[Any] | None,
        observe: Callable[[torch.fx.Node, Any], None] | None = None,
    ) -> None:
        super().__init__(gm)
        self.kernels, self.calls, self.observe = kernels, calls, observe
        self.node: torch.fx.Node | None = None

    def run_node(self, n: torch.fx.Node) -> Any:
        self.node = n
        out = super().run_node(n)
        if self.observe is not None:
            self.observe(n, out)
        return out

    def call_function(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if target is torch.ops.higher_order.executorch_call_delegate:
            if self.calls is not None:
                self.calls.append((args[0], list(args[1:])))
            return _delegate_call(args[0], args[1:], self.kernels)
        own = pte_ops.own_functional(target)
        if own is not None:  # the same cortex_m kernels as the model.pte interpreter
            rest = [kwargs.get(a.name, a.default_value) for a in target._schema.arguments[len(args) :]]
            if not kernel_memo.active():
                return own(*args, *rest, _planned_output(self.node))
            names = tuple(a.name for a in target._schema.arguments)
            reads = argument_reads(target._schema.name, names)
            return kernel_memo.call(own, [*args, *rest], _planned_output(self.node), reads)
        try:
            return super().call_function(target, args, kwargs)
        except NotImplementedError:
            with _exact_integer_convolution():  # e.g. a dilated CMSIS-NN conv's reference
                try:
                    return super().call_function(target, args, kwargs)
                except NotImplementedError:
                    name = getattr(getattr(target, "_schema", None), "name", str(target))
                    raise EtforgeError(
                        f"operator {name}: no host implementation (torch has no CPU kernel for it and "
                        "no CPU backend's host_arithmetic gives one)"
                    ) from None
        except RuntimeError:
            if not any(_integer_channels_last(a) for a in args):
                raise
            return _contiguous_call(target, args, kwargs)


def _planned_output(node: torch.fx.Node | None) -> torch.Tensor:
    """An empty tensor with the shape, dtype and memory layout the Edge program gives ``node``."""
    val = node.meta.get("val") if node is not None else None
    if not isinstance(val, torch.Tensor):
        raise RuntimeError(f"node {getattr(node, 'name', '?')} has no tensor metadata to size its output")
    return torch.empty_strided(tuple(val.shape), tuple(val.stride()), dtype=val.dtype)


@contextlib.contextmanager
def _exact_integer_convolution() -> Iterator[None]:
    """``F.conv1d/conv2d`` on integer tensors computed in float64 and rounded back.

    The Cortex-M ops' reference implementations accumulate int8 products in int32 with
    ``F.conv2d``, and torch has no integer kernel for some cases (dilation: "slow_conv_dilated
    not implemented for 'Int'"). float64 holds every such sum exactly (|sum| < 2^53), so the
    result is the integer one.
    """
    import torch.nn.functional as F

    saved = {name: getattr(F, name) for name in ("conv1d", "conv2d")}

    def exact(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        def run(
            x: torch.Tensor, weight: torch.Tensor, bias: Any = None, *rest: Any, **kw: Any
        ) -> torch.Tensor:
            if x.is_floating_point():
                return fn(x, weight, bias, *rest, **kw)
            b = bias.double() if isinstance(bias, torch.Tensor) else bias
            return fn(x.double(), weight.double(), b, *rest, **kw).round().to(x.dtype)

        return run

    try:
        for name, fn in saved.items():
            setattr(F, name, exact(fn))
        yield
    finally:
        for name, fn in saved.items():
            setattr(F, name, fn)


def _integer_channels_last(t: object) -> bool:
    return (
        isinstance(t, torch.Tensor)
        and t.dim() == 4
        and not t.is_floating_point()
        and not t.is_contiguous()
        and t.is_contiguous(memory_format=torch.channels_last)
    )


def _contiguous_call(target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``target`` on contiguous copies of its channels-last integer inputs, results back in
    channels-last memory.

    torch's CPU kernels refuse some int8 channels-last inputs the device kernels take
    (``max_pool2d_with_indices`` checks its plane size against the *element* type's range:
    any int8 map over 127 values fails). The memory format is layout only: the values, and
    the device's, are the same.
    """
    flat = [a.contiguous() if _integer_channels_last(a) else a for a in args]
    out = target(*flat, **kwargs)

    def back(t: Any) -> Any:
        if isinstance(t, torch.Tensor) and t.dim() == 4:
            return t.contiguous(memory_format=torch.channels_last)
        return t

    return tuple(back(t) for t in out) if isinstance(out, tuple) else back(out)


def program_inputs(ep: ExportedProgram, user_inputs: Sequence[torch.Tensor]) -> list[Any]:
    """All placeholder values of ``ep`` in order: lifted constants then the user's inputs."""
    values: list[Any] = []
    it = iter(user_inputs)
    for spec in ep.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            values.append(next(it))
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
            values.append(
                ep.state_dict[spec.target] if spec.target in ep.state_dict else ep.constants[spec.target]
            )
        else:
            values.append(ep.constants[spec.target])
    return values


def run_program(
    ep: ExportedProgram,
    inputs: Sequence[torch.Tensor],
    kernels: str = "default",
    calls: list[Any] | None = None,
    observe: Callable[[torch.fx.Node, Any], None] | None = None,
) -> list[torch.Tensor]:
    """Run an (Edge, possibly delegated) program on the host; returns its user outputs.

    The outputs are the pytree leaves of what the model returns, in the ``.pte``'s output
    order (``core.front.signature``): tensors, and the constants a model may return beside them
    (``None``, a Python number) as themselves.

    ``kernels``: which LiteRT kernels run the NPU partitions (see ``litert_run``);
    ``calls`` collects each delegate call as (lowered module, input tensors); ``observe``
    sees every node with the value it produced.
    """
    with torch.no_grad():
        out = _Runner(ep.graph_module, kernels, calls, observe).run(*program_inputs(ep, inputs))
    if isinstance(out, torch.Tensor):
        return [out]
    return [out[i] for i in user_output_positions(ep)]
