"""``to_executorch``: the program's bytes, planned by etforge's memory planning."""

from __future__ import annotations

from executorch.exir import EdgeProgramManager, ExecutorchProgramManager
from torch.export import ExportedProgram

from etforge.core.lower import delegate_stubs


def serialize(edge: EdgeProgramManager, *sharing: ExportedProgram) -> ExecutorchProgramManager:
    """``to_executorch``, its passes seeing the delegates through shape stubs, its spec
    propagation without a second re-trace of a just re-traced graph (``spec_prop``).

    ``sharing``: programs that hold the same lowered modules (the host program ``edge`` was
    cloned from); their delegates get their originals back too, error or not."""
    import executorch.kernels.quantized  # noqa: F401  (out variants of quantized_decomposed ops)
    from executorch.exir import ExecutorchBackendConfig

    from etforge.core.serialize.memory_plan import planning_pass
    from etforge.core.serialize.spec_prop import fresh_spec_scope

    program = edge.exported_program()
    with delegate_stubs.shape_only(program, *sharing), fresh_spec_scope():
        et = edge.to_executorch(ExecutorchBackendConfig(memory_planning_pass=planning_pass()))
        delegate_stubs.restore(et.exported_program())
    return et
