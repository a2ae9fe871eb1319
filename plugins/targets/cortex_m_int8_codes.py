"""After ExecuTorch's Cortex-M passes, no ATen arithmetic op computes on int8 codes as if they were real values.

A quantized program's CPU ops are then CMSIS-NN's quantized kernels, portable ops between a
dequantize and a quantize, or ops exact on codes (views, max pools, clamps at quantized
bounds). When a pass refuses a pattern it may only log it and leave, say, an
``aten.convolution`` reading int8 codes: the program runs and is wrong (a U-Net head was 134
steps off before ``cortex_m_unfused.py``). ``CortexMBackend.lower`` makes any such leftover a
compile error naming the node, before anything is written.
"""

from __future__ import annotations

import torch
from torch.export import ExportedProgram

from etforge.sdk import EtforgeError, node_op

#: ATen ops whose result on int8 codes is not the codes of their result on the real values
#: (sums, products, averages, nonlinear functions, anything with a real constant).
VALUE_OPS: frozenset[str] = frozenset(
    f"aten.{name}"
    for name in (
        "convolution", "linear", "addmm", "mm", "bmm", "matmul", "add", "sub", "mul", "div",
        "mean", "sum", "avg_pool2d", "avg_pool1d", "_adaptive_avg_pool2d", "adaptive_avg_pool2d",
        "sigmoid", "tanh", "hardsigmoid", "hardswish", "gelu", "silu", "relu", "hardtanh", "leaky_relu", "elu",
        "_softmax", "softmax", "_log_softmax", "log_softmax", "exp", "log", "rsqrt", "sqrt", "pow",
        "neg", "abs", "erf", "prelu", "native_layer_norm", "native_batch_norm",
        "_native_batch_norm_legit_no_training", "var_mean", "var", "cumsum",
    )
)  # fmt: skip


def _base(op: str) -> str:
    return op.rsplit(".", 1)[0] if op.count(".") >= 2 else op


def int8_value_ops(program: ExportedProgram) -> list[tuple[str, str]]:
    """(node, op) of every ATen value op reading an int8 tensor some op computed (a user's own
    int8 input is a number, not a code)."""
    found = []
    for n in program.graph_module.graph.nodes:
        if n.op != "call_function" or (_base(node_op(n)) not in VALUE_OPS and not _real_bounds(n)):
            continue
        for a in n.all_input_nodes:
            val = a.meta.get("val")
            if a.op != "placeholder" and isinstance(val, torch.Tensor) and val.dtype == torch.int8:
                found.append((n.name, node_op(n)))
                break
    return found


def _real_bounds(node: torch.fx.Node) -> bool:
    """A clamp whose bounds are real numbers, not codes (ExecuTorch's quantized clamp has int
    bounds): 6.0 on int8 codes clamps at code 6, whatever the scale."""
    return _base(node_op(node)) == "aten.clamp" and any(isinstance(b, float) for b in node.args[1:3])


def check(program: ExportedProgram, target: str) -> None:
    """Raise when an ATen value op would compute on int8 codes (see the module docstring)."""
    found = int8_value_ops(program)
    if not found:
        return
    listed = ", ".join(f"{name} ({op})" for name, op in found[:4]) + (" …" if len(found) > 4 else "")
    raise EtforgeError(
        f"{target}: {len(found)} CPU op(s) would compute on int8 codes as if they were real values: "
        f"{listed}. ExecuTorch's Cortex-M passes left them unconverted (a pattern it refused); "
        "nothing written (etforge cannot run them right; please report the model)."
    )
