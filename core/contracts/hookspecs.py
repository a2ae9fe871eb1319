"""The etforge plugin API.

A plugin is a module (or object) registered under the entry-point group ``etforge``::

    # pyproject.toml of your package
    [project.entry-points.etforge]
    my_ops = "my_package.my_ops"

Its hooks are plain functions decorated with :data:`hookimpl`. Every hook takes no
arguments and returns a list: plugins *describe* what they provide; the core decides when
to use it. Hook bodies must stay cheap and must not import torch or executorch, so that
``etforge plugins`` answers in well under a second; import heavy modules inside methods.

Built-in plugins are registered in etforge's own ``pyproject.toml`` exactly this way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from etforge.core.contracts.converter import OpConverter
    from etforge.core.contracts.cpu_backend import CpuBackend
    from etforge.core.contracts.npu_compiler import NpuCompiler
    from etforge.core.contracts.partition_check import PartitionCheck
    from etforge.core.contracts.quant_rule import QuantRule
    from etforge.core.contracts.rewrite import Rewrite
    from etforge.core.contracts.target import TargetSpec
    from etforge.core.contracts.verify_gate import VerifyGate

PROJECT = "etforge"
ENTRY_POINT_GROUP = "etforge"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def etforge_op_converters() -> list[OpConverter]:
    """Return op converters: instances of :class:`etforge.core.contracts.converter.OpConverter`.

    A converter names the Edge op overloads it handles as strings (``ops``), answers
    ``is_supported(node, target) -> Support`` for one Edge node on one target, and emits
    LiteRT operators in ``convert(node, ctx)``. When two converters claim the same op for
    the same target, the higher ``priority`` is asked first; the other is a fallback for
    nodes the winner refuses, and ``etforge plugins`` reports the conflict. Built-ins use
    priority 0, so ``priority = 10`` deliberately overrides one. ``targets`` names the NPUs
    the converter serves (target names, NPU families, or ``EVERY_NPU``); a converter that
    names none serves only NPUs that take any (``NpuSpec.takes_undeclared_converters``).

    Checked at load (a failure names the plugin; fatal with ``--strict``): ``ops`` and
    ``preserve`` are tuples of ``namespace.op.overload`` strings (never a bare string),
    ``litert`` / ``litert_ops`` are builtins of the installed LiteRT schema, ``dtypes`` are
    ``int8`` / ``float32``, each name in ``reads`` is declared by a loaded NPU spec, the hook
    function is marked ``@hookimpl``. ``constraints`` should be :class:`~etforge.core.contracts.converter.Constraint`
    objects, which ``is_supported`` applies before ``check``; plain text is only shown, and
    ``etforge plugins`` warns about it. While compiling, a support check that raises refuses
    the node naming the plugin (an error under ``--strict``); a failing ``convert`` names the
    converter and its plugin. An activation converter says which of its nodes fold into a
    producer with ``fused_activation(node)`` (producers ask ``ctx.fuse_activation``).

    Example::

        from etforge import hookimpl
        from etforge.core.contracts.converter import elementwise

        @hookimpl
        def etforge_op_converters():
            return [elementwise("aten.floor.default", "FLOOR", dtypes=("float32",))]
    """


@hookspec
def etforge_quantizer_rules() -> list[QuantRule]:
    """Return PT2E quantizer rules: instances of :class:`etforge.core.contracts.quant_rule.QuantRule`.

    A rule maps ATen op names (as ``torch.export`` produces them, e.g.
    ``"aten.conv2d.default"``) to how their inputs and output are quantized: ``kind`` is one
    of ``"weighted"`` (activation + per-channel weight + int32 bias), ``"io"`` (independent
    per-tensor activations), ``"shared"`` (output and inputs share the first input's
    qparams), ``"fixed"`` (output qparams fixed by the runtime, e.g. sigmoid 1/256, -128).
    ``fuse`` lists activations that share the producing op's output observer; the
    activation's own rule may restrict which of its nodes can (``fusable``). Rules
    belong to a ``scheme``; a target selects the schemes it composes its quantizer from.
    ``ops`` and ``fuse`` are checked at load like a converter's ``ops``. Two rules for one op
    in one scheme: the higher ``priority`` (then load order) annotates it, and ``etforge
    plugins`` reports the conflict, as it warns about rules for ops no converter handles.

    Example::

        @hookimpl
        def etforge_quantizer_rules():
            return [QuantRule(ops=("aten.floor.default",), kind="shared")]
    """


@hookspec
def etforge_targets() -> list[TargetSpec]:
    """Return target specs: instances of :class:`etforge.core.contracts.target.TargetSpec`.

    A target is data: its name, its NPU description (MAC count, kernel/stride/padding
    limits … consulted by the op converters' support checks), how the leftovers run on the
    CPU, the quantizer schemes it composes, and the compile options it accepts.

    Example::

        @hookimpl
        def etforge_targets():
            return [TargetSpec(name="toy", description="A toy NPU", npu=NpuSpec(family="toy"))]
    """


@hookspec
def etforge_npu_compilers() -> list[NpuCompiler]:
    """Return NPU compiler adapters: instances of :class:`etforge.core.contracts.npu_compiler.NpuCompiler`.

    An adapter turns one partition's LiteRT flatbuffer into the device payload
    (``compile(tflite, target, options) -> NpuPayload``). ``available()`` says whether its
    toolchain is installed and why not; an unavailable compiler makes the NPU partitions
    host-only, and the CLI and report say so.
    """


@hookspec
def etforge_cpu_backends() -> list[CpuBackend]:
    """Return CPU backends: instances of :class:`etforge.core.contracts.cpu_backend.CpuBackend`.

    A CPU backend runs what the NPU does not take (a target names it in
    ``cpu_fallback``). It may contribute a PT2E quantizer for the CPU-bound nodes (applied
    after the NPU rules, to the nodes they left alone), the Edge compile config, and a
    ``lower(ep)`` step that rewrites the leftover Edge ops into its kernels (e.g. CMSIS-NN).
    """


@hookspec
def etforge_rewrites() -> list[Rewrite]:
    """Return graph rewrites: instances of :class:`etforge.core.contracts.rewrite.Rewrite`.

    A rewrite turns a computation the target does not run well into an equivalent one it
    does (``hardsigmoid`` into ``relu6(x + 3) / 6``, ``split`` into slices …). It runs on the
    exported float ATen program before quantization, on the targets it ``applies_to``
    (``targets``: names or NPU families, ``None`` for all; ``npu_only``), in ``order``;
    ``apply(gm, target)`` edits the ``torch.fx.GraphModule`` in place and returns whether it
    changed anything. The compile then re-exports the graph, so the quantizer rules and the
    converters see the rewritten ops. ``etforge plugins`` lists the rewrites a plugin provides.

    Example::

        from etforge import hookimpl
        from etforge.core.contracts.rewrite import Rewrite

        class DropIdentity(Rewrite):
            description = "x * 1 -> x"

            def apply(self, gm, target):
                ...  # edit gm.graph; return True when it changed

        @hookimpl
        def etforge_rewrites():
            return [DropIdentity()]
    """


@hookspec
def etforge_partition_checks() -> list[PartitionCheck]:
    """Return partition checks: instances of :class:`etforge.core.contracts.partition_check.PartitionCheck`.

    A partition check states a rule of an NPU about whole partitions rather than single nodes
    (ExecuTorch's ``supports_partitioning_result`` is the model): e.g. the NPU compiler drops
    ops that compute nothing, so a partition of such ops only must stay on the CPU. After the
    converters have accepted nodes and the partitioner has grouped them, each check that
    ``applies_to`` the target (``targets``: names or NPU families, ``None`` for every NPU
    target) gets every proposed partition -- its nodes, the ops delegated in it and an
    ``is_noop(node)`` that asks the node's converter -- and returns ``{node: reason}`` for the
    delegated nodes to take off the NPU. The partitioner then groups the rest again and asks
    again, until nothing is refused; the reasons appear in the report. A check that raises
    fails the compile naming its plugin.

    Example::

        from etforge import hookimpl
        from etforge.core.contracts.partition_check import PartitionCheck

        class NoLoneOp(PartitionCheck):
            targets = ("toy",)
            description = "a partition of one op costs more than it saves"

            def refuse(self, partitions, target):
                return {
                    p.delegated[0]: "alone in its partition"
                    for p in partitions
                    if len(p.delegated) == 1
                }

        @hookimpl
        def etforge_partition_checks():
            return [NoLoneOp()]
    """


@hookspec
def etforge_verify_gates() -> list[VerifyGate]:
    """Return verify gates: instances of :class:`etforge.core.contracts.verify_gate.VerifyGate`.

    ``etforge verify`` (and ``Compiled.verify``) runs each after its built-in gates, in plugin
    order, with a :class:`~etforge.core.contracts.verify_gate.GateInput` (the output directory,
    report, rebuilt program, ``model.pte`` in the host interpreter, the seeded inputs and the
    Edge program's outputs); the verdict's failures fail verify, its notes are told. A gate
    that raises fails verify naming its plugin.

    Example::

        from etforge.sdk import GateVerdict, VerifyGate, hookimpl

        class FiniteOutputs(VerifyGate):
            name = "finite_outputs"
            description = "every output of model.pte is finite"

            def check(self, given):
                bad = [i for i, out in enumerate(given.edge_outputs) if not all(t.isfinite().all() for t in out)]
                return GateVerdict(failures=[f"sample {i}: a non-finite output" for i in bad])

        @hookimpl
        def etforge_verify_gates():
            return [FiniteOutputs()]
    """
