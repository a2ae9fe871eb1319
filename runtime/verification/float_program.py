"""The float program verify's float check runs: BatchNorms folded into their convs, NPU delegation only.

``float.pt2`` keeps a model's BatchNorms as the user wrote them. Lowered as it is, each one
stays on the CPU in float and cuts the NPU side into pieces (MobileNetV2-96: 52 BatchNorms, 54
partitions, each converted on its own, and the classic ``to_edge`` over all of it: 39% of
verify). The int8 program the other gates judge is built on prepare's fold
(``core/quantize/conv_bn``), so the float check folds the same way first: each NPU op is then
the op the device runs, in float (one partition on MobileNetV2). It compares each NPU op with
its own Edge op on the same inputs, so it needs no new tolerance: the fold moves values by
float32 rounding only, and whether the folded model still computes the user's model is the
compile's float-equivalence gate (``core/build/equivalence``, ``report.json``
``float_equivalence``), which verify reports.

Only the NPU delegation runs (``core.lower.driver.delegate_npu``: the early path, the classic
one where it cannot be exact); the ops left on the CPU run as float Edge ops, which is what the
float check compares the NPU ops with.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.export import ExportedProgram


def folded(float_ep: ExportedProgram) -> tuple[ExportedProgram, int]:
    """``float_ep`` with every BatchNorm after a conv folded into it (prepare's exact fold), and
    how many were folded; ``float_ep`` itself when there is none or the graph cannot be rebuilt
    directly (then the float check runs on the unfolded program, as before: slower, as strong)."""
    program, folds, _ = fold(float_ep)
    return program, folds


def fold(float_ep: ExportedProgram) -> tuple[ExportedProgram, int, str | None]:
    """:func:`folded` and, when BatchNorms stayed unfolded, why (None: folded, or none to fold):
    the float check then lowers the unfolded program (each BatchNorm a CPU op cutting the NPU
    side), and verify says so."""
    from etforge.core.graph.program import Unsupported, program_from_graph
    from etforge.core.quantize.conv_bn import fold_conv_batch_norms

    def count(graph: torch.fx.Graph) -> int:
        return sum("batch_norm" in str(n.target) for n in graph.nodes if n.op == "call_function")

    before = count(float_ep.graph)
    if not before:
        return float_ep, 0, None
    if not float_ep.example_inputs:
        return float_ep, 0, f"{before} BatchNorm(s) not folded: the float program records no example inputs"
    gm = float_ep.module(check_guards=False)
    fold_conv_batch_norms(gm)
    after = count(gm.graph)
    if after == before:
        return float_ep, 0, None  # no BatchNorm follows a conv: nothing prepare folds either
    try:
        return program_from_graph(gm, float_ep, tuple(float_ep.example_inputs[0])), before - after, None
    except Unsupported as exc:
        why = f"the float program cannot be rebuilt from the folded graph: {exc}"
        return float_ep, 0, f"{before - after} conv + BatchNorm pair(s) not folded ({why})"


def delegated(
    float_ep: ExportedProgram, target: Any, options: dict[str, Any] | None, reg: Any
) -> tuple[ExportedProgram, int, dict[str, Any]]:
    """(the folded float program with its NPU partitions delegated, BatchNorms folded, the
    lowering path taken and why) for ``target`` (the float check's float-taking target); the
    last also holds ``unfolded``: why BatchNorms stayed unfolded (None when none did)."""
    from etforge.core.graph.utils import clone_program
    from etforge.core.lower.driver import delegate_npu

    program, folds, unfolded = fold(float_ep)
    if not folds:  # lowering rewrites a program in place (a rewrite's constants join its
        # signature), and the caller goes on using float_ep as the float model (verify --data)
        program = clone_program(float_ep)
    delegated_program, _, why = delegate_npu(program, target, options, reg)
    return delegated_program, folds, {**why, "unfolded": unfolded}
