"""Memory on the RT700: CMSIS-NN scratch buffers planned with the rest, CPU/ISA options, budgets."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from etforge import zoo
from etforge.core.build.session import compile_model
from etforge.core.common.errors import EtforgeError
from etforge.core.serialize.memory import memory_stats

from support import CMSIS_NN, cmsis_nn_library, run_cli


def _compile(options: dict[str, str], target: str = "cortex-m33") -> object:
    model, example = zoo.build("ds_cnn")
    return compile_model(model, example, target, calibration=zoo.calibration("ds_cnn", 2), options=options)


#: ISA -> the size variant ``size_*`` in tests/cmsis_nn_shim.c asks CMSIS-NN for.
ISA_CODES = {"scalar": 0, "dsp": 1, "mve": 2}


@pytest.fixture(scope="module")
def cmsis_nn(request: pytest.FixtureRequest) -> ctypes.CDLL:
    built = cmsis_nn_library(Path(request.config.cache.mkdir("cmsis-nn-host")))
    assert built is not None, f"CMSIS-NN sources not found at {CMSIS_NN} (set ETFORGE_THIRD_PARTY)"
    return built


def _shape(node: object) -> list[int]:
    return [int(d) for d in node.meta["val"].shape]  # type: ignore[attr-defined]


def _device_size(lib: ctypes.CDLL, node: object, isa: str) -> int:
    """The scratch bytes the device's op wrapper requires of ``node`` (cortex_m ``op_quantized_*.cpp``:
    CMSIS-NN's own ``arm_*_get_buffer_size`` on the dims it builds from the tensors), computed by
    CMSIS-NN's C from the node's arguments: independent of ExecuTorch's Python size functions,
    which planned the buffer."""
    op, args, code = str(node.target), node.args, ISA_CODES[isa]  # type: ignore[attr-defined]
    n, c, h, w = _shape(args[0])  # logical NCHW, as the wrapper reads input.size(1..3)
    _, oc, oh, ow = _shape(node)
    if op == "cortex_m.quantized_conv2d.out":
        o, kh, kw, ki = _shape(args[1])  # OHWI
        (sh, sw), (ph, pw), (dh, dw) = args[3], args[4], args[5]
        return lib.size_conv(
            code, n, h, w, c, o, kh, kw, ki, oh, ow, sh, sw, ph, pw, dh, dw, *args[6:8], *args[10:12]
        )
    if op == "cortex_m.quantized_depthwise_conv2d.out":
        _, kh, kw, _ = _shape(args[1])  # IHWO
        (sh, sw), (ph, pw), (dh, dw) = args[3], args[4], args[5]
        return lib.size_dw(
            code, n, h, w, c, kh, kw, oc, oh, ow, sh, sw, ph, pw, dh, dw, *args[6:9], *args[11:13]
        )
    if op == "cortex_m.quantized_avg_pool2d.out":
        return lib.size_avgpool(code, ow, c)
    raise AssertionError(f"{op} has a scratch buffer this test has no CMSIS-NN size function for: add it")


@pytest.mark.parametrize(
    ("options", "isa"),
    [
        ({"cpu": "cortex-m55", "isa": "scalar"}, "scalar"),
        ({"cpu": "cortex-m55", "isa": "mve"}, "mve"),
        ({}, "dsp"),
    ],
    ids=["m55-scalar", "m55-mve", "m33-default-dsp"],
)
def test_scratch_buffers_are_the_sizes_the_device_kernels_require(
    options: dict[str, str], isa: str, cmsis_nn: ctypes.CDLL
) -> None:
    """Every planned CMSIS-NN scratch buffer has exactly the size the device's op wrapper checks
    (cortex-m33 builds CMSIS-NN with its DSP extension, a cortex-m55 with MVE or as chosen)."""
    result = _compile(options)
    program = result.executorch.exported_program()  # type: ignore[attr-defined]
    stats = memory_stats(result.executorch)  # type: ignore[attr-defined]
    assert stats.scratch, "no CMSIS-NN scratch buffers in the planned program"
    nodes = {n.name: n for n in program.graph.nodes}
    planned = {s["node"]: s["bytes"] for s in stats.scratch}
    required = {name: _device_size(cmsis_nn, nodes[name], isa) for name in planned}
    assert planned == required
    # ds_cnn's kernels need scratch with DSP and MVE; CMSIS-NN's plain C ones need none
    assert any(required.values()) == (isa != "scalar"), required
    assert stats.lower_bound <= sum(stats.arena_bytes)


def test_changing_the_isa_changes_scratch_and_arena() -> None:
    scalar = memory_stats(_compile({"cpu": "cortex-m55", "isa": "scalar"}).executorch)  # type: ignore[attr-defined]
    mve = memory_stats(_compile({"cpu": "cortex-m55", "isa": "mve"}).executorch)  # type: ignore[attr-defined]
    assert sum(s["bytes"] for s in mve.scratch) > sum(s["bytes"] for s in scalar.scratch)
    assert sum(mve.arena_bytes) > sum(scalar.arena_bytes)


def test_isa_is_validated_against_the_core() -> None:
    with pytest.raises(EtforgeError, match="isa=mve on cpu=cortex-m33.*not supported on M33"):
        _compile({"isa": "mve"})


def test_memory_budget_names_the_peak(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = run_cli(
        "compile", "zoo:ds_cnn", "--target", "cortex-m33", "-o", str(out), "--memory-budget", "1000"
    )
    assert proc.returncode == 1
    assert "does not fit the memory budget 1,000 B" in proc.stderr and "peak live memory" in proc.stderr
    assert "cortex_m_" in proc.stderr  # the nodes alive at the peak
    assert not (out / "model.pte").exists()


def _plan(program: object) -> list[tuple[int, int, int, int, int]]:
    """(mem_id, offset, size, first, last) of every planned activation."""
    seen, plan = set(), []
    for node in program.graph.nodes:  # type: ignore[attr-defined]
        specs = node.meta.get("spec")
        for spec in specs if isinstance(specs, (list, tuple)) else [specs]:
            if spec is None or id(spec) in seen or getattr(spec, "const", False) or spec.mem_id is None:
                continue
            seen.add(id(spec))
            if spec.lifetime[0] is not None:
                plan.append((spec.mem_id, spec.mem_offset, spec.allocated_memory, *spec.lifetime))
    return plan


def test_arena_plan_is_valid_and_beats_executorch_greedy() -> None:
    """autoencoder on the NPU: greedy buckets strand a tensor; best_fit reaches the lower bound."""
    from executorch.exir import EdgeProgramManager

    from etforge.core.build import pipeline

    model, example = zoo.build("autoencoder")
    result = compile_model(model, example, "imxrt700", calibration=zoo.calibration("autoencoder", 2))
    plan = _plan(result.executorch.exported_program())
    for i, (m1, o1, s1, a1, b1) in enumerate(plan):
        for m2, o2, s2, a2, b2 in plan[i + 1 :]:
            alive_together = not (b1 < a2 or b2 < a1)
            assert not (m1 == m2 and alive_together and o1 < o2 + s2 and o2 < o1 + s1), "overlapping tensors"
    stats = memory_stats(result.executorch)
    default = EdgeProgramManager(
        {"forward": pipeline.clone_program(result.host_program)}, compile_config=result.edge.compile_config
    ).to_executorch()
    greedy = sum(default.executorch_program.execution_plan[0].non_const_buffer_sizes[1:])
    assert sum(stats.arena_bytes) == stats.lower_bound < greedy


def _read_constants(program: object) -> set[int]:
    """Constant buffers an instruction of the serialized program reads (directly or in a list)."""
    plan = program.execution_plan[0]  # type: ignore[attr-defined]
    used: set[int] = set()
    for chain in plan.chains:
        for ins in chain.instructions:
            args = getattr(ins.instr_args, "args", None) or []
            for i in args:
                val = plan.values[i].val
                items = getattr(val, "items", None)
                for j in [i, *(items or [])] if not isinstance(items, str) else [i]:
                    idx = getattr(plan.values[j].val, "data_buffer_idx", 0)
                    if idx:
                        used.add(idx)
    return used


def test_flash_holds_no_dead_constant() -> None:
    """ds_cnn on Cortex-M: a Cortex-M pass swaps each weight for an NHWC copy and leaves the
    old buffer behind, which the emitter serialized; every constant must now be read."""
    result = _compile({})
    program = result.executorch.executorch_program  # type: ignore[attr-defined]
    stored = {i for i, b in enumerate(program.constant_buffer) if len(b.storage)}
    assert stored == _read_constants(program)
    stats = memory_stats(result.executorch)  # type: ignore[attr-defined]
    assert stats.flash_bytes == sum(len(b.storage) for b in program.constant_buffer) < len(result.pte)  # type: ignore[attr-defined]
