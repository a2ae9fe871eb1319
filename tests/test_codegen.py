"""Firmware codegen: exact operator sets, deterministic output, code that compiles for host and M33."""

from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

from etforge import zoo
from etforge.codegen import generate
from etforge.core.build import output
from etforge.core.build.report import build_report
from etforge.core.build.session import compile_model
from etforge.core.common.errors import EtforgeError
from etforge.core.registry.manager import registry

from support import run_cli

CASES = [
    (m, t)
    for m in ("cifarnet", "resnet8", "ds_cnn", "autoencoder")
    for t in ("imxrt700", "imxrt700cm", "cortex-m33")
]
INCLUDE = Path(sysconfig.get_paths()["purelib"]) / "executorch" / "include"
C10 = INCLUDE / "executorch" / "runtime" / "core" / "portable_type" / "c10"


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    reg = registry()
    out = {}
    for name, target in CASES:
        model, example = zoo.build(name)
        result = compile_model(model, example, target, calibration=zoo.calibration(name, 4), reg=reg)
        d = tmp_path_factory.mktemp(f"{name}-{target}")
        output.write_outputs(d, result, build_report(result, reg, f"zoo:{name}"))
        out[(name, target)] = d
    return out


def _independent_operators(pte: Path) -> set[str]:
    from executorch.codegen.tools.selective_build import _get_program_from_buffer, _get_program_operators

    return set(_get_program_operators(_get_program_from_buffer(pte.read_bytes())))


@pytest.mark.parametrize("case", CASES, ids=[f"{m}-{t}" for m, t in CASES])
def test_registered_operators_equal_the_programs(
    programs: dict[tuple[str, str], Path], case: tuple[str, str], tmp_path: Path
) -> None:
    pte = programs[case] / "model.pte"
    result = generate(pte, tmp_path)
    assert set(result.registered) == _independent_operators(pte)
    assert not result.missing
    yaml_text = (tmp_path / "selected_operators.yaml").read_text()
    for op in result.registered:
        assert f"  {op}:" in yaml_text


def test_generation_is_deterministic(programs: dict[tuple[str, str], Path], tmp_path: Path) -> None:
    pte = programs[("resnet8", "cortex-m33")] / "model.pte"
    a = generate(pte, tmp_path / "a", prefix="rt700_", namespace="fw::model")
    b = generate(pte, tmp_path / "b", prefix="rt700_", namespace="fw::model")
    assert a.files == b.files and set(a.files) == {p.name for p in (tmp_path / "a").iterdir()}


def _compile(cxx: list[str], gen: Path, tmp_path: Path) -> None:
    main = tmp_path / "main.cpp"
    header = next(gen.glob("*.h")).name
    main.write_text(
        f'#include "{header}"\nint etforge_init() {{ return static_cast<int>(etforge_model::register_kernels()); }}\n'
    )
    sources = [*gen.glob("*.cpp"), main]
    for src in sources:
        cmd = [*cxx, "-std=c++17", "-Wall", "-Werror", "-c", f"-I{INCLUDE}", f"-I{C10}", f"-I{gen}",
               "-DC10_USING_CUSTOM_GENERATED_MACROS", str(src), "-o", str(tmp_path / (src.stem + ".o"))]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True)
        assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stderr}"


@pytest.mark.parametrize("target", ["imxrt700", "imxrt700cm", "cortex-m33"])
def test_generated_code_compiles_on_host_and_for_cortex_m33(
    programs: dict[tuple[str, str], Path], target: str, tmp_path: Path
) -> None:
    gen = tmp_path / "gen"
    generate(programs[("resnet8", target)] / "model.pte", gen)
    _compile(["g++"], gen, tmp_path)
    arm = shutil.which("arm-none-eabi-g++")
    if arm is None:
        assert not os.environ.get("CI"), "CI must install gcc-arm-none-eabi"
        pytest.skip("arm-none-eabi-g++ not installed")
    # host-only NPU partitions (no SDK here) #error on the device unless explicitly allowed;
    # tests/test_cmake.py checks the refusal itself
    _compile([arm, "-mcpu=cortex-m33", "-mthumb", "-DETFORGE_ALLOW_HOST_ONLY"], gen, tmp_path)


def test_header_holds_memory_io_and_quantization(
    programs: dict[tuple[str, str], Path], tmp_path: Path
) -> None:
    d = programs[("resnet8", "imxrt700cm")]
    generate(d / "model.pte", tmp_path)
    header = (tmp_path / "etforge_model.h").read_text()
    import json

    report = json.loads((d / "report.json").read_text())
    assert f"kPteSize = {(d / 'model.pte').stat().st_size};" in header
    assert f"kArenaBytes[1] = {{ {report['memory']['arena_bytes'][0]} }};" in header
    assert "kInput0Sizes[] = { 1, 3, 32, 32 };" in header
    assert f"kInput0ZeroPoint = {report['io_quant']['inputs'][0]['zero_point']};" in header
    assert "Neutron kernel selection: absent" in header and "not installed" in header


def test_check_mode_and_cli(programs: dict[tuple[str, str], Path], tmp_path: Path) -> None:
    pte = programs[("cifarnet", "imxrt700")] / "model.pte"
    gen = tmp_path / "gen"
    assert run_cli("codegen", str(pte), "-o", str(gen)).returncode == 0
    proc = run_cli("codegen", str(pte), "-o", str(gen), "--check")
    assert proc.returncode == 0, proc.stderr
    (gen / "etforge_model.h").write_text("// edited by hand\n")
    proc = run_cli("codegen", str(pte), "-o", str(gen), "--check")
    assert proc.returncode == 1 and "etforge_model.h" in proc.stderr


def test_not_a_pte_and_truncated_pte(programs: dict[tuple[str, str], Path], tmp_path: Path) -> None:
    junk = tmp_path / "junk.pte"
    junk.write_bytes(b"\x00" * 64)
    with pytest.raises(EtforgeError, match="not an ExecuTorch program"):
        generate(junk, tmp_path / "g")
    data = (programs[("resnet8", "imxrt700")] / "model.pte").read_bytes()
    cut = tmp_path / "cut.pte"
    cut.write_bytes(data[: len(data) // 3])
    with pytest.raises(EtforgeError, match="truncated or corrupt"):
        generate(cut, tmp_path / "g")
    proc = run_cli("codegen", str(cut), "-o", str(tmp_path / "g"))
    assert proc.returncode == 1 and "cut.pte" in proc.stderr and "Traceback" not in proc.stderr


def test_operator_without_kernel_library(programs: dict[tuple[str, str], Path], tmp_path: Path) -> None:
    pte = programs[("resnet8", "cortex-m33")] / "model.pte"
    with pytest.raises(EtforgeError, match=r"no known kernel library provides cortex_m::"):
        generate(pte, tmp_path / "g", libraries=("portable",))
    result = generate(pte, tmp_path / "g", libraries=("portable",), allow_missing=True)
    assert result.missing and not result.registered
    assert (
        "operators without a kernel library: cortex_m::" in (tmp_path / "g" / "etforge_model.h").read_text()
    )


def test_neutron_kernel_selection_is_merged_when_the_sdk_wrote_it(
    programs: dict[tuple[str, str], Path], tmp_path: Path
) -> None:
    """The merge path: per-partition selection files (as the SDK dumps them) become one table."""
    import json
    import shutil

    out = tmp_path / "out"
    shutil.copytree(programs[("resnet8", "imxrt700cm")], out)
    report = json.loads((out / "report.json").read_text())
    report["partitions"][0]["kernel_selection"] = True
    (out / "report.json").write_text(json.dumps(report))
    name = report["partitions"][0]["name"]
    (out / "partitions" / f"{name}_kernel_selection.c").write_text(
        "const int neutron_kernels_" + name + "[] = {3, 1};\n"
    )
    gen = tmp_path / "gen"
    result = generate(out / "model.pte", gen)
    merged = (gen / "etforge_model_neutron_kernels.c").read_text()
    assert f"partition {name}" in merged and f"neutron_kernels_{name}[] = {{3, 1}};" in merged
    assert "kHasNeutronKernelSelection = true" in (gen / "etforge_model.h").read_text()
    assert "etforge_model_neutron_kernels.c" in (gen / "etforge_model.cmake").read_text()
    assert "etforge_model_neutron_kernels.c" in result.files
    proc = subprocess.run(["gcc", "-Wall", "-Werror", "-c", str(gen / "etforge_model_neutron_kernels.c"), "-o", str(tmp_path / "n.o")],
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
