"""A firmware-style CMake build consumes the generated fragment and builds for the Cortex-M33.

The project lives in its own directory, away from the generated files, and reaches them
only through ``include()`` and ``etforge_model_add_to_target`` -- so the fragment's include
directory must be its own, not the caller's. A program whose NPU partitions are host-only
(compiled without the eIQ Neutron SDK) must refuse to build for the device, saying why; with
the SDK's device payload (the test double of tests/sdk_double) it builds.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest
from shared_outputs import compile_once

from support import REPO

MODEL = f"{REPO / 'tests' / 'models' / 'user_models.py'}:small"
DOUBLE = REPO / "tests" / "sdk_double"
INCLUDE = Path(sysconfig.get_paths()["purelib"]) / "executorch" / "include"
C10 = INCLUDE / "executorch" / "runtime" / "core" / "portable_type" / "c10"

TOOLCHAIN = """\
set(CMAKE_SYSTEM_NAME Generic)
set(CMAKE_SYSTEM_PROCESSOR arm)
set(CMAKE_C_COMPILER arm-none-eabi-gcc)
set(CMAKE_CXX_COMPILER arm-none-eabi-g++)
set(CMAKE_TRY_COMPILE_TARGET_TYPE STATIC_LIBRARY)
set(CMAKE_C_FLAGS_INIT "-mcpu=cortex-m33 -mthumb")
set(CMAKE_CXX_FLAGS_INIT "-mcpu=cortex-m33 -mthumb")
"""

PROJECT = """\
cmake_minimum_required(VERSION 3.20)
project(firmware LANGUAGES C CXX)
include("${ETFORGE_GEN}/etforge_model.cmake")
add_library(firmware STATIC main.cpp)
# What the firmware's ExecuTorch build provides: its headers and their configuration.
target_include_directories(firmware PRIVATE "${ET_INCLUDE}" "${ET_C10}")
target_compile_definitions(firmware PRIVATE C10_USING_CUSTOM_GENERATED_MACROS ${EXTRA_DEFINES})
target_compile_options(firmware PRIVATE -Wall -Werror)
etforge_model_add_to_target(firmware)
"""

MAIN = """\
#include "etforge_model.h"  // found only through the fragment's include directory

int firmware_register_model() { return static_cast<int>(etforge_model::register_kernels()); }
bool firmware_model_runs_on_device() { return etforge_model::kAllDelegatesOnDevice; }
"""

SDK_MESSAGE = "install the eIQ Neutron SDK"


def _tools() -> None:
    missing = [t for t in ("cmake", "arm-none-eabi-gcc", "arm-none-eabi-g++") if shutil.which(t) is None]
    if missing:
        assert not os.environ.get("CI"), f"CI must install {', '.join(missing)} (.ci/setup)"
        pytest.skip(f"not installed: {', '.join(missing)}")


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """OUT/codegen of the same model compiled without the SDK and with the SDK double."""
    _tools()
    gens = {}
    for kind in ("host-only", "device"):
        out = tmp_path_factory.mktemp(kind) / "out"
        sdk = {"pythonpath": DOUBLE, "env": {"ETFORGE_SDK_DOUBLE": "v1"}} if kind == "device" else {}
        proc = compile_once(MODEL, "--target", "imxrt700", out=out, **sdk)  # as other files compile it
        assert proc.returncode == 0, proc.stdout + proc.stderr
        gens[kind] = out / "codegen"
    return gens


def _build(gen: Path, tmp: Path, *defines: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    src, build = tmp / "firmware", tmp / "build"
    src.mkdir(parents=True)
    (src / "CMakeLists.txt").write_text(PROJECT)
    (src / "main.cpp").write_text(MAIN)
    (src / "cortex-m33.cmake").write_text(TOOLCHAIN)
    configure = subprocess.run(
        ["cmake", "-S", str(src), "-B", str(build), "-G", "Unix Makefiles",
         f"-DCMAKE_TOOLCHAIN_FILE={src / 'cortex-m33.cmake'}", "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON",
         f"-DETFORGE_GEN={gen}",
         f"-DET_INCLUDE={INCLUDE}", f"-DET_C10={C10}", f"-DEXTRA_DEFINES={';'.join(defines)}"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert configure.returncode == 0, configure.stdout + configure.stderr
    proc = subprocess.run(
        ["cmake", "--build", str(build), "--", "-k"], capture_output=True, text=True, timeout=900
    )
    return proc, build / "libfirmware.a"


def test_device_payload_builds_for_cortex_m33(generated: dict[str, Path], tmp_path: Path) -> None:
    gen = generated["device"]
    header = (gen / "etforge_model.h").read_text()
    assert "kAllDelegatesOnDevice = true" in header and "NeutronBackend" in header
    proc, lib = _build(gen, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    members = subprocess.run(["arm-none-eabi-ar", "t", str(lib)], capture_output=True, text=True).stdout
    for name in ("main.cpp", "etforge_model_kernels.cpp", "etforge_model_neutron_kernels.c"):
        assert f"{name}.o" in members, members  # the SDK's kernel selection is built too
    # every object is Armv8-M mainline Thumb code with the DSP extension: a Cortex-M33 build
    attrs = subprocess.run(["arm-none-eabi-readelf", "-A", str(lib)], capture_output=True, text=True).stdout
    assert attrs.count("Tag_CPU_arch: v8-M.mainline") == 3 and attrs.count("Tag_DSP_extension: Allowed") == 3
    commands = json.loads((lib.parent / "compile_commands.json").read_text())
    assert len(commands) == 3 and all("-mcpu=cortex-m33 -mthumb" in c["command"] for c in commands)


def test_host_only_program_refuses_to_build_for_the_device(
    generated: dict[str, Path], tmp_path: Path
) -> None:
    gen = generated["host-only"]
    header = (gen / "etforge_model.h").read_text()
    assert "kAllDelegatesOnDevice = false" in header and "etforge_0" in header
    proc, lib = _build(gen, tmp_path / "refused")
    assert proc.returncode != 0 and not lib.exists()
    log = " ".join((proc.stdout + proc.stderr).split())
    assert "#error" in log and "partition(s) etforge_0" in log and SDK_MESSAGE in log, log[-3000:]
    # the explicit opt-in builds it (what remains is the delegate's missing device runtime)
    proc, lib = _build(gen, tmp_path / "opt-in", "ETFORGE_ALLOW_HOST_ONLY")
    assert proc.returncode == 0 and lib.is_file(), proc.stdout + proc.stderr
