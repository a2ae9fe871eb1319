"""etforge.sdk: the one module a plugin imports (``from etforge.sdk import ...``).

Everything here is public API; what is not here is core's private business and may change.
``tests/test_registry.py`` holds the built-in plugins to it. The docs walk through each kind:
docs/writing-an-op-plugin.md, docs/writing-a-rewrite-plugin.md, docs/writing-a-target-plugin.md.

Hooks (return lists from functions marked ``@hookimpl``; see ``etforge.core.contracts.hookspecs``)
    hookimpl
Op converters (``etforge_op_converters``)
    OpConverter, Support, SUPPORTED, unsupported, Constraint, Elementwise, elementwise, EVERY_NPU
Quantizer rules (``etforge_quantizer_rules``)
    QuantRule
Rewrites (``etforge_rewrites``) and their graph-editing helpers
    Rewrite, calls, call, replace, constant, val, attribute, batch_norm_affine, batch_norm_after
Targets (``etforge_targets``), CPU backends, NPU compilers, partition checks
    TargetSpec, NpuSpec, OptionSpec, CpuBackend, KernelLibrary, LOWERING_NOTES_KEY,
    NpuCompiler, NpuPayload, PartitionIo, PartitionCheck, ProposedPartition
Verify gates (``etforge_verify_gates``): a judgement ``etforge verify`` adds
    VerifyGate, GateInput, GateVerdict
A CPU library's host arithmetic (``CpuBackend.host_arithmetic``) and dim-order rules
    HostArithmetic, KernelArg, and the device-exact reference it builds on: Reference
    (TFLite's integer rules per Edge op), Q, Out, NotExact
Errors a plugin raises, and the fallback log a plugin reports a degradation to
    EtforgeError, PluginError, ConversionError, record_fallback
Running fragile vendor code in a child process
    run_isolated
LiteRT conversion (used inside ``OpConverter.convert``)
    ConversionContext, Value, Constant, Quant, options, enum, activation, padding
Op helpers (arguments, quantization parameters, bias, padding, permutations)
    arg, pair, const_perm, input_qparams, output_qparams, shares_qparams, has_full_size_operand,
    bias_tensor, same_padding, choose_padding, pad_spatial
Graph helpers (``torch.fx`` nodes) and the layout algebra
    node_op, shape_of, tensor_meta, tensor_inputs, dim_order, is_constant, is_quantize, is_dequantize, layout
The loaded plugins, their checks, and the per-op test harness
    registry, converter_problems, target_problems, check_op

Names that need torch, numpy or the LiteRT schema load on first use, so a plugin module that
imports only the contracts at its top stays cheap to describe (``etforge plugins``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from etforge.core.common.errors import ConversionError, EtforgeError, PluginError
from etforge.core.common.fallbacks import record as record_fallback
from etforge.core.common.isolated import run_isolated
from etforge.core.contracts.converter import (
    EVERY_NPU,
    SUPPORTED,
    Constraint,
    Elementwise,
    OpConverter,
    Support,
    elementwise,
    unsupported,
)
from etforge.core.contracts.cpu_backend import (
    LOWERING_NOTES_KEY,
    CpuBackend,
    HostArithmetic,
    KernelArg,
    KernelLibrary,
)
from etforge.core.contracts.hookspecs import hookimpl
from etforge.core.contracts.npu_compiler import NpuCompiler, NpuPayload, PartitionIo
from etforge.core.contracts.partition_check import PartitionCheck, ProposedPartition
from etforge.core.contracts.quant_rule import QuantRule
from etforge.core.contracts.rewrite import (
    Rewrite,
    attribute,
    batch_norm_affine,
    batch_norm_after,
    call,
    calls,
    constant,
    replace,
    val,
)
from etforge.core.contracts.target import NpuSpec, OptionSpec, TargetSpec
from etforge.core.contracts.verify_gate import GateInput, GateVerdict, VerifyGate
from etforge.core.graph import layout

if TYPE_CHECKING:
    pass

#: Deferred names and the module each comes from (they import torch, numpy or the schema).
_DEFERRED: dict[str, str] = {
    **dict.fromkeys(
        (
            "dim_order",
            "is_constant",
            "is_dequantize",
            "is_quantize",
            "node_op",
            "shape_of",
            "tensor_inputs",
            "tensor_meta",
        ),
        "etforge.core.graph.utils",
    ),
    **dict.fromkeys(("Quant", "enum", "options"), "etforge.core.litert.builder"),
    **dict.fromkeys(
        ("Constant", "ConversionContext", "Value", "activation", "padding"),
        "etforge.core.litert.context",
    ),
    **dict.fromkeys(
        (
            "arg",
            "bias_tensor",
            "choose_padding",
            "const_perm",
            "has_full_size_operand",
            "input_qparams",
            "output_qparams",
            "pad_spatial",
            "pair",
            "same_padding",
            "shares_qparams",
        ),
        "etforge.plugins.ops.helpers",
    ),
    **dict.fromkeys(("converter_problems", "target_problems"), "etforge.core.registry.checks"),
    **dict.fromkeys(("NotExact", "Out", "Q"), "etforge.runtime.arithmetic.operands"),
    "Reference": "etforge.runtime.arithmetic.device_ref",
    "registry": "etforge.core.registry.manager",
    "check_op": "etforge.testing",
}


def __getattr__(name: str) -> Any:
    module = _DEFERRED.get(name)
    if module is None:
        raise AttributeError(f"module 'etforge.sdk' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


__all__ = [
    "EVERY_NPU",
    "LOWERING_NOTES_KEY",
    "SUPPORTED",
    "Constraint",
    "ConversionError",
    "CpuBackend",
    "Elementwise",
    "GateInput",
    "GateVerdict",
    "EtforgeError",
    "HostArithmetic",
    "KernelArg",
    "KernelLibrary",
    "NpuCompiler",
    "NpuPayload",
    "NpuSpec",
    "OpConverter",
    "OptionSpec",
    "PartitionCheck",
    "PartitionIo",
    "PluginError",
    "ProposedPartition",
    "QuantRule",
    "Rewrite",
    "Support",
    "TargetSpec",
    "VerifyGate",
    "attribute",
    "batch_norm_affine",
    "batch_norm_after",
    "call",
    "replace",
    "calls",
    "constant",
    "elementwise",
    "hookimpl",
    "layout",
    "record_fallback",
    "run_isolated",
    "unsupported",
    "val",
    *sorted(_DEFERRED),
]
