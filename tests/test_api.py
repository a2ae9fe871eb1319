"""The Python API: etforge.compile, and etforge.target() swapped into a plain ExecuTorch script."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from executorch.exir import to_edge_transform_and_lower
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

import etforge
from etforge.core.common.errors import EtforgeError


def _model() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], list[tuple[torch.Tensor, ...]]]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(32, 4),
    ).eval()
    g = torch.Generator().manual_seed(1)
    calib = [(torch.randn(1, 3, 4, 4, generator=g),) for _ in range(4)]
    return model, calib[0], calib


def _user_script(target_name: str) -> bytes:
    """What a user with an existing ExecuTorch script writes (README, 'Python API')."""
    model, example, calib = _model()
    target = etforge.target(target_name)
    model, example, calib = target.adapt(model, example, calib)  # channels-last on imxrt700cm
    exported = torch.export.export(model, example)
    prepared = prepare_pt2e(exported.module(check_guards=False), target.quantizer())
    for batch in calib:
        prepared(*batch)
    quantized = torch.export.export(convert_pt2e(prepared), example)
    edge = to_edge_transform_and_lower(
        quantized, partitioner=target.partitioners(), compile_config=target.compile_config()
    )
    edge = target.lower_cpu(edge)  # CMSIS-NN for what the NPU left (a no-op on imxrt700)
    return edge.to_executorch().buffer


@pytest.mark.parametrize("target_name", ["imxrt700", "imxrt700cm"])
def test_user_script_gives_the_same_pte_as_etforge_compile(target_name: str) -> None:
    model, example, calib = _model()
    compiled = etforge.compile(model, example, target=target_name, calibration=calib, lowering="classic")
    assert compiled.partitions and compiled.report["macs"]["npu_share"] == 1.0
    assert _user_script(target_name) == compiled.pte


def test_compiled_save_verify_codegen(tmp_path: Path) -> None:
    model, example, calib = _model()
    compiled = etforge.compile(model, example, target="imxrt700cm", calibration=calib)
    out = compiled.save(tmp_path / "out")
    assert (out / "model.pte").read_bytes() == compiled.pte
    check = compiled.verify(samples=8)
    assert check.ok and check.top1_vs_quantized == 8
    gen = compiled.codegen(tmp_path / "gen")
    assert set(gen.registered) == {"cortex_m::quantize_per_tensor.out", "cortex_m::dequantize_per_tensor.out"}


def test_unknown_target_and_option() -> None:
    with pytest.raises(EtforgeError, match="unknown target 'imx93'"):
        etforge.target("imx93")
    with pytest.raises(EtforgeError, match="unknown option"):
        etforge.target("imxrt700", turbo=True)


def test_compile_checks_the_memory_budget_like_the_cli() -> None:
    """``etforge.compile`` runs the CLI's compile session: ``memory_budget`` is its check."""
    model, example, calib = _model()
    with pytest.raises(EtforgeError, match=r"planned arena .* does not fit the memory budget 64 B"):
        etforge.compile(model, example, target="imxrt700", calibration=calib, memory_budget=64)
    fits = etforge.compile(model, example, target="imxrt700", calibration=calib, memory_budget=1 << 30)
    assert fits.report["memory"]["arena_bytes"], fits.report["memory"]


def test_compile_validates_options_like_the_cli() -> None:
    model, example, calib = _model()
    with pytest.raises(
        EtforgeError, match=r"unknown option 'turbo' for target 'imxrt700' \(known: .*min_partition_ops"
    ):
        etforge.compile(model, example, target="imxrt700", options={"turbo": True})
    with pytest.raises(
        EtforgeError, match=r"option 'min_partition_ops' takes int values like its default 1, got float 2.5"
    ):
        etforge.compile(model, example, target="imxrt700", options={"min_partition_ops": 2.5})
    with pytest.raises(EtforgeError, match=r"option 'min_partition_ops' takes an integer, got 'many'"):
        etforge.compile(model, example, target="imxrt700", options={"min_partition_ops": "many"})
    with pytest.raises(EtforgeError, match=r"calibration batch 0, input 0 holds 48 NaN"):
        etforge.compile(
            model, example, target="imxrt700", calibration=[(torch.full_like(example[0], float("nan")),)]
        )


# The README's "existing ExecuTorch script", verbatim in spirit, run in a fresh interpreter:
# a target whose program keeps quantize/dequantize ops on the CPU must work without any
# other import having registered their out variants first.
README_SCRIPT = """
import sys

import torch
from executorch.exir import to_edge_transform_and_lower
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

import etforge

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                            torch.nn.Linear(128, 4)).eval()
example = (torch.randn(1, 3, 4, 4),)
batches = [example]

target = etforge.target(sys.argv[1])
model, example, batches = target.adapt(model, example, batches)  # channels-last inside
prepared = prepare_pt2e(torch.export.export(model, example).module(check_guards=False), target.quantizer())
for batch in batches:
    prepared(*batch)
quantized = torch.export.export(convert_pt2e(prepared), example)
edge = to_edge_transform_and_lower(
    quantized, partitioner=target.partitioners(), compile_config=target.compile_config()
)
program = target.lower_cpu(edge).to_executorch()
assert len(program.buffer) > 0
"""

#: One interpreter runs the script's imports, then forks a child per target (``argv``: the
#: targets) that runs the rest with ``sys.argv[1]`` its target: each child starts from the
#: state a fresh interpreter has after those imports -- no target made, nothing registered --
#: without importing torch and ExecuTorch once per target (issue 47: 3-4 CPU s each).
FORKED = """
import os
import sys
import traceback

HEAD, _, BODY = SCRIPT.partition("\\nimport etforge\\n")
exec(HEAD + "\\nimport etforge\\n", globals())
children = {}
for name in sys.argv[1:]:
    pid = os.fork()
    if pid == 0:
        sys.argv[1:] = [name]
        try:
            exec(BODY, globals())
        except BaseException:
            sys.stderr.write(f"--- {name}\\n{traceback.format_exc()[-2000:]}")
            sys.stderr.flush()
            os._exit(1)
        os._exit(0)
    children[name] = pid
failed = [n for n, pid in children.items() if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0]
sys.exit(f"failed: {' '.join(failed)}" if failed else 0)
"""


def test_readme_script_works_for_every_target_in_a_fresh_process() -> None:
    from etforge.core.registry.manager import registry

    names = sorted(registry().targets)
    assert {"imxrt700", "imxrt700cm", "cortex-m33", "litert"} <= set(names)
    assert "\nimport etforge\n" in README_SCRIPT  # where the children part from the parent
    proc = subprocess.run(
        [sys.executable, "-c", f"SCRIPT = {README_SCRIPT!r}\n{FORKED}", *names],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-6000:]


def test_compiling_leaves_the_callers_module_as_it_was() -> None:
    """Cortex-M targets compile channels-last inside; the caller's module must not come back
    converted, or compiling it next for another target would give another program."""
    model, example, calib = _model()
    fresh = etforge.compile(model, example, target="imxrt700", calibration=calib).pte
    etforge.compile(model, example, target="imxrt700cm", calibration=calib)
    assert all(p.is_contiguous() for p in model.parameters())
    assert etforge.compile(model, example, target="imxrt700", calibration=calib).pte == fresh


def test_a_module_that_cannot_be_copied_is_converted_in_place_with_a_note() -> None:
    import threading

    model, example, calib = _model()
    model.lock = threading.Lock()  # deepcopy refuses a lock
    compiled = etforge.compile(model, example, target="imxrt700cm", calibration=calib)
    assert any("could not be copied" in n and "in place" in n for n in compiled.result.notes)
