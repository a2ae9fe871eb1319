"""Per-op parity of an NPU partition: each op against its device-exact reference, same inputs.

End to end, a deep int8 network amplifies single-element rounding differences (a value one
step off in an early layer becomes tens of steps at the output of a random-weight
MobileNet; the PT2E reference evaluated in float32 and in float64 already disagrees that
much). Here the partition's Edge program runs as the reference, but every int8 value the
LiteRT model also computed is checked against it and then *replaced* by LiteRT's (teacher
forcing), so each op is measured on exactly the inputs LiteRT gave it: a conversion error
shows up at the op that has it.

The reference of a quantize node is its op computed in the device's integer arithmetic
(``runtime.arithmetic.device_ref``) from the Edge op and its qparams, and LiteRT runs its reference
kernels (the device's arithmetic): a correct conversion is then exact, 0 values off. An op
with no device-exact rule yet is compared with torch's float evaluation (the <= 1 step rule)
and marked ``device_exact=False``; the torch comparison is kept as a figure for every op.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from etforge.core.graph import layout
from etforge.core.graph.utils import is_quantize
from etforge.core.litert import payload
from etforge.core.litert.builder import read_metadata
from etforge.runtime.execution import litert_run
from etforge.runtime.execution.cpu_libraries import host_library
from etforge.runtime.execution.host import program_inputs, run_program, stored_inputs


@dataclass(frozen=True)
class OpParity:
    partition: str
    node: str  # the Edge node whose int8 value was compared (the op, not its quantize node)
    max_steps: int
    elements_off: int
    elements: int
    #: values exactly one step off (a wrong constant shows as many of these; rounding, few)
    off_by_one: int = 0
    #: values of this node the check could not compare, and why (never silently dropped)
    skipped: int = 0
    skip_reason: str = ""
    #: compared with the device-exact reference (False: with torch, and ``reason`` says why)
    device_exact: bool = False
    reason: str = ""
    #: the first value off: "index (i, j, ...): ours a, reference b"
    first_off: str = ""
    #: the same values against torch's float evaluation of the quantized op (a figure)
    torch_max_steps: int = 0
    torch_values_off: int = 0
    #: the quantize node holding the compared value (the program's node name)
    qnode: str = ""


def _measure(partition: str, node: str, ours: torch.Tensor, ref: torch.Tensor, **extra: Any) -> OpParity:
    off = (ours.to(torch.int32) - ref.to(torch.int32)).abs()
    first = ""
    if off.numel() and bool((off > 0).any()):
        idx = tuple(int(i) for i in torch.nonzero(off > 0)[0])
        first = f"index {idx}: {int(ours[idx])} vs reference {int(ref[idx])}"
    return OpParity(
        partition, node, int(off.max()) if off.numel() else 0, int((off > 0).sum()), off.numel(),
        off_by_one=int((off == 1).sum()), first_off=first, **extra,
    )  # fmt: skip


#: LiteRT kernels that compute as the device does: the per-op check always runs these.
DEVICE_KERNELS = "reference"


def _skipped(partition: str, node: str, ref: torch.Tensor, reason: str, qnode: str = "") -> OpParity:
    return OpParity(partition, node, 0, 0, 0, skipped=ref.numel(), skip_reason=reason, qnode=qnode)


#: Why an int8 value of a partition was not compared.
SHAPE_MISMATCH = "LiteRT tensor shape differs from the reference value"
NOT_RECORDED = "no LiteRT tensor holds it in logical order: a channels-last flatten or an alias"


def op_parity(
    lowered: Any,
    args: Sequence[torch.Tensor],
    kernels: str = DEVICE_KERNELS,
    record: dict[str, torch.Tensor] | None = None,
) -> list[OpParity]:
    """Compare every int8 value of one delegate call with its reference op (teacher-forced).

    ``kernels``: LiteRT's kernel set; the device-exact references reproduce ``reference``.
    ``record`` collects LiteRT's int8 values by the partition's node names (the quantized
    program's: ``runtime.verification.simulate`` takes them for ops without a rule).
    """
    from etforge.runtime.arithmetic.device_ref import Reference
    from etforge.runtime.arithmetic.operands import NotExact

    blob = payload.unpack_for_host(bytes(lowered.processed_bytes))
    if not blob.format.startswith("litert"):
        return []
    values = json.loads(read_metadata(blob.data).get("etforge_int8_values", b"{}"))
    it = litert_run.interpreter(blob.data, kernels, preserve_all_tensors=True)
    litert_run.set_inputs(it, stored_inputs(blob, args))
    it.invoke()
    found: list[OpParity] = []

    def perm_of(node: torch.fx.Node) -> Any:
        return values[node.name][1] if node.name in values else None

    class Forced(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            ref = super().run_node(n)
            if n.op != "call_function" or not isinstance(ref, torch.Tensor) or ref.dtype != torch.int8:
                return ref
            src = n.args[0] if n.args and isinstance(n.args[0], torch.fx.Node) else n
            if n.name not in values:
                found.append(_skipped(blob.partition, src.name, ref, NOT_RECORDED, n.name))
                return ref
            index, perm = values[n.name]
            ours = torch.from_numpy(np.array(it.get_tensor(index))).permute(layout.inverse(perm))
            if tuple(ours.shape) != tuple(ref.shape):
                found.append(_skipped(blob.partition, src.name, ref, SHAPE_MISMATCH, n.name))
                return ref
            if record is not None:
                record[n.name] = ours
            off = (ours.to(torch.int32) - ref.to(torch.int32)).abs()
            vs_torch = {"torch_max_steps": int(off.max()) if off.numel() else 0,
                        "torch_values_off": int((off > 0).sum())}  # fmt: skip
            try:
                exact = Reference(lambda a: self.env[a], perm_of)(n)
            except NotExact as why:
                found.append(
                    _measure(blob.partition, src.name, ours, ref, reason=str(why), qnode=n.name, **vs_torch)
                )
                return laid_out_as(ours, ref)
            found.append(
                _measure(blob.partition, src.name, ours, exact, device_exact=True, qnode=n.name, **vs_torch)
            )
            return laid_out_as(ours, ref)

    program = lowered.original_module
    with torch.no_grad():
        Forced(program.graph_module, garbage_collect_values=False).run(*program_inputs(program, list(args)))
    return found


def _qep_name(node: torch.fx.Node) -> str | None:
    """The quantized program's node a lowered node came from (torch.fx provenance)."""
    sources = node.meta.get("from_node")
    return sources[-1].name if sources else None


def _delegate_output_name(n: torch.fx.Node) -> str | None:
    """The partition's own node a delegate output (``getitem``) holds: the Edge program inside
    the lowered module keeps the quantized program's node names, while the ``getitem``'s
    provenance names the observer it replaced (``activation_post_process_N``), which the
    quantized program does not have — the cause of the old forcing misses."""
    call = n.args[0] if n.args and isinstance(n.args[0], torch.fx.Node) else None
    if call is None or call.target is not torch.ops.higher_order.executorch_call_delegate:
        return None
    holder, index = call.args[0], n.args[1]
    gm = n.graph.owning_module
    lowered = (
        getattr(gm, holder.target, None) if isinstance(holder, torch.fx.Node) and gm is not None else None
    )
    original = getattr(lowered, "original_module", None)
    if original is None:
        return None
    out = next(x for x in original.graph.nodes if x.op == "output").args[0]
    outs = out if isinstance(out, (list, tuple)) else [out]
    node = outs[index] if isinstance(index, int) and index < len(outs) else None
    return node.name if isinstance(node, torch.fx.Node) else None


def _int8_result(node: torch.fx.Node) -> torch.fx.Node | None:
    """The quantize node holding ``node``'s int8 result (through fused activations)."""
    seen = 0
    while seen < 4:
        if "quantize_per_tensor" in str(node.target) and "dequantize" not in str(node.target):
            return node
        users = list(node.users)
        if len(users) != 1:
            return None
        node, seen = users[0], seen + 1
    return None


#: Portable int8 clamps: an activation applied to another kernel's output codes.
_CLAMPS = {"aten.clamp.default", "aten.relu.default", "aten.hardtanh.default"}

#: Which kernel computes a CPU op's value, and so which arithmetic its reference follows: a
#: CPU library with a host reference of its own (``CpuBackend.host_arithmetic``; CMSIS-NN's
#: ``cortex_m``) is named by its op namespace, its ops held to that reference; any other op
#: runs on ExecuTorch's portable kernels:
PORTABLE = "portable"  # dequantize, float op, quantize (torch's)


def kernel_kind(ns: str) -> str:
    """The kernel kind of a CPU op in namespace ``ns``: ``ns`` when a CPU library with a
    host reference owns it, else ``PORTABLE``."""
    library = host_library(ns)
    return ns if library is not None and library.reference is not None else PORTABLE


def library_rule(kind: str, value: Any, host_op: str) -> Any:
    """The device-exact rule of a CPU library's op ``host_op`` (kind ``kind``, not portable)."""
    library = host_library(kind)
    assert library is not None and library.reference is not None, kind
    return library.reference(value, host_op)


def cpu_reference(
    n: torch.fx.Node, kind: str, host_op: str, value: Any, torch_value: torch.Tensor
) -> tuple[torch.Tensor, str]:
    """The reference of CPU quantize node ``n`` of the quantized program and why it is not
    exact ("" when it is), given the interpreter's values (``value``) and torch's result.

    A CPU library's op (``host_op``; a Cortex-M op computes in CMSIS-NN's integer arithmetic)
    is held to the library's reference (``library_rule``; CMSIS-NN's is ``device_ref``'s
    TFLite rules, which it shares, with its own requantization where it differs). A portable op dequantizes, computes
    in float and quantizes, which is what torch runs for the quantized program: torch's value
    is its reference.
    """
    from etforge.runtime.arithmetic.operands import NotExact

    if kind == PORTABLE:
        return torch_value, ""
    try:
        return library_rule(kind, value, host_op)(n).reshape(torch_value.shape), ""
    except NotExact as why:
        return torch_value, str(why)


def observer_names(program: Any) -> dict[str, str]:
    """Observer -> quantize node of the quantized ``program`` (an ExportedProgram: its module
    drops the provenance). A quantize the lowering keeps (a portable CPU op's) names the
    observer it replaced (``activation_post_process_N``), not the quantize node."""
    names = {n.name for n in program.graph.nodes}
    aliases: dict[str, str] = {}
    for n in program.graph.nodes:
        observer = _qep_name(n) if is_quantize(n) else None
        if observer is not None and observer not in names:
            aliases.setdefault(observer, n.name)
    return aliases


#: An observed host value: (host node, kernel kind or "" (a delegate output), host op, value).
Produced = tuple[str, str, str, torch.Tensor]


class HostInt8Values:
    """Observer for ``run_program``: the int8 values of the host run that the PT2E program
    also computes, keyed by the PT2E node they came from (torch.fx provenance; a delegate
    output by the partition's node name)."""

    def __init__(self, aliases: dict[str, str] | None = None) -> None:
        #: observer name -> quantize node (``observer_names``): a portable quantize's provenance
        self.aliases = aliases or {}
        # PT2E node -> (host node, kernel kind or "" for a delegate output (forced only), host op, value)
        self.produced: dict[str, Produced] = {}

    def __call__(self, n: torch.fx.Node, out: Any) -> None:
        from etforge.core.graph.utils import node_op

        if n.op != "call_function" or not isinstance(out, torch.Tensor) or out.dtype != torch.int8:
            return
        if n.target is operator.getitem:
            name = _delegate_output_name(n) or _qep_name(n)
            if name is not None:
                self.produced[name] = (n.name, "", "", out.detach())
            return
        name = _qep_name(n)
        ns = node_op(n).split(".")[0]
        if name is not None:  # any other kernel is ExecuTorch's portable one (aten, dim_order_ops, ...)
            kind = kernel_kind(ns)
            self.produced[name] = (n.name, kind, node_op(n), out.detach())

    def forced(self, reference: torch.fx.GraphModule) -> dict[str, Produced]:
        """The observed values keyed by the quantize node of ``reference`` holding them."""
        by_name = {n.name: n for n in reference.graph.nodes}
        forced: dict[str, Produced] = {}
        for name, item in self.produced.items():  # host graph order
            src = by_name.get(name) or by_name.get(self.aliases.get(name, ""))
            q = _int8_result(src) if src is not None else None
            if q is None:
                continue
            before = forced.get(q.name)
            if before is not None and before[1] not in ("", PORTABLE) and item[2] in _CLAMPS:
                # A library's op (Cortex-M), then a portable clamp of its int8 output: the
                # activation the lowering could not fuse, run as its own kernel on the op's
                # codes (on the activation's qparams: plugins/targets/cortex_m_unfused.py).
                # Together they are the PT2E op with its activation: the op's reference.
                item = (item[0], before[1], before[2], item[3])
            forced[q.name] = item
        return forced

    def kinds(self, reference: torch.fx.GraphModule) -> dict[str, tuple[str, str]]:
        """Quantize node of ``reference`` -> (kernel kind, host op) for the CPU's values."""
        return {q: (kind, op) for q, (_, kind, op, _) in self.forced(reference).items() if kind}

    def values(self, reference: torch.fx.GraphModule) -> dict[str, torch.Tensor]:
        """Quantize node of ``reference`` -> the host's int8 value (CPU ops, partition outputs)."""
        return {q: item[3] for q, item in self.forced(reference).items()}

    def compare(self, reference: torch.fx.GraphModule, inputs: Sequence[torch.Tensor]) -> list[OpParity]:
        """Run ``reference`` (the PT2E module) with every observed value forced to the host's,
        each CPU op's value compared with its reference (``cpu_reference``) on those inputs."""
        forced = self.forced(reference)
        found: list[OpParity] = []

        class Forced(torch.fx.Interpreter):
            def run_node(self, n: torch.fx.Node) -> Any:
                ref = super().run_node(n)
                if n.name not in forced or not isinstance(ref, torch.Tensor):
                    return ref
                host_name, kind, host_op, ours = forced[n.name]
                if tuple(ours.shape) != tuple(ref.shape):
                    if kind:
                        found.append(_skipped("cpu", host_name, ref, SHAPE_MISMATCH, n.name))
                    return ref
                if kind:
                    exact, why = cpu_reference(n, kind, host_op, lambda a: self.env[a], ref)
                    off = (ours.to(torch.int32) - ref.to(torch.int32)).abs()
                    vs_torch = {"torch_max_steps": int(off.max()) if off.numel() else 0,
                                "torch_values_off": int((off > 0).sum())}  # fmt: skip
                    found.append(
                        _measure(
                            "cpu", host_name, ours, exact, device_exact=not why, reason=why, qnode=n.name,
                            **vs_torch,
                        )
                    )  # fmt: skip
                return laid_out_as(ours, ref)

        with torch.no_grad():
            Forced(reference, garbage_collect_values=False).run(*inputs)
        return found


def laid_out_as(value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``value`` (an observed or simulated value) with ``like``'s strides, as the interpreter's
    own value had them: a ``view`` downstream may depend on them (``torch.export`` drops a
    ``.contiguous()`` that was a no-op on the traced strides: HF's attention heads)."""
    if like.is_contiguous() or not _dense(like):
        return value.reshape(like.shape).contiguous()
    laid = torch.empty_strided(like.shape, like.stride(), dtype=value.dtype)
    return laid.copy_(value.reshape(like.shape))


def _dense(t: torch.Tensor) -> bool:
    """The tensor covers exactly ``numel`` consecutive elements of its storage, in some order."""
    dims = sorted((st, sz) for st, sz in zip(t.stride(), t.shape, strict=True) if sz != 1)
    expected = 1
    for st, sz in dims:
        if st != expected:
            return False
        expected *= sz
    return True


def cpu_op_parity(
    host: Any, reference: Any, inputs: Sequence[torch.Tensor], kernels: str = "default"
) -> list[OpParity]:
    """Each CPU op of the lowered program (CMSIS-NN / portable) against the reference op fed
    the same int8 inputs: the PT2E program runs with every value the host program also
    computed (NPU partition outputs included) forced to the host's."""
    values = HostInt8Values(observer_names(reference))
    run_program(host, inputs, kernels, observe=values)
    return values.compare(reference.module(check_guards=False), inputs)
