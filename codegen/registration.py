"""Kernel registration entries, built with ExecuTorch's own codegen API (unboxing, signatures).

Logic lives here; the template only lays the entries out.
"""

from __future__ import annotations

from dataclasses import dataclass

from etforge.codegen.kernels import KernelInfo


@dataclass(frozen=True)
class KernelEntry:
    op: str
    schema: str
    library: str
    namespace: str  # C++ namespace of the kernel function
    declaration: str  # the kernel's prototype (defined by the kernel library)
    unboxing: list[str]  # statements turning the EValue stack into typed arguments
    call: str  # the kernel call
    stack_size: int
    after_call: str  # return-value handling


def _tags(op: str) -> set[str]:
    """The tags torch gives the operator (``native_functions.yaml``'s), none for ops torch
    does not know (``cortex_m::``, ``quantized_decomposed::`` out variants may be absent)."""
    from etforge.codegen.kernels import torch_facts

    return set(torch_facts()["tags"].get(op, ()))


def build_entry(kernel: KernelInfo) -> KernelEntry:
    from executorch.codegen.api.et_cpp import argumenttype_type
    from executorch.codegen.api.types import ExecutorchCppSignature
    from executorch.codegen.api.unboxing import Unboxing
    from torchgen import local
    from torchgen.model import Location, NativeFunction

    _, _, rest = kernel.schema.partition("::")
    tags = _tags(kernel.op)
    with local.parametrize(use_const_ref_for_mutable_tensors=False, use_ilistref_for_tensor_lists=False):
        f, _ = NativeFunction.from_yaml(
            # ``dispatch: {}`` as ExecuTorch's own yaml declares ``full_like.out``: torchgen
            # otherwise asserts that a factory-like op (``*_like``, ``new_*``) names its
            # CompositeExplicitAutograd kernel, an authoring rule for ATen that says nothing
            # about the unboxing this needs. The op's own tags (``nondeterministic_seeded`` on
            # ``rand.out``, ``native_dropout.out``) satisfy torchgen's tag checks.
            {"func": rest, "variants": "function", "dispatch": {}, "tags": sorted(tags)},
            Location("etforge", 0),
            valid_tags=tags | {"out"},
        )
        sig = ExecutorchCppSignature.from_native_function(f)
        bindings, code = Unboxing(argument_type_gen=argumenttype_type).convert_arguments(
            sig.arguments(include_context=False)
        )
        declaration = sig.decl(name=kernel.function, include_context=True) + ";"
    unboxing = [line.strip() for chunk in code for line in chunk.splitlines() if line.strip()]
    args = ", ".join(["context", *(b.name for b in bindings)])
    after = ""
    if not f.func.arguments.out:
        after = f"*stack[{len(bindings)}] = EValue(result_);"
        call = f"auto result_ = {kernel.cpp_namespace}::{kernel.function}({args});"
    else:
        call = f"{kernel.cpp_namespace}::{kernel.function}({args});"
    return KernelEntry(
        op=kernel.op,
        schema=kernel.schema,
        library=kernel.library,
        namespace=kernel.cpp_namespace,
        declaration=declaration,
        unboxing=unboxing,
        call=call,
        stack_size=len(bindings) + 1,
        after_call=after,
    )
