"""Run in a child by tests: ExecuTorch's own NXP flow decides where each differential case goes.

Usage: ``python upstream_partition.py OUT.json [CASE_ID ...]`` with this directory (the SDK
test double) and ``tests/`` on ``PYTHONPATH``. One process for every case of
``neutron_differential_cases.CASES`` (upstream is imported once): strict export, upstream's
``NeutronQuantizer`` (which also runs its ATen passes, e.g. the grouped-convolution split),
then ``to_edge_transform_and_lower`` with upstream's Edge passes and its
``NeutronPartitioner``, as upstream's ``backends/nxp/tests/executorch_pipeline.py`` does,
the partitioner recording its tags and delegating nothing (the double cannot compile).
Writes ``{case: {"nodes": n, "delegated": k, "all": [[op, delegated], ...]}}`` (``all``:
every compute node; ``nodes``/``delegated``: those the case compares) or ``{"error": ...}``
when upstream's flow raises. A child, so that the double and upstream's SDK-dependent
modules never enter the test process's ``sys.modules``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

_QDQ = ("quantize_per_tensor", "dequantize_per_tensor", "quantize_per_channel", "dequantize_per_channel")


def _op_name(node: object) -> str:
    target = getattr(node, "target", None)
    inner = getattr(target, "_op", target)
    name = str(getattr(inner, "_name", None) or inner).replace("::", ".")  # "aten.add.Tensor" or "aten.pad"
    overload = getattr(inner, "_overloadname", "default") or "default"
    return name if name.endswith(f".{overload}") else f"{name}.{overload}"


def main(out: str, ids: list[str]) -> None:
    import logging

    import cia_memo
    from executorch.backends.nxp.backend.neutron_target_spec import NeutronTargetSpec
    from neutron_differential_cases import CASES

    from etforge.core.common import process_memory

    logging.disable(logging.WARNING)
    cia_memo.install()  # every case's three run_decompositions: the same op collection
    # The collector as the etforge command tunes its own: young collections rarer, the imports
    # never scanned again. It was a fifth of this child's CPU.
    process_memory.tune_collector()
    process_memory.settle()
    spec = NeutronTargetSpec("imxrt700")
    result: dict[str, object] = {}
    for case in CASES:
        if ids and case.id not in ids:
            continue
        try:
            result[case.id] = _decide(case, spec)
        except Exception as exc:  # upstream's own failure is a result too
            result[case.id] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    Path(out).write_text(json.dumps(result, indent=1, sort_keys=True))


def _recording(base: Any) -> Any:
    """Upstream's partitioner, made to record its tags and then delegate nothing.

    Used through ``to_edge_transform_and_lower`` exactly as upstream's own pipeline
    (``backends/nxp/tests/executorch_pipeline.py``) uses it, so ``ops_to_not_decompose``
    keeps only the nodes its filter accepts (an ``aten.pad`` only in reflect mode); returning
    no tags afterwards skips the preprocessing, which the SDK double cannot do.
    """
    from executorch.backends.nxp.neutron_partitioner import NXP_DELEGATION_TAG
    from executorch.exir.backend.partitioner import PartitionResult

    class Recording(base):  # type: ignore[misc, valid-type]
        decided: list[tuple[str, bool]] = []

        def partition(self, exported_program: Any) -> Any:
            super().partition(exported_program)
            self.decided = []
            for n in exported_program.graph_module.graph.nodes:
                tagged = n.meta.pop(NXP_DELEGATION_TAG, None) is not None
                if n.op == "call_function" and not any(q in _op_name(n) for q in _QDQ):
                    if "getitem" not in _op_name(n):
                        self.decided.append((_op_name(n), tagged))
            return PartitionResult(tagged_exported_program=exported_program, partition_tags={})

    return Recording


def _decide(case: Any, spec: Any) -> dict[str, Any]:
    import torch
    from executorch.backends.nxp.backend.custom_delegation_options import CustomDelegationOptions
    from executorch.backends.nxp.edge_passes.neutron_edge_pass_manager import NeutronEdgePassManager
    from executorch.backends.nxp.neutron_partitioner import NeutronPartitioner
    from executorch.backends.nxp.nxp_backend import (
        core_aten_ops_exception_list,
        generate_neutron_compile_spec,
    )
    from executorch.backends.nxp.quantizer.neutron_quantizer import NeutronQuantizer
    from executorch.backends.nxp.quantizer.utils import calibrate_and_quantize
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower
    from neutron_differential_cases import Module, inputs, matches

    model = Module(case).eval()
    example = inputs(case, 0)
    ep = torch.export.export(model, example, strict=True)  # as upstream: its patterns need it
    quantized = calibrate_and_quantize(
        model=ep,
        calibration_inputs=[inputs(case, s) for s in range(3)],
        quantizer=NeutronQuantizer(spec),
    )
    # fresh lists each time: ExecuTorch's verifiers extend the lists they are handed in
    # place, so a shared list (upstream's module-level one included) doubles per call and
    # the run grew exponentially slower case after case
    preserve = [torch.ops.aten.prelu.default, torch.ops.aten.pad.default, torch.ops.aten.hardswish.default]
    partitioner = _recording(NeutronPartitioner)(
        generate_neutron_compile_spec("imxrt700"),
        spec,
        CustomDelegationOptions(),
        quantized.state_dict(),
        preserve_ops=preserve,
    )
    to_edge_transform_and_lower(
        torch.export.export(quantized, example, strict=True),
        transform_passes=NeutronEdgePassManager(),
        partitioner=[partitioner],
        compile_config=EdgeCompileConfig(
            _check_ir_validity=False,
            _core_aten_ops_exception_list=list(core_aten_ops_exception_list),
        ),
    )
    compute = partitioner.decided
    mine = [d for op, d in compute if matches(case, op)]
    return {"nodes": len(mine), "delegated": sum(mine), "all": compute}


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
