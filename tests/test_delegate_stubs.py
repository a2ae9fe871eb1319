"""Shape stubs for delegates (core/lower/delegate_stubs.py) change nothing but the time.

ExecuTorch's passes re-trace each delegate's original program to learn its output shapes;
the stub answers with the shapes the call node carries. The bytes serialized with stubs
must equal the bytes serialized without, and every delegate gets its original back.
"""

from __future__ import annotations

import pytest
import torch
from executorch.exir import EdgeProgramManager, ExecutorchBackendConfig
from torch.export import ExportedProgram

from etforge.core.build import pipeline
from etforge.core.build.session import compile_model
from etforge.core.lower import delegate_stubs
from etforge.core.registry.manager import registry
from etforge.core.serialize.memory_plan import planning_pass

from support import conv_head


def _compiled(target: str) -> object:
    model, calib = conv_head()
    return compile_model(model, calib[0], target, calibration=calib)


def _lowered(ep: ExportedProgram) -> list[torch.nn.Module]:
    return [m for m in ep.graph_module.modules() if hasattr(m, "processed_bytes")]


def _plain(ep: ExportedProgram, config: object) -> bytes:
    edge = EdgeProgramManager({"forward": pipeline.clone_program(ep)}, compile_config=config)
    return edge.to_executorch(ExecutorchBackendConfig(memory_planning_pass=planning_pass())).buffer


@pytest.mark.parametrize("target", ["imxrt700", "imxrt700cm"])
def test_serialize_with_stubs_gives_the_bytes_of_serialize_without(target: str) -> None:
    result = _compiled(target)
    host = result.host_program
    assert _lowered(host) and all(isinstance(m.original_module, ExportedProgram) for m in _lowered(host))
    stubbed = result.pte  # the compile serialized through the stubs
    assert stubbed == _plain(host, result.edge.compile_config)
    assert all(isinstance(m.original_module, ExportedProgram) for m in _lowered(host))


def test_cpu_lowering_with_stubs_gives_the_program_lowered_without() -> None:
    result = _compiled("imxrt700cm")
    reg = registry()
    tgt = reg.target("imxrt700cm")
    cpu = reg.cpu_backend(tgt)
    config = result.edge.compile_config
    plain = cpu.lower(pipeline.clone_program(result.host_program), tgt, result.options)
    work = pipeline.clone_program(result.host_program)
    with delegate_stubs.shape_only(work, result.host_program):
        assert any(
            isinstance(m._original_exported_program, delegate_stubs.StubProgram) for m in _lowered(work)
        )
        stubbed = cpu.lower(work, tgt, result.options)
        delegate_stubs.restore(stubbed)
    assert all(isinstance(m.original_module, ExportedProgram) for m in _lowered(stubbed))
    assert _plain(stubbed, config) == _plain(plain, config)


def test_originals_come_back_when_the_passes_fail() -> None:
    host = _compiled("imxrt700").host_program
    with pytest.raises(RuntimeError, match="a pass failed"), delegate_stubs.shape_only(host):
        (lm,) = _lowered(host)
        assert isinstance(lm._original_exported_program, delegate_stubs.StubProgram)
        assert lm.original_module.graph is lm._original_exported_program.original.graph
        raise RuntimeError("a pass failed")
    assert all(isinstance(m.original_module, ExportedProgram) for m in _lowered(host))
