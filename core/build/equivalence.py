"""The front end's promise: the program quantization observed computes the user's model.

Graph rewrites, the BatchNorm fold and the CPU quantizer's pre-annotation passes all edit the
float graph before any observer sees it, and ``verify`` judges the compiled model against
that edited graph (``float.pt2``, ``quantized.pt2``): an edit that changed the model's meaning
would pass ``verify`` unseen (stop 41's conv + BatchNorm fold did, by 7.3 on a signal of 3.6).
Observers pass their input through unchanged, so the observed model's output on the first
calibration batch *is* the edited float model's; it is compared here with the exported
model's output on the same batch. The cost is one float forward pass of the model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch.export import ExportedProgram

#: Largest |edited - exported| of a float output, relative to the output's largest |value|.
#: Exact edits (a fold, a decomposition, x*x for x**2) move a value by float32 evaluation-order
#: noise only: measured ≤ 4e-5 of it on torchvision's ten families on every target (googlenet
#: the largest; most ≤ 1e-5). For an output spanning ±scale an int8 step is 2·scale/255 ≈
#: 7.8e-3·scale, so a change of a quarter step, which the quantized model could show, is 2e-3.
FLOAT_EDIT_REL_TOL = 2e-3
#: Below this absolute difference a float output agrees whatever its range (an output that is
#: all zeros in the exported model, a sum that cancels): float32 noise on unit-scale values.
FLOAT_EDIT_ABS_FLOOR = 1e-6


@dataclass(frozen=True)
class Equivalence:
    """The edited float model against the exported one on one calibration batch."""

    passed: bool
    #: Largest |edited - exported| over the float outputs, and the largest |exported| value.
    max_abs: float
    scale: float
    tolerance: float
    #: What was compared with the exported model ("the observed model", "the rewritten program").
    compared: str
    #: Why it failed, when it did, in one line.
    why: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def run(program: ExportedProgram, batch: Sequence[torch.Tensor]) -> Any:
    """``program``'s output on ``batch`` (its module, unlifted, under ``no_grad``)."""
    with torch.no_grad():
        return program.module(check_guards=False)(*batch)


def compare(exported: Any, edited: Any, compared: str) -> Equivalence:
    """Float outputs within the tolerance, the rest (integer, bool) equal; the same structure."""
    ref_leaves, ref_spec = torch.utils._pytree.tree_flatten(exported)
    new_leaves, new_spec = torch.utils._pytree.tree_flatten(edited)
    tolerance = FLOAT_EDIT_REL_TOL
    if ref_spec != new_spec:
        return Equivalence(
            False, 0.0, 0.0, tolerance, compared, f"its outputs are {new_spec}, not {ref_spec}"
        )
    worst, scale, why = 0.0, 0.0, ""
    for index, (ref, new) in enumerate(zip(ref_leaves, new_leaves, strict=True)):
        if not isinstance(ref, torch.Tensor) or not isinstance(new, torch.Tensor):
            if ref != new and not why:
                why = f"output {index} is {new!r}, not {ref!r}"
            continue
        if ref.numel() == new.numel() and ref.dtype == new.dtype:
            new = new.reshape(ref.shape)  # ExecuTorch's Cortex-M passes make a 0-d sum [1]: same values
        else:
            why = why or f"output {index} is {new.dtype}{list(new.shape)}, not {ref.dtype}{list(ref.shape)}"
            continue
        if not ref.is_floating_point():
            if not torch.equal(ref, new) and not why:
                why = f"integer output {index} differs in {int((ref != new).sum())} of {ref.numel()} values"
            continue
        if ref.numel() == 0:
            continue
        same = (ref == new) | (ref.isnan() & new.isnan())  # NaN where the model gives NaN
        diff = float(
            torch.where(same, 0.0, (new.double() - ref.double()).abs()).nan_to_num(nan=float("inf")).max()
        )
        top = float(ref.double().abs().nan_to_num(nan=0.0, posinf=0.0, neginf=0.0).max())
        worst, scale = max(worst, diff), max(scale, top)
        if diff > max(tolerance * top, FLOAT_EDIT_ABS_FLOOR) and not why:
            why = f"output {index} moved by {diff:.3g}, {diff / top if top else float('inf'):.2g} of its range {top:.3g}"
    return Equivalence(not why, worst, scale, tolerance, compared, why)
