"""``verify``'s view of a model's outputs: every pytree leaf, paired with its reference and judged.

A model may return a tensor, a tuple, a dict, nested lists and dicts, ``None`` or Python
numbers. The ``.pte``'s outputs are the pytree leaves of that value in ``torch.export``'s
order (``core.front.signature``); the float and quantized references are flattened the same way,
so each leaf is compared with its own reference. What each kind of leaf must satisfy (the
gates are ``runtime.verification.verify``'s constants):

- **float** (a floating-point tensor with elements): top-1 agreement with the reference on
  all but ``TOP1_MISSES_PER_32`` per 32 samples, ties on an int8 step counting as agreement
  (a row is the first dimension of a 2-D or larger output; a 0-D or 1-D output is one row,
  and an output whose rows hold one value has no top-1 to disagree on); with
  ``--max-steps``, within that many steps of the exact reference when its scale is known.
  The first float leaf is the *primary* output whose figures the summary shows.
- **integer** (an integer or bool tensor: an argmax, a mask, token ids): equal to the
  reference element for element; like top-1 (an argmax over int8 scores flips where they
  round differently), one sample in 32 may differ.
- **empty** (a tensor with no elements): the same shape and dtype as the reference.
- **constant** (``None`` or a Python number the program always returns): the same value,
  on every sample.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx._pytree as fx_pytree
import torch.utils._pytree as pytree
from torch.export import ExportedProgram

from etforge.core.front.signature import output_names, user_output_positions
from etforge.core.graph.utils import node_op


def rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` as [rows, values]: its first dimension when 2-D or larger, else one row."""
    return t.reshape(t.shape[0], -1) if t.dim() >= 2 else t.reshape(1, -1)


def same_shape(a: Any, b: Any) -> bool:
    return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape


def kind_of(value: Any) -> str:
    if not isinstance(value, torch.Tensor):
        return "constant"
    if value.numel() == 0:
        return "empty"
    return "float" if value.is_floating_point() else "integer"


def first_float(leaves: list[Any]) -> int | None:
    """Index of the first floating-point output leaf with values (the primary output)."""
    return next((i for i, v in enumerate(leaves) if kind_of(v) == "float"), None)


def flatten(program: ExportedProgram, value: Any) -> list[Any]:
    """A module's structured output as the program's output leaves (its ``out_spec``)."""
    spec = program.call_spec.out_spec
    if spec is not None:
        return list(fx_pytree.tree_flatten_spec(value, spec))
    return list(pytree.tree_leaves(value)) if isinstance(value, (tuple, list, dict)) else [value]


def exact_leaves(
    program: ExportedProgram,
    module: torch.fx.GraphModule,
    inputs: tuple[Any, ...],
    constants: Any = None,
    sums: Any = None,
) -> list[Any]:
    """The quantized reference's output leaves evaluated in float64 (``runtime.verification.reference``;
    floating-point leaves returned as float32), flattened as the program's; ``constants``: a
    ``runtime.verification.constant_nodes.ConstantNodes`` of ``module`` kept across samples."""
    from etforge.runtime.verification.reference import Float64

    with torch.no_grad():
        value = Float64(module, constants, sums).run(*inputs)
    leaves = flatten(program, value)
    return [v.float() if isinstance(v, torch.Tensor) and v.is_floating_point() else v for v in leaves]


def leaf_scales(program: ExportedProgram) -> list[float | None]:
    """Per output leaf, the scale of the dequantize producing it (None: not a dequantized int8)."""
    out = next(n for n in program.graph_module.graph.nodes if n.op == "output")
    scales: list[float | None] = []
    for i in user_output_positions(program):
        arg = out.args[0][i]
        scale = None
        if isinstance(arg, torch.fx.Node) and node_op(arg).split(".")[-2:] == [
            "dequantize_per_tensor",
            "default",
        ]:
            scale = float(arg.args[1]) if isinstance(arg.args[1], float) else None
        scales.append(scale)
    return scales


@dataclass
class Leaf:
    """One output leaf over the samples: what was compared and how often it agreed."""

    name: str
    kind: str
    scale: float | None
    shape: list[int] | None = None
    dtype: str | None = None
    samples: int = 0
    #: Samples on which the leaf agreed with the reference: top-1 (float) or equality.
    agreed: int = 0
    #: float leaves with a scale: the worst distance from the reference, in output steps.
    max_steps: float | None = None
    #: Whether top-1 means anything for this leaf (float rows with more than one value).
    top1: bool = False
    #: Why a sample differed (first one), for the failure message.
    first_difference: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "shape": self.shape,
            "dtype": self.dtype,
            "samples": self.samples,
            "agreed": self.agreed,
            "compared_as": {
                "float": "top-1" if self.top1 else "steps only (one value per row)",
                "integer": "equal",
                "empty": "shape and dtype",
                "constant": "equal",
            }[self.kind],
            "max_steps": self.max_steps,
        }


@dataclass
class OutputCheck:
    """Collects, sample by sample, each output leaf against its reference."""

    program: ExportedProgram
    leaves: list[Leaf] = field(default_factory=list)

    def __post_init__(self) -> None:
        names = output_names(self.program)
        scales = leaf_scales(self.program)
        self.leaves = [Leaf(n, "", s) for n, s in zip(names, scales, strict=False)]

    @property
    def primary(self) -> int | None:
        """The leaf whose figures the summary shows: the first float output with values."""
        return next((i for i, leaf in enumerate(self.leaves) if leaf.kind == "float"), None)

    def classify(self, ours: list[Any]) -> None:
        """Fix each leaf's kind from the program's own outputs (first sample)."""
        for leaf, value in zip(self.leaves, ours, strict=False):
            if not leaf.kind:
                leaf.kind = kind_of(value)
                if isinstance(value, torch.Tensor):
                    leaf.shape, leaf.dtype = list(value.shape), str(value.dtype).removeprefix("torch.")
                    leaf.top1 = leaf.kind == "float" and rows(value).shape[1] > 1

    def add(self, ours: list[Any], exact: list[Any]) -> None:
        """One sample: the program's outputs and the reference's exact values (the quantized
        program in float64; the float model's for a float program)."""
        if len(ours) != len(self.leaves) or len(exact) != len(self.leaves):
            raise ValueError(
                f"the program returned {len(ours)} outputs, its reference {len(exact)}; "
                f"the exported program has {len(self.leaves)}"
            )
        self.classify(ours)
        for leaf, got, want in zip(self.leaves, ours, exact, strict=True):
            leaf.samples += 1
            same, why = _agrees(leaf, got, want, top1_agrees)
            leaf.agreed += int(same)
            if not same and leaf.first_difference is None:
                leaf.first_difference = f"sample {leaf.samples - 1}: {why}"
            if leaf.kind == "float" and leaf.scale and same_shape(got, want):
                steps = float((got.double() - want.double()).abs().max()) / leaf.scale
                leaf.max_steps = max(leaf.max_steps or 0.0, steps)

    def failures(self, need: int, against: str, max_steps: float | None, skip: int | None) -> list[str]:
        """One line per leaf that misses its gate; ``skip``: the leaf ``verify`` gates itself."""
        out = []
        for i, leaf in enumerate(self.leaves):
            if i == skip or not leaf.samples:
                continue
            required = need if leaf.kind in ("float", "integer") else leaf.samples
            if leaf.kind == "float" and not leaf.top1:
                required = 0
            if leaf.agreed < required:
                what = {
                    "float": "top-1 agreement",
                    "integer": "equal (integer output)",
                    "empty": "same shape and dtype (empty output)",
                    "constant": "same constant",
                }[leaf.kind]
                out.append(
                    f"{leaf.name}: {what} with {against} on {leaf.agreed}/{leaf.samples} samples "
                    f"< {required}/{leaf.samples}; first {leaf.first_difference}"
                )
            if max_steps is not None and leaf.max_steps is not None and leaf.max_steps > max_steps:
                out.append(
                    f"{leaf.name}: max difference from {against} {leaf.max_steps:.1f} steps > {max_steps:g}"
                )
        return out


def top1_agrees(ours: torch.Tensor, ref: torch.Tensor) -> bool:
    """Each row's top class agrees, ties included.

    An int8 output cannot order two classes whose scores fall on the same step: when one
    side's top value is shared by several classes, picking any of them agrees (``argmax``
    alone would count a tie broken by index as a disagreement).
    """
    a, b = rows(ours), rows(ref)  # a 0-D or 1-D output is one row
    pick_a, pick_b = a.argmax(1, keepdim=True), b.argmax(1, keepdim=True)
    tied_in_ref = b.gather(1, pick_a).eq(b.amax(1, keepdim=True))
    tied_in_ours = a.gather(1, pick_b).eq(a.amax(1, keepdim=True))
    return bool((tied_in_ref | tied_in_ours).all())


def _agrees(leaf: Leaf, got: Any, want: Any, top1_agrees: Any) -> tuple[bool, str]:
    if leaf.kind == "constant" or not isinstance(got, torch.Tensor) or not isinstance(want, torch.Tensor):
        same = type(got) is type(want) and got == want
        return bool(same), f"{got!r} where the reference is {want!r}"
    if got.shape != want.shape or (leaf.kind != "float" and got.dtype != want.dtype):
        return False, (
            f"{str(got.dtype).removeprefix('torch.')}{list(got.shape)} where the reference is "
            f"{str(want.dtype).removeprefix('torch.')}{list(want.shape)}"
        )
    if leaf.kind == "empty":
        return True, ""
    if leaf.kind == "integer":
        differ = int((got != want).sum())
        return differ == 0, f"{differ} of {got.numel()} values differ"
    if not leaf.top1:
        return True, ""
    return top1_agrees(got.float(), want.float()), "the top class differs"
