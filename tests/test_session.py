"""The compile session's scoped state (core/build/session.py): the NPU backend finds its
lowering in the context, never through the compile specs, and nothing of a session outlives
its block."""

from __future__ import annotations

import pytest
import torch
from torch.export import ExportedProgram

from etforge.core.build.session import compile_model
from etforge.core.lower import npu_backend
from etforge.core.registry.manager import registry

from support import conv_head


def _lowered(ep: ExportedProgram) -> list[torch.nn.Module]:
    return [m for m in ep.graph_module.modules() if hasattr(m, "processed_bytes")]


def test_a_lowering_is_current_only_inside_its_block_and_blocks_nest() -> None:
    reg = registry()
    assert npu_backend.current_lowering() is None
    with npu_backend.lowering(reg) as outer:
        assert npu_backend.current_lowering() is outer
        with pytest.raises(RuntimeError, match="inner"), npu_backend.lowering(reg) as inner:
            assert npu_backend.current_lowering() is inner
            raise RuntimeError("inner")
        assert npu_backend.current_lowering() is outer
    assert npu_backend.current_lowering() is None


@pytest.mark.parametrize("lowering", ["early", "classic"])
def test_the_partitions_reach_the_session_and_their_specs_name_only_the_output(lowering: str) -> None:
    """Each partition the backend converted is the session's, and each delegate's compile
    specs (serialized into the .pte) are what determines its bytes: target, options,
    partition name; no per-process token."""
    model, calib = conv_head()
    result = compile_model(model, calib[0], "imxrt700", calibration=calib, early=lowering == "early")
    modules = _lowered(result.host_program)
    assert modules and len(modules) == len(result.partitions)
    assert {bytes(m.processed_bytes) for m in modules} == {p.processed for p in result.partitions}
    for m in modules:
        assert [s.key for s in m.compile_specs] == ["target", "options", "partition"], m.compile_specs
    assert npu_backend.current_lowering() is None
