"""A model's inputs and outputs as the compile sees them: checked, named and described.

Outputs are torch's pytree leaves of whatever ``forward`` returns (a tensor, a tuple, a
dict, nested lists, ``None``), in the order ``torch.export`` flattened them (the program's
``out_spec``): the ``.pte``'s method outputs are exactly these leaves, so the report, the
host runs and ``verify`` name and pair them the same way, e.g. ``output['logits']`` or
``output[1][0]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.export import ExportedProgram
from torch.export.graph_signature import OutputKind

from etforge.core.common.errors import EtforgeError


def check_example(example: Sequence[Any], what: str) -> None:
    """Refuse example inputs a program cannot be built for, naming the input.

    A zero-size input carries no data: the program computes nothing from it, calibration
    observes no values to quantize with, and ``verify`` would compare empty tensors.
    """
    for j, t in enumerate(example):
        if isinstance(t, torch.Tensor) and t.numel() == 0:
            raise EtforgeError(
                f"{what}: input {j} has zero elements (shape {list(t.shape)}): a program built for "
                "an empty tensor computes nothing and calibration has no values to observe; give "
                "an example input of the size the model runs on"
            )


def input_ranges(
    example: Sequence[Any], calibration: Sequence[Sequence[Any]] | None
) -> list[list[int] | None]:
    """Per input, [min, max] of an integer or bool input's values over the example and the
    calibration batches (None for floating-point inputs).

    ``verify`` draws integer inputs from this range: an ``Embedding``'s token ids, say,
    are only meaningful below its vocabulary size, which only the user's data shows.
    """
    batches = [tuple(example), *(tuple(b) for b in calibration or ())]
    out: list[list[int] | None] = []
    for j, t in enumerate(example):
        if not isinstance(t, torch.Tensor) or t.is_floating_point() or t.is_complex():
            out.append(None)
            continue
        seen = [b[j].detach().to(torch.int64) for b in batches if b[j].numel()]
        out.append([min(int(s.min()) for s in seen), max(int(s.max()) for s in seen)] if seen else None)
    return out


def output_names(program: ExportedProgram) -> list[str]:
    """Each user output leaf's path in what ``forward`` returns: ``output``, ``output[0]``,
    ``output['logits']``, ``output[1][0]``."""
    spec = program.call_spec.out_spec
    if spec is None:
        count = sum(1 for s in program.graph_signature.output_specs if s.kind == OutputKind.USER_OUTPUT)
        return [f"output[{i}]" for i in range(count)]
    tree = pytree.tree_unflatten(list(range(spec.num_leaves)), spec)
    paths, _ = pytree.tree_flatten_with_path(tree)
    return [f"output{pytree.keystr(path)}" for path, _ in paths]


def user_output_positions(program: ExportedProgram) -> list[int]:
    """Positions of the user outputs among the graph's outputs (buffer mutations come first)."""
    return [i for i, s in enumerate(program.graph_signature.output_specs) if s.kind == OutputKind.USER_OUTPUT]


def describe_outputs(program: ExportedProgram) -> list[dict[str, Any]]:
    """Per user output leaf: its name and shape/dtype, or the constant it always is (``None``,
    a Python number): what ``report.json`` lists under ``outputs``."""
    out_node = next(n for n in program.graph.nodes if n.op == "output")
    args = out_node.args[0]
    leaves = [args[i] for i in user_output_positions(program)]
    described: list[dict[str, Any]] = []
    for name, arg in zip(output_names(program), leaves, strict=False):
        val = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else arg
        if isinstance(val, torch.Tensor):
            described.append(
                {"name": name, "shape": list(val.shape), "dtype": str(val.dtype).removeprefix("torch.")}
            )
        else:
            constant = val if val is None or isinstance(val, (int, float, bool, str)) else repr(val)
            described.append({"name": name, "constant": constant})
    return described
