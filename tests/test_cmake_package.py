"""A firmware engineer's path: ``find_package(etforge)`` + ``etforge_add_model`` +
``etforge_add_runtime`` in a CMake project (examples/firmware/), built with arm-none-eabi.

The QEMU example's C ``main.c`` runs the program through the generated C API only and must
write the same output bytes as ``etforge run`` (runtime/firmware/device.py) on the same inputs;
touching the ``.pte`` regenerates, an unchanged one rebuilds nothing; the RT700 example links
against the RT700 memory regions; bad input is one configure-time error naming the culprit.
The builds live in pytest's cache (incremental), so only the first run compiles the runtime.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import etforge
from etforge.codegen import c_api
from etforge.runtime.firmware import device

from support import REPO, THIRD_PARTY, compile_each, run_cli, run_cli_recording_modules

EXAMPLES = REPO / "examples" / "firmware"
MODELS = ["digits_cnn", "autoencoder"]
SAMPLES = 2
ET_SRC = THIRD_PARTY / "executorch"
NN_SRC = THIRD_PARTY / "cmsis-nn"


def _missing() -> str | None:
    tools = [t for t in ("arm-none-eabi-gcc", "cmake", "qemu-system-arm") if shutil.which(t) is None]
    if tools:
        return f"firmware tools not installed: {', '.join(tools)}"
    if not (ET_SRC / "runtime").is_dir() or not (NN_SRC / "Include").is_dir():
        return f"no ExecuTorch / CMSIS-NN sources at {THIRD_PARTY} (set ETFORGE_THIRD_PARTY)"
    return None


pytestmark = pytest.mark.skipif(_missing() is not None, reason=str(_missing()))


def _env() -> dict[str, str]:
    """The build runs ``python -m etforge``: the etforge these tests import."""
    root = str(Path(etforge.__file__).resolve().parent.parent)
    here = str(Path(etforge.__file__).parent.parent)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([here, root, os.environ.get("PYTHONPATH", "")])}


def _configure(src: Path, build_dir: Path, pte: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    cmd = [
        "cmake", "-S", str(src), "-B", str(build_dir),
        f"-DCMAKE_TOOLCHAIN_FILE={EXAMPLES / 'arm-none-eabi.cmake'}", "-DCMAKE_BUILD_TYPE=Release",
        f"-Detforge_DIR={_cmake_dir()}", f"-DETFORGE_PYTHON={sys.executable}", f"-DETFORGE_PTE={pte}",
        f"-DETFORGE_EXECUTORCH_SRC={ET_SRC}", f"-DETFORGE_CMSIS_NN_SRC={NN_SRC}", *extra,
    ]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=600)


def _cmake_dir() -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "etforge", "--cmake-dir"],
        capture_output=True,
        text=True,
        env=_env(),
        check=True,
    )
    return proc.stdout.strip()


def _build(build_dir: Path) -> str:
    proc = subprocess.run(
        ["cmake", "--build", str(build_dir), "-j2"], capture_output=True, text=True, env=_env(), timeout=3600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.fixture(scope="module")
def outs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    found = compile_each([f"zoo:{m}" for m in MODELS], "cortex-m33", tmp_path_factory.mktemp("cm"))
    return {m: found[f"zoo:{m}"] for m in MODELS}


@pytest.fixture(scope="module")
def cache(request: pytest.FixtureRequest) -> Path:
    """The examples' build trees (incremental across runs); ``etforge run``'s images use the
    session's firmware cache (conftest: ``$ETFORGE_FIRMWARE_CACHE``, test_firmware's). The name
    changes with the toolchain's cached flags: a configured tree keeps the CMAKE_<LANG>_FLAGS_RELEASE
    it was first given (``-O2 -O3 -DNDEBUG`` before the toolchain file set ``-O2``)."""
    return Path(request.config.cache.mkdir("etforge-cmake-package-2"))


def test_cmake_dir_holds_the_config() -> None:
    assert (Path(_cmake_dir()) / "etforgeConfig.cmake").is_file()
    proc = run_cli("cmake-dir")
    assert proc.returncode == 0 and proc.stdout.strip() == _cmake_dir()


def _run_example(out: Path, build_dir: Path, tmp_path: Path, cpu_partitions: bool = False) -> str:
    """Build the configured example, run it on ``out``'s seeded inputs under QEMU and require
    every output byte to be ``etforge run``'s (runtime/firmware/device.py) on the same inputs;
    QEMU's stdout. ``etforge run`` goes first: its image tree compiles the runtime (and TFLM)
    with the example's compile lines under the firmware cache's lock, which other workers'
    firmware tests wait on, so on a cold machine the example's build takes those objects from
    the compiler cache (conftest) instead of compiling them a second time beside them."""
    ref = device.run(
        out, "qemu-m33", samples=SAMPLES, seed=3, executorch_src=ET_SRC, cmsis_nn_src=NN_SRC,
        cpu_partitions=cpu_partitions,
    )  # fmt: skip
    _build(build_dir)
    report, interp = device._load(out)
    ins = device._tensor_values(interp, interp.plan.inputs, "input", out)
    outs_v = device._tensor_values(interp, interp.plan.outputs, "output", out)
    for s, batch in enumerate(ref.inputs):
        for j, (t, v) in enumerate(zip(batch, ins, strict=True)):
            (tmp_path / f"s{s}_in{j}.bin").write_bytes(device._device_bytes(t, device._dim_order(interp, v)))
    qemu = subprocess.run(
        ["qemu-system-arm", "-M", "mps2-an505", "-nographic", "-monitor", "none", "-semihosting-config",
         "enable=on,target=native", "-kernel", str(build_dir / "firmware.elf"), "-append", str(SAMPLES)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert qemu.returncode == 0 and "etforge: ok" in qemu.stdout, qemu.stdout + qemu.stderr
    for s in range(SAMPLES):
        for j, v in enumerate(outs_v):
            want = device._device_bytes(ref.outputs[s][j], device._dim_order(interp, v))
            assert (tmp_path / f"s{s}_out{j}.bin").read_bytes() == want, f"sample {s} output {j}"
    # the arena the C API planned is the report's; the method pool estimate covers what was used
    planned = [int(x) for x in re.findall(r"planned buffer \d+ (\d+) bytes", qemu.stdout)]
    assert planned == report["memory"]["arena_bytes"]
    used = int(re.search(r"method pool used (\d+) bytes", qemu.stdout).group(1))
    assert 0 < used <= c_api.buffers(out / "model.pte", report)["method_pool"]
    return qemu.stdout


#: The libraries an example and ``etforge run``'s image tree both compile (CMake package:
#: ``<prefix>_<name>``; the example's prefix is ``firmware_etforge``, the image tree's ``et``).
SHARED_LIBRARIES = (
    "core", "prim_ops", "ops", "cmsis_nn", "kernels", "tflm", "tflm_kernels", "cmsis_nn_int", "tflm_delegate",
)  # fmt: skip


_FLAG = re.compile(r"^\s*(\w+) =(?: (.*))?$")


def _ninja_flags(build_dir: Path) -> dict[str, dict[str, set[str]]]:
    """Per target, the compile variables of its objects in a Ninja tree's build.ninja (the image
    trees are Ninja trees where ninja is installed: runtime/firmware/build.py), named as a
    Makefile tree's flags.make names them (``CXX_FLAGS`` ...)."""
    found: dict[str, dict[str, set[str]]] = {}
    lang = target = None
    for line in (build_dir / "build.ninja").read_text().splitlines():
        if line.startswith("build "):
            rule = line.split(": ", 1)[1].split(" ", 1)[0] if ": " in line else ""
            lang, _, rest = rule.partition("_COMPILER__")
            target = rest.rsplit("_", 1)[0].removesuffix("_unscanned") if rest else None
        elif target and (m := _FLAG.match(line)) and m.group(1) in ("DEFINES", "INCLUDES", "FLAGS"):
            found.setdefault(target, {}).setdefault(f"{lang}_{m.group(1)}", set()).add(m.group(2) or "")
    return found


def _compile_lines(build_dir: Path, prefix: str) -> dict[str, str]:
    """Each shared library's compile variables (flags, defines, includes: flags.make in a
    Makefile tree, build.ninja in a Ninja tree; with the precompiled header a source includes,
    TFLM's: cmake/etforge.cmake) with the build directory written ``@``: what ccache hashes of a
    compile line besides the source."""
    ninja = _ninja_flags(build_dir) if (build_dir / "build.ninja").is_file() else {}
    found = {}
    for name in SHARED_LIBRARIES:
        f = build_dir / "CMakeFiles" / f"{prefix}_{name}.dir" / "flags.make"
        if f.is_file():
            flags = _make_flags(f.read_text(), (f.parent / "build.make").read_text())
        elif f"{prefix}_{name}" in ninja:
            flags = ninja[f"{prefix}_{name}"]
        else:
            continue
        text = "\n".join(f"{k} = {' | '.join(sorted(v))}" for k, v in sorted(flags.items()))
        found[name] = text.replace(str(build_dir), "@")
    return found


#: A compiled object's rule in a Makefile tree's build.make (``<object>: <source>``).
_MAKE_OBJECT = re.compile(r"^(\S+\.(?:o|obj)): \S", re.MULTILINE)


def _make_flags(text: str, build_make: str) -> dict[str, set[str]]:
    """A Makefile tree's flags.make as ``_ninja_flags`` names a target's variables: a source's
    precompiled-header options (``# PCH options: <object>_OPTIONS = ...``, a CMake list) follow
    its language's flags, as they do on the source's line in build.ninja; an object without
    them (a TFLM source that skips the PCH: tflm.pch_sources) keeps the plain flags."""
    lines = [_FLAG.match(ln) for ln in text.splitlines() if ln and not ln.startswith("#")]
    flags = {m.group(1): {m.group(2) or ""} for m in lines if m}
    options = dict(
        ln.removeprefix("# PCH options: ").split("_OPTIONS = ", 1)
        for ln in text.splitlines()
        if ln.startswith("# PCH options:")
    )
    pch = {v.replace(";", " ") for v in options.values()}
    plain = set(_MAKE_OBJECT.findall(build_make)) - set(options)
    for key in [k for k in flags if k.endswith("_FLAGS")] if pch else []:
        flags[key] = {f"{v} {p}".strip() for v in flags[key] for p in pch} | (flags[key] if plain else set())
    return flags


def _assert_compiles_like_etforge_run(build_dir: Path, out: Path | None = None) -> list[str]:
    """The libraries compared: the example compiles every library it shares with ``etforge run``'s
    image tree with the same compile line, relative to its build directory, so a compiler cache (ccache with
    conftest's base directory) compiles each object once for both (issue 47: a cold CI run
    compiled them twice, with -O3 -DNDEBUG and another include path in the example)."""
    from etforge.codegen.cmake_runtime import cmake_quote
    from etforge.runtime.firmware import build, sources

    src = sources.locate(ET_SRC, NN_SRC)
    key = build.library_key(src)
    lib = build.cache_root() / f"libs-{key}"
    example = _compile_lines(build_dir, "firmware_etforge")
    with build._locked(build.cache_root() / f"libs-{key}.lock"):  # no other worker reconfiguring it
        ours = _compile_lines(lib / "build", "et")
        if out is not None and set(example) - set(ours):
            # a Ninja tree's build.ninja holds the last image's targets only (a Makefile tree
            # keeps every target's flags.make): configured again as for an image with TFLM
            # partitions (the image.cmake its build left; the libraries' flags are the tree's,
            # whatever the program), its program's generated directory (gone with an earlier
            # session's temporary files) replaced by ``out``'s
            ops = str(build.runtime_dir(lib))  # an image of this tree (its TFLM resolver is there)
            lists = sorted(
                t for f in (build.cache_root() / "images").glob("*/image.cmake")
                if "TFLM_CORE_SOURCES" in (t := f.read_text()) and ops in t
            )  # fmt: skip
            assert lists, f"no image with TFLM partitions of {lib} in {build.cache_root()}"
            gen = cmake_quote(str((out / "codegen").resolve()))  # as render_lists writes it
            text, n = re.subn(
                r'(set\(ETFORGE_IMAGE_GEN\s+)"(?:[^"\\]|\\.)*"', lambda m: m.group(1) + gen, lists[0]
            )
            assert n == 1, lists[0]
            build._configure(src, lib, text)
            ours = _compile_lines(lib / "build", "et")
    shared = sorted(set(ours) & set(example))
    assert {"core", "ops", "cmsis_nn"} <= set(shared), (sorted(ours), sorted(example))
    for name in shared:
        assert example[name] == ours[name], f"{name}:\nexample  {example[name]}\netforge run {ours[name]}"
    return shared


@pytest.mark.parametrize("model", MODELS)
def test_qemu_example_matches_etforge_run(
    model: str, outs: dict[str, Path], cache: Path, tmp_path: Path
) -> None:
    out = outs[model]
    build_dir = cache / "qemu-an505"
    proc = _configure(EXAMPLES / "qemu-an505", build_dir, out / "model.pte")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    _run_example(out, build_dir, tmp_path)
    _assert_compiles_like_etforge_run(build_dir)


NPU_TARGETS = ["imxrt700", "imxrt700cm"]
TFLM_SRC = THIRD_PARTY / "tflite-micro"
TFLM_DEPS = THIRD_PARTY / "tflm-deps"
CPU_PARTITIONS = (
    "-DETFORGE_CPU_PARTITIONS=ON",
    f"-DETFORGE_TFLM_SRC={TFLM_SRC}",
    f"-DETFORGE_TFLM_DEPS={TFLM_DEPS}",
)


#: (model, NPU target) pairs the example runs: each target once, each model once. The example's
#: part is the same for either target (``ETFORGE_CPU_PARTITIONS``: the partitions in TFLM, the
#: rest in ExecuTorch's runtime); the full models x targets cross ran that path twice more, a
#: compile, an ``etforge run`` image and an example build each (issue 47: 27 CPU s of a cold run).
#: Programs of both targets run in TFLM bit-exact in tests/test_firmware_npu.py and
#: tests/test_firmware_tflm.py.
NPU_PAIRS = list(zip(MODELS, NPU_TARGETS, strict=True))


@pytest.fixture(scope="module")
def npu_outs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    """The zoo models compiled for the NPU targets without NXP's converter: host-only partitions."""
    if not (TFLM_SRC / "tensorflow").is_dir() or not (TFLM_DEPS / "flatbuffers").is_dir():
        pytest.skip(f"no TFLM sources at {THIRD_PARTY}")
    root = tmp_path_factory.mktemp("npu")
    found = {}
    for model, target in NPU_PAIRS:
        built = compile_each([f"zoo:{model}"], target, root)
        found[(model, target)] = built[f"zoo:{model}"]
    return found


@pytest.mark.parametrize(("model", "target"), NPU_PAIRS)
def test_qemu_example_npu_targets_in_tflm(
    model: str, target: str, npu_outs: dict[tuple[str, str], Path], cache: Path, tmp_path: Path
) -> None:
    """imxrt700 / imxrt700cm programs in the example firmware, their host-only partitions in the
    TFLM stand-in (ETFORGE_CPU_PARTITIONS): bit-exact with ``etforge run --cpu-partitions``."""
    out = npu_outs[(model, target)]
    report, _ = device._load(out)
    assert report["memory"]["npu_partitions"], "the program has no NPU partition: nothing tested"
    build_dir = cache / "qemu-an505-npu"
    proc = _configure(EXAMPLES / "qemu-an505", build_dir, out / "model.pte", *CPU_PARTITIONS)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "run in TFLM on the CPU" in proc.stdout
    stdout = _run_example(out, build_dir, tmp_path, cpu_partitions=True)
    assert "etforge: tflm partition 0 arena" in stdout
    shared = _assert_compiles_like_etforge_run(build_dir, out)
    # TFLM's compile lines compared too; the delegate's as well (its registration before main, the
    # example's, is a file of its own: one compile for both, issue 47)
    assert {"tflm", "tflm_kernels", "cmsis_nn_int", "tflm_delegate"} <= set(shared)
    lines = _compile_lines(build_dir, "firmware_etforge")
    assert all("cmake_pch.hxx" in lines[n] for n in ("tflm", "tflm_kernels")), lines  # ETFORGE_TFLM_PCH


def test_configure_reads_the_partitions_without_torch(
    npu_outs: dict[tuple[str, str], Path], tmp_path: Path
) -> None:
    """The configure step of a firmware with host-only partitions (``etforge cmake-runtime``, run
    again whenever the ``.pte`` changes) reads them without importing torch (issue 47: ~3.9 CPU s
    per configure with torch, ~0.5 without), and finds the partitions ``etforge run`` finds: its
    generated resolver and arenas are the ones of the program's partitions as the host
    interpreter reads them."""
    from etforge.plugins.targets.tflm_arena import arena_bytes
    from etforge.runtime.firmware import tflm

    out = npu_outs[(MODELS[0], "imxrt700")]
    inc = tmp_path / "runtime"
    proc, modules = run_cli_recording_modules(
        tmp_path / "probe", "cmake-runtime", "--executorch-src", str(ET_SRC), "--cmsis-nn-src", str(NN_SRC),
        "--cpu", "cortex-m33", "--include-dir", str(inc), "-o", str(tmp_path / "runtime.cmake"),
        "--cpu-partitions", "--tflm-src", str(TFLM_SRC), "--tflm-deps", str(TFLM_DEPS), str(out / "model.pte"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "torch" not in modules and "executorch.exir" not in modules, [m for m in modules if "torch" in m]
    _, interp = device._load(out)
    parts = device.host_only_partitions(out, interp)
    ops = sorted({op for _, model in parts for op in tflm.partition_ops(model)})
    want = tflm.resolver_source(ops, [arena_bytes(model) for _, model in parts])
    assert parts and (inc / tflm.OPS_SOURCE).read_text() == want


def test_npu_program_needs_the_opt_in(npu_outs: dict[tuple[str, str], Path], tmp_path: Path) -> None:
    pte = npu_outs[(MODELS[0], "imxrt700")] / "model.pte"
    proc = _configure(EXAMPLES / "qemu-an505", tmp_path / "b", pte)
    assert proc.returncode != 0
    assert proc.stderr.count("CMake Error") == 1, proc.stderr
    text = " ".join(ln.strip() for ln in proc.stderr.splitlines() if ln.strip())  # CMake wraps it
    assert "NPU partitions need NXP's Neutron runtime" in text
    assert "-DETFORGE_CPU_PARTITIONS=ON" in text and "not the NPU" in text


def test_missing_tflm_tree_names_the_variable(npu_outs: dict[tuple[str, str], Path], tmp_path: Path) -> None:
    pte = npu_outs[(MODELS[0], "imxrt700")] / "model.pte"
    env = {k: v for k, v in _env().items() if not k.startswith("ETFORGE_TFLM")}
    cmd = [
        "cmake", "-S", str(EXAMPLES / "qemu-an505"), "-B", str(tmp_path / "b"),
        f"-DCMAKE_TOOLCHAIN_FILE={EXAMPLES / 'arm-none-eabi.cmake'}", f"-Detforge_DIR={_cmake_dir()}",
        f"-DETFORGE_PYTHON={sys.executable}", f"-DETFORGE_PTE={pte}", f"-DETFORGE_EXECUTORCH_SRC={ET_SRC}",
        f"-DETFORGE_CMSIS_NN_SRC={NN_SRC}", "-DETFORGE_CPU_PARTITIONS=ON",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode != 0
    assert "TFLM_SRC is not set" in proc.stderr and "ETFORGE_TFLM_SRC" in proc.stderr


def test_touched_pte_regenerates_unchanged_does_not(
    outs: dict[str, Path], cache: Path, tmp_path: Path
) -> None:
    model_dir = tmp_path / "model"
    shutil.copytree(outs["digits_cnn"], model_dir)
    pte = model_dir / "model.pte"
    build_dir = cache / "qemu-an505"
    assert _configure(EXAMPLES / "qemu-an505", build_dir, pte).returncode == 0
    first = _build(build_dir)
    assert "etforge codegen model" in first
    again = _build(build_dir)
    assert "etforge codegen" not in again and "Linking" not in again and "Building" not in again
    later = time.time() + 5
    os.utime(pte, (later, later))
    touched = _build(build_dir)
    assert "etforge codegen model" in touched and "Linking" in touched


def test_rt700_example_links(outs: dict[str, Path], cache: Path) -> None:
    build_dir = cache / "rt700"
    proc = _configure(EXAMPLES / "rt700", build_dir, outs["autoencoder"] / "model.pte")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    _build(build_dir)
    elf = build_dir / "firmware.elf"
    sections = subprocess.run(
        ["arm-none-eabi-objdump", "-h", str(elf)], capture_output=True, text=True
    ).stdout
    addr = {
        m.group(1): int(m.group(2), 16) for m in re.finditer(r"^\s*\d+\s+(\S+)\s+\S+\s+(\S+)", sections, re.M)
    }
    assert 0x28004000 <= addr[".etforge_pte"] < 0x28200000  # XSPI0 flash (XIP)
    assert 0x20080000 <= addr[".etforge_arena"] < 0x20200000  # CPU0 SRAM


PROJECT = """\
cmake_minimum_required(VERSION 3.24)
project(bad LANGUAGES C CXX ASM)
find_package(etforge CONFIG REQUIRED)
add_executable(fw main.c)
{body}
"""


def _bad(tmp_path: Path, body: str, pte: Path) -> str:
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / "main.c").write_text("int main(void) { return 0; }\n")
    (src / "CMakeLists.txt").write_text(PROJECT.format(body=body))
    proc = _configure(src, tmp_path / "b", pte)
    assert proc.returncode != 0
    errors = [
        ln for ln in proc.stderr.splitlines() if ln.strip() and not ln.startswith(("CMake Error", "--"))
    ]
    return " ".join(ln.strip() for ln in errors)


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ('etforge_add_model(fw PTE "${ETFORGE_PTE}" NAME int)', "NAME 'int' is a C/C++ keyword"),
        ('etforge_add_model(fw PTE "${ETFORGE_PTE}" NAME "9lives")', "NAME '9lives' is not a C identifier"),
        ('etforge_add_model(fw PTE "${ETFORGE_PTE}" NAME "a;b")', "NAME 'a;b' is not a C identifier"),
        (
            'etforge_add_model(fw PTE "${ETFORGE_PTE}" SECTION ".x\\"y")',
            "SECTION '.x\"y' is not a section name",
        ),
        (
            'etforge_add_model(fw PTE "${ETFORGE_PTE}" NAME m)\netforge_add_model(fw PTE "${ETFORGE_PTE}" NAME m)',
            "two models named 'm' in one firmware",
        ),
        (
            'etforge_add_model(fw PTE "${ETFORGE_PTE}")\netforge_add_runtime(fw EXECUTORCH_SRC /nonexistent)',
            "EXECUTORCH_SRC /nonexistent has no runtime/executor/method.cpp",
        ),
    ],
)
def test_bad_configure_is_one_clear_error(
    body: str, needle: str, outs: dict[str, Path], tmp_path: Path
) -> None:
    assert needle in _bad(tmp_path, body, outs["digits_cnn"] / "model.pte")


def test_pte_that_is_not_etforge_is_refused(tmp_path: Path, outs: dict[str, Path]) -> None:
    text = tmp_path / "m" / "model.pte"
    text.parent.mkdir()
    text.write_text("not a program at all\n")
    assert "is not an ExecuTorch program" in _bad(
        tmp_path, 'etforge_add_model(fw PTE "${ETFORGE_PTE}")', text
    )
    plain = tmp_path / "plain" / "model.pte"  # an ExecuTorch program with no etforge report
    plain.parent.mkdir()
    shutil.copyfile(outs["digits_cnn"] / "model.pte", plain)
    assert "is not a program etforge compiled" in _bad(
        tmp_path, 'etforge_add_model(fw PTE "${ETFORGE_PTE}")', plain
    )


def test_missing_source_tree_names_the_variable(tmp_path: Path, outs: dict[str, Path]) -> None:
    body = 'etforge_add_model(fw PTE "${ETFORGE_PTE}")\netforge_add_runtime(fw)'
    src = tmp_path / "src"
    src.mkdir()
    (src / "main.c").write_text("int main(void) { return 0; }\n")
    (src / "CMakeLists.txt").write_text(PROJECT.format(body=body))
    env = {k: v for k, v in _env().items() if not k.startswith("ETFORGE_")}
    cmd = [
        "cmake", "-S", str(src), "-B", str(tmp_path / "b"),
        f"-DCMAKE_TOOLCHAIN_FILE={EXAMPLES / 'arm-none-eabi.cmake'}", f"-Detforge_DIR={_cmake_dir()}",
        f"-DETFORGE_PYTHON={sys.executable}", f"-DETFORGE_PTE={outs['digits_cnn'] / 'model.pte'}",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode != 0
    assert "EXECUTORCH_SRC is not set" in proc.stderr and "ETFORGE_EXECUTORCH_SRC" in proc.stderr


TWO_MODELS = """\
cmake_minimum_required(VERSION 3.24)
project(two LANGUAGES C CXX ASM)
find_package(etforge CONFIG REQUIRED)
add_executable(firmware main.c "{example}/startup.c")
set_target_properties(firmware PROPERTIES SUFFIX ".elf")
etforge_add_model(firmware PTE "{a}" NAME digits)
etforge_add_model(firmware PTE "{b}" NAME autoenc)
etforge_add_runtime(firmware CPU cortex-m33)
target_link_options(firmware PRIVATE --specs=rdimon.specs -nostartfiles -T "{example}/an505.ld" -Wl,--gc-sections)
"""

TWO_MAIN = """\
#include <stdio.h>
#include <string.h>
#include "autoenc_api.h"
#include "digits_api.h"

static float a_in[DIGITS_INPUT0_BYTES / 4], a_out[DIGITS_OUTPUT0_BYTES / 4];
static float b_in[AUTOENC_INPUT0_BYTES / 4], b_out[AUTOENC_OUTPUT0_BYTES / 4];

int main(void) {
  if (digits_init() != ETFORGE_OK || autoenc_init() != ETFORGE_OK) return 1;
  for (int s = 0; s < 2; ++s) {
    for (unsigned i = 0; i < sizeof(a_in) / 4; ++i) a_in[i] = (float)((i * 7 + s) % 13) / 13.0f;
    for (unsigned i = 0; i < sizeof(b_in) / 4; ++i) b_in[i] = (float)((i * 5 + s) % 11) / 11.0f;
    if (digits_run(a_in, a_out) != ETFORGE_OK || autoenc_run(b_in, b_out) != ETFORGE_OK) return 2;
    char name[16];
    snprintf(name, sizeof(name), "a%d.bin", s);
    FILE* f = fopen(name, "wb"); fwrite(a_out, 1, sizeof(a_out), f); fclose(f);
    snprintf(name, sizeof(name), "b%d.bin", s);
    f = fopen(name, "wb"); fwrite(b_out, 1, sizeof(b_out), f); fclose(f);
  }
  printf("etforge: ok\\n");
  return 0;
}
"""


def test_two_models_share_one_firmware(outs: dict[str, Path], cache: Path, tmp_path: Path) -> None:
    """Two programs in one image (shared operators registered once), each bit-exact with
    etforge's host interpreter on the inputs main.c makes."""
    import numpy as np
    import torch

    from etforge.runtime.execution.pte_interpreter import PteInterpreter

    src = cache / "two-src"
    src.mkdir(exist_ok=True)
    a, b = outs["digits_cnn"] / "model.pte", outs["autoencoder"] / "model.pte"
    (src / "CMakeLists.txt").write_text(TWO_MODELS.format(example=EXAMPLES / "qemu-an505", a=a, b=b))
    (src / "main.c").write_text(TWO_MAIN)
    proc = _configure(src, cache / "two", a)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    _build(cache / "two")
    qemu = subprocess.run(
        ["qemu-system-arm", "-M", "mps2-an505", "-nographic", "-monitor", "none", "-semihosting-config",
         "enable=on,target=native", "-kernel", str(cache / "two" / "firmware.elf")],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert qemu.returncode == 0 and "etforge: ok" in qemu.stdout, qemu.stdout + qemu.stderr
    for tag, pte, (mul, mod) in (("a", a, (7, 13)), ("b", b, (5, 11))):
        interp = PteInterpreter(pte.read_bytes(), str(pte))
        (v_in,), (v_out,) = interp.plan.inputs, interp.plan.outputs
        order = device._dim_order(interp, v_in)
        sizes = [int(x) for x in interp.plan.values[v_in].val.sizes]
        for s in range(2):
            flat = torch.tensor(
                [((i * mul + s) % mod) / mod for i in range(int(np.prod(sizes)))], dtype=torch.float32
            )
            stored = flat.reshape([sizes[d] for d in order])  # main.c's bytes, in the input's dim order
            logical = stored.permute(*[order.index(d) for d in range(len(order))])
            (host,) = interp.run((logical,))
            want = device._device_bytes(host, device._dim_order(interp, v_out))
            assert (tmp_path / f"{tag}{s}.bin").read_bytes() == want, f"{tag} sample {s}"
