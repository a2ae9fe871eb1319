"""Programs compiled for cortex-m33 run in ExecuTorch's C++ runtime, with CMSIS-NN and
etforge's generated registration, on QEMU's mps2-an505 (Cortex-M33), and compute exactly what
etforge's host interpreter of the same ``.pte`` computes.

The firmware libraries are built once per content (``runtime/firmware/build.py``) into the
pytest cache, so a CI run pays the cold build once and later runs none. Needs the Arm GNU
toolchain, newlib, qemu-system-arm (``.ci/setup`` installs them) and the ExecuTorch / CMSIS-NN
sources (``../shared/third_party`` in CI, or ``ETFORGE_EXECUTORCH_SRC`` / ``ETFORGE_CMSIS_NN_SRC``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from etforge.core.common.errors import EtforgeError
from etforge.runtime.firmware import build, conformance, device, sources

from support import compile_each, run_cli

ZOO = ["cifarnet", "ds_cnn", "resnet8", "autoencoder", "digits_cnn"]
#: Architecture-suite families (tests/models/architectures.py) whose cortex-m33 programs the
#: portable kernels used to refuse (mobilenet_v3_se, shufflenet: mixed dim orders) or miscompute
#: (unet: channels-last ``cat``), and two more conv-heavy ones (plugins/targets/dim_orders.py);
#: audio_conv1d's 1-D convs run as CMSIS-NN 2-D convs of height 1 (plugins/targets/cortex_m_conv1d.py).
FAMILIES = ["mobilenet_v3_se", "shufflenet", "unet", "efficientnet_lite", "dilated", "audio_conv1d"]
REALIGNED = {"mobilenet_v3_se", "shufflenet", "unet"}
#: Programs known to differ on the device (none: the host runs etforge's CMSIS-NN-exact kernels).
XFAIL: dict[str, str] = {}
SAMPLES = 3


#: Why the device runs cannot happen here, else None (other test files import it from here).
_missing = conformance.missing


pytestmark = pytest.mark.skipif(_missing() is not None, reason=str(_missing()))


@pytest.fixture(scope="module")
def outs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    found = compile_each([f"zoo:{m}" for m in ZOO], "cortex-m33", tmp_path_factory.mktemp("fw"))
    return {m: found[f"zoo:{m}"] for m in ZOO}


@pytest.fixture(scope="module")
def family_outs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The families compiled for cortex-m33 (with ``codegen/``, as ``etforge compile`` writes)."""
    from models.architectures import build

    import etforge

    root = tmp_path_factory.mktemp("families")
    outs = {}
    for family in FAMILIES:
        model, example, calibration = build(family)
        compiled = etforge.compile(model, example, target="cortex-m33", calibration=calibration)
        notes = [n for n in compiled.report["notes"] if n.startswith("dim orders:")]
        assert not [n for n in notes if "not aligned" in n], notes
        if family in REALIGNED:
            assert notes and "kernel call(s) changed" in notes[0], compiled.report["notes"]
        out = compiled.save(root / family)
        compiled.codegen(out / "codegen")
        outs[family] = out
    return outs


def _bit_exact(out: Path) -> None:
    v = device.verify(out, "qemu-m33", samples=SAMPLES)
    assert v.failures == [], v.failures
    assert v.identical == v.samples == SAMPLES
    # memory truth: what ExecuTorch planned on the device is the report's arena
    assert v.planned == v.report_arena and v.planned
    assert all(n > 0 for n in v.instructions)


@pytest.mark.parametrize(
    "model",
    [
        pytest.param(m, marks=pytest.mark.xfail(strict=True, reason=XFAIL[m])) if m in XFAIL else m
        for m in ZOO
    ],
)
def test_zoo_bit_exact_on_qemu(outs: dict[str, Path], model: str) -> None:
    _bit_exact(outs[model])


@pytest.mark.parametrize("family", FAMILIES)
def test_architecture_family_bit_exact_on_qemu(family_outs: dict[str, Path], family: str) -> None:
    """Every portable kernel call gets the dim orders its C++ kernel accepts: the device runs
    the program and computes what the host interpreter computes."""
    _bit_exact(family_outs[family])


def test_run_cli_on_given_inputs(outs: dict[str, Path], tmp_path: Path) -> None:
    """``run --inputs F.npz --save G.npz``: the device's outputs for those inputs, byte for byte
    the host interpreter's."""
    import numpy as np

    report, host = device._load(outs["cifarnet"])
    batches = device.seeded_inputs(report, 7, 2)
    given, saved = tmp_path / "in.npz", tmp_path / "out.npz"
    np.savez(given, x=np.stack([b[0].numpy() for b in batches]))
    proc = run_cli(
        "run", str(outs["cifarnet"]), "--on", "qemu-m33", "--inputs", str(given), "--save", str(saved)
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "emulator instruction count" in proc.stdout and "not device cycles" in proc.stdout
    got = np.load(saved)["out0"]
    assert len(got) == 2
    for s, batch in enumerate(batches):
        assert got[s].tobytes() == host.run(list(batch))[0].contiguous().numpy().tobytes()


def test_verify_cli_on_qemu(outs: dict[str, Path]) -> None:
    proc = run_cli("verify", str(outs["ds_cnn"]), "--runtime", "qemu-m33", "--samples", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2/2 samples" in proc.stdout and "verify passed on qemu-m33" in proc.stdout


def test_instruction_count_is_deterministic_and_per_op(outs: dict[str, Path]) -> None:
    """-icount makes the count a property of the program and inputs, not of the host's load;
    the per-op counts are the plan's kernel calls, in order, inside the inference's count."""
    a = device.run(outs["autoencoder"], samples=2)
    b = device.run(outs["autoencoder"], samples=2)
    assert a.qemu.instructions == b.qemu.instructions and a.qemu.instructions_per_tick > 0
    assert a.per_op == b.per_op and a.per_op, a.per_op_note
    ops = sources.selected_operators(outs["autoencoder"] / "codegen" / "selected_operators.yaml")
    assert {r["op"] for r in a.per_op} <= set(ops)
    assert 0 < sum(r["instructions"] for r in a.per_op) <= a.qemu.instructions[0]


def _copy(out: Path, dst: Path) -> Path:
    shutil.copytree(out, dst)
    return dst


def test_undersized_arena_fails_with_a_clear_line(outs: dict[str, Path]) -> None:
    arena = device._load(outs["cifarnet"])[0]["memory"]["arena_bytes"][0]
    with pytest.raises(
        EtforgeError,
        match=rf"memory id 1: ExecuTorch plans {arena} bytes, the image's arena .* holds {arena - 16}",
    ):
        device.verify(outs["cifarnet"], samples=1, arena_shrink=16)


def test_misregistered_kernel_fails_with_a_clear_line(outs: dict[str, Path], tmp_path: Path) -> None:
    """A registration whose quantize entry calls the dequantize kernel (same signature)."""
    out = _copy(outs["digits_cnn"], tmp_path / "swapped")
    reg = out / "codegen" / "etforge_model_kernels.cpp"
    text = reg.read_text()
    call = "cortex_m::native::quantize_per_tensor_out(context"
    assert call in text
    reg.write_text(text.replace(call, "cortex_m::native::dequantize_per_tensor_out(context"))
    with pytest.raises(
        EtforgeError, match=r"failed under QEMU: ExecuTorch abort: op_dequantize_per_tensor.cpp"
    ):
        device.verify(out, samples=1)


def test_npu_program_is_refused_before_building(tmp_path: Path) -> None:
    out = tmp_path / "npu"
    proc = run_cli("compile", "zoo:digits_mlp", "--target", "imxrt700", "-o", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = run_cli("verify", str(out), "--runtime", "qemu-m33", "--samples", "1")
    assert proc.returncode == 1
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "have no device runtime in the qemu-m33 image" in errors[0], proc.stderr


def test_the_runner_is_compiled_once_for_every_image_of_a_tree(outs: dict[str, Path], tmp_path: Path) -> None:
    """``runner.cpp`` names no program (``files/runner_image.h``): a new program's image
    compiles its registration and ``image_model.cpp``, links, and leaves the runner's object
    alone; the image still runs bit-exact (issue 47: ~0.75 CPU s less per image)."""
    out = _copy(outs["digits_cnn"], tmp_path / "own")
    reg = out / "codegen" / "etforge_model_kernels.cpp"
    reg.write_text(
        reg.read_text() + "\n// test_firmware: a program of its own, a new image over the same tree\n"
    )
    first = build.build_image(out)
    shutil.rmtree(first.elf.parent)  # this test's image alone: built again below
    lib, _, _ = build.build_libraries(sources.locate())
    runner = lib / "build" / "CMakeFiles" / "et_runner.dir" / "runner.cpp.obj"
    stamp = runner.stat().st_mtime_ns
    again = build.build_image(out)
    assert again.built == ["image"] and again.key == first.key and again.elf.is_file()
    assert runner.stat().st_mtime_ns == stamp
    assert "et_runner.dir/runner.cpp.obj" in (again.elf.parent / "runner.map").read_text()
    v = device.verify(out, "qemu-m33", samples=1)
    assert v.failures == [] and v.identical == 1, v.failures


def test_make_builds_the_image_where_ninja_is_missing(
    outs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ninja is the faster generator, not a requirement: without it on PATH the image tree is a
    Makefile tree of its own (another library key) and the program runs bit-exact."""
    had_ninja, with_ninja = shutil.which("ninja") is not None, build.library_key(sources.locate())
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in (*build.TOOLS, "qemu-system-arm", "sh"):
        os.symlink(shutil.which(tool), bin_dir / tool)
    monkeypatch.setenv("PATH", str(bin_dir))
    assert build.generator() == "Unix Makefiles" and build.missing_tools() == []
    assert (build.library_key(sources.locate()) != with_ninja) == had_ninja
    v = device.verify(outs["ds_cnn"], "qemu-m33", samples=1)
    assert v.failures == [] and v.identical == 1, v.failures
    lib, _, _ = build.build_libraries(sources.locate())
    assert (lib / "build" / "Makefile").is_file() and not (lib / "build" / "build.ninja").exists()


def test_build_progress_reads_make_and_ninja(capsys: pytest.CaptureFixture[str]) -> None:
    """The long first builds show their percentage from either tool's status lines."""
    import sys

    lines = [
        "[1/4] Building CXX object a.obj",
        "[2/4] Building CXX object b.obj",
        "[ 75%] Building C object c.obj",
    ]
    build._run([sys.executable, "-c", f"print({chr(10).join(lines)!r})"], "progress", "building x")
    err = capsys.readouterr().err
    assert "etforge: building x: 25% (1 files compiled)" in err
    assert "etforge: building x: 50% (2 files compiled)" in err
    assert "etforge: building x: 75% (3 files compiled)" in err
