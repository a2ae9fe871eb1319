"""The float check of every converter: each NPU partition's float form against its float Edge ops.

An int8 step hides a wrong constant smaller than the step (tanh-approximate GELU for exact
GELU is < 1 step almost everywhere). The same converters run on float32 tensors show it: the
float program is lowered with the compile's target and options (as ``compile --float``
does), each partition runs in LiteRT, and every float value an op produced is compared with
the Edge op's float value on the same inputs (teacher-forced: each op gets LiteRT's inputs).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from etforge.core.graph import layout
from etforge.core.litert import payload
from etforge.core.litert.builder import read_metadata
from etforge.runtime.execution import litert_run
from etforge.runtime.execution.host import program_inputs, stored_inputs

#: Largest |LiteRT - Edge| of one op's float values, relative to the largest |Edge value| of
#: that op (for a sum, or the largest |summed term|: ``_terms``). float32 evaluation-order noise is ~1e-7..1e-6 of the range on one op (a few
#: thousand products summed); a wrong constant is far above it (tanh-approximate GELU for
#: exact GELU: 5e-4 at x = 2.7, ~1e-4 of a [-4, 4] range). 1e-5 sits between them.
FLOAT_REL_TOL = 1e-5


@dataclass(frozen=True)
class FloatOp:
    partition: str
    node: str
    rel_error: float
    values: int


def float_op_check(lowered: Any, args: Sequence[torch.Tensor]) -> list[FloatOp]:
    """Every recorded float value of one float delegate call against its Edge op."""
    blob = payload.unpack_for_host(bytes(lowered.processed_bytes))
    if not blob.format.startswith("litert"):
        return []
    values = json.loads(read_metadata(blob.data).get("etforge_float_values", b"{}"))
    if not values:
        return []
    inputs = stored_inputs(blob, args)
    it = litert_run.kept(blob.data, "reference", inputs)  # the program's own run, when kept
    if it is None:
        it = litert_run.interpreter(blob.data, "reference", preserve_all_tensors=True)
        litert_run.set_inputs(it, inputs)
        it.invoke()
    found: list[FloatOp] = []

    class Forced(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            ref = super().run_node(n)
            if n.name not in values or not isinstance(ref, torch.Tensor) or not ref.is_floating_point():
                return ref
            index, perm = values[n.name]
            ours = torch.from_numpy(np.array(it.get_tensor(index))).permute(layout.inverse(perm))
            if tuple(ours.shape) != tuple(ref.shape):
                return ref
            scale = max(float(ref.abs().max()), _terms(n, self)) if ref.numel() else 0.0
            err = float((ours.double() - ref.double()).abs().max()) if ref.numel() else 0.0
            found.append(FloatOp(blob.partition, n.name, err / scale if scale else err, ref.numel()))
            return ours.to(ref.dtype)

    program = lowered.original_module
    with torch.no_grad():
        Forced(program.graph_module).run(*program_inputs(program, list(args)))
    return found


#: Ops whose output is a sum of terms: it can cancel to ~0 (a LayerNorm's mean over an input
#: already normalized to mean 0), while float32 summation noise stays relative to the terms.
_SUMS = {
    "aten.add.Tensor": "add", "aten.sub.Tensor": "add", "aten.mean.dim": "same", "aten.sum.dim_IntList": "same",
}  # fmt: skip


def _terms(n: torch.fx.Node, interp: torch.fx.Interpreter) -> float:
    """The largest |summed term| of a summing op (0 for any other op): the scale its float32
    rounding noise is relative to. Measured on the op's own inputs, so a wrong constant (a
    divisor, an alpha) still shows against it."""
    from etforge.core.graph.utils import node_op

    how = _SUMS.get(node_op(n))
    if how is None:
        return 0.0
    args, kwargs = interp.fetch_args_kwargs_from_env(n)
    if how == "add":
        a, b = (x.abs() if isinstance(x, torch.Tensor) else abs(x) for x in args[:2])
        terms = a + b * abs(kwargs.get("alpha", 1))
    else:
        terms = n.target(args[0].abs(), *args[1:], **kwargs)
    return float(torch.as_tensor(terms).abs().max())


def float_target(target: Any) -> Any:
    """``target`` whose NPU side takes float32 too and compiles nothing for the device: the
    same converters and constraints, run on float tensors (an NPU that runs int8 only, as
    Neutron, would refuse every float node and leave nothing to check)."""
    import dataclasses

    if target.npu is None:
        return target
    dtypes = tuple(dict.fromkeys((*target.npu.dtypes, "float32")))
    return dataclasses.replace(target, npu=dataclasses.replace(target.npu, dtypes=dtypes, compiler=None))


def check_float_program(
    float_ep: Any,
    target: Any,
    options: dict[str, Any] | None,
    reg: Any,
    batches: Sequence[tuple[torch.Tensor, ...]],
    notes: list[str] | None = None,
) -> list[FloatOp]:
    """Delegate ``float_ep``'s NPU partitions (the float program, its BatchNorms folded as
    prepare folds them: ``runtime.verification.float_program``) and check every NPU op of it on
    ``batches``; per op, the worst relative error over the batches. ``notes`` gets why
    BatchNorms stayed unfolded, when they did (the check then runs on the unfolded program)."""
    from etforge.runtime.execution.host import run_program
    from etforge.runtime.verification.float_program import delegated

    program, _, why = delegated(float_ep, float_target(target), options, reg)
    if why.get("unfolded") and notes is not None:
        notes.append(why["unfolded"])
    worst: dict[tuple[str, str], FloatOp] = {}
    kept: dict[Any, Any] = {}  # each partition's every-tensor run, read back by float_op_check
    for batch in batches:
        calls: list[Any] = []
        with litert_run.keeping("reference", kept):
            run_program(program, batch, "reference", calls)
            found = [f for lowered, args in calls for f in float_op_check(lowered, args)]
        for f in found:
            key = (f.partition, f.node)
            if key not in worst or f.rel_error > worst[key].rel_error:
                worst[key] = f
    return list(worst.values())


def failures(ops: Sequence[FloatOp]) -> list[str]:
    return [
        f"NPU op {o.partition}:{o.node} in float form is {o.rel_error:.2g} (relative to its largest value) "
        f"from its float Edge op on the same inputs (> {FLOAT_REL_TOL:g}): the converter computes "
        "another function (a wrong constant, epsilon, axis or approximation)"
        for o in ops
        if o.rel_error > FLOAT_REL_TOL
    ]
