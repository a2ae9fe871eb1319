"""Build the QEMU mps2-an505 image for a compiled program, once per content.

One build system: the image is a CMake project (``files/CMakeLists.txt``) over the CMake
package's lower-level functions (``cmake/etforge.cmake``: ``etforge_runtime_libraries``,
``etforge_tflm_libraries``), the ones a user's firmware gets through ``etforge_add_runtime``.
One CMake build tree per **library key** — the hash of every source file the libraries can
include, the recipe (CMake files, lists) and the compiler's version:

* **libraries** (target ``libs``) — ExecuTorch's runtime, prim ops, the ``cortex_m`` ops with
  their portable utilities and CMSIS-NN (int8 paths) for Cortex-M33 with DSP: the same for every
  model, built once (the first build takes minutes and shows its progress);
* **image** (target ``runner``) — the tree reconfigured for the program: its selected
  portable/quantized kernels (compiled on first use, reused by every later program), its
  generated registration and the runner, linked; with host-only NPU partitions on the CPU also
  TFLM (``tflm.py``), whose first build is announced too. The ELF is copied to
  ``images/<image key>/``, named by the hash of the library key, the generated files, the runner,
  the kernel list and the defines.

The cache lives in ``$ETFORGE_FIRMWARE_CACHE`` or ``~/.cache/etforge/firmware``; a file lock
serialises the use of one tree across processes (pytest workers), and a stamp written last
marks the libraries complete, so a killed build is finished by the next one, never trusted.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from etforge.core.common.errors import EtforgeError
from etforge.runtime.firmware.sources import (
    Sources,
    cmsis_nn_sources,
    cortex_m_sources,
    kernel_sources,
    locate,
    selected_operators,
    util_closure,
)

ENV_CACHE = "ETFORGE_FIRMWARE_CACHE"
#: Bump when the build recipe changes in a way the hashed files do not show.
RECIPE_VERSION = "3"
TOOLS = ("arm-none-eabi-gcc", "arm-none-eabi-g++", "arm-none-eabi-ar", "cmake", "make")
#: The build tool, first found wins: Ninja's no-op check of the tree is a fraction of Make's
#: (each image reconfigures the tree and builds the runner: ~0.3 CPU s of Make's per image
#: against ~0.01 s), Make when Ninja is not installed. Part of the library key: CMake keeps
#: one generator per tree, and the link order of the runner's objects is the generator's.
GENERATORS = (("ninja", "Ninja"), ("make", "Unix Makefiles"))
_STAMP = ".complete"
#: ExecuTorch / CMSIS-NN folders whose files a library or kernel object can depend on.
_ET_DIRS = (
    "runtime", "kernels/prim_ops", "kernels/portable/cpu", "kernels/quantized/cpu",
    "backends/cortex_m/ops", "schema", "extension/data_loader",
)  # fmt: skip
_NN_DIRS = ("Include", "Source")


@dataclass
class Image:
    elf: Path
    key: str
    kernels: list[str]
    #: Seconds spent building (0.0 when both stages came from the cache) and per stage.
    seconds: float = 0.0
    built: list[str] = field(default_factory=list)


def files_dir() -> Path:
    return Path(str(resources.files("etforge.runtime.firmware") / "files"))


def cache_root() -> Path:
    env = os.environ.get(ENV_CACHE)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "etforge" / "firmware"


def generator() -> str:
    """The CMake generator of the image trees (``GENERATORS``: the first whose tool is on PATH)."""
    return next((gen for tool, gen in GENERATORS if shutil.which(tool)), GENERATORS[-1][1])


def missing_tools() -> list[str]:
    """``TOOLS`` not on PATH (``make`` is not needed where Ninja is)."""
    return [t for t in TOOLS if shutil.which(t) is None and not (t == "make" and shutil.which("ninja"))]


def check_tools() -> None:
    missing = missing_tools()
    if missing:
        raise EtforgeError(
            f"firmware build needs {', '.join(missing)} on PATH (Debian: apt-get install gcc-arm-none-eabi "
            "libnewlib-arm-none-eabi libstdc++-arm-none-eabi-newlib cmake make; ninja-build builds faster)"
        )


def _hash_tree(h: hashlib._Hash, root: Path, dirs: tuple[str, ...]) -> None:
    for d in dirs:
        base = root / d
        for path in sorted(base.rglob("*")):
            if path.is_file() and "test" not in path.relative_to(base).parts[:-1]:
                h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")


def _compiler_version() -> bytes:
    return subprocess.run(["arm-none-eabi-gcc", "--version"], capture_output=True, check=True).stdout


#: The runner (one object per library tree) and the program's part of it, in every image.
_RUNNER_FILES = ("runner.cpp", "runner_image.h", "image_model.cpp")
#: The recipe: the image project, the CMake package and its lists' generator.
_RECIPE_FILES = ("CMakeLists.txt", "startup.c", "pal_semihost.cpp", "an505.ld")


def _recipe(h: hashlib._Hash) -> None:
    from etforge.codegen import cmake_runtime
    from etforge.codegen.cmake_runtime import cmake_dir

    for f in [files_dir() / n for n in _RECIPE_FILES] + [cmake_dir() / "etforge.cmake"]:
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    h.update(repr((cmake_runtime.CORE, cmake_runtime.PRIM, cmake_runtime.DEFINITIONS)).encode())


def library_key(src: Sources) -> str:
    """The library tree's name: what it compiles (content) and where from (locations). A CMake
    build tree records its source directory and the absolute paths it compiles, so a tree
    configured from another checkout, venv or source copy with the same content is refused by
    CMake when reconfigured for an image: each location gets its own tree."""
    h = hashlib.sha256(f"etforge-firmware-libs {RECIPE_VERSION}\0{generator()}\0".encode())
    h.update(_compiler_version())
    _recipe(h)
    from etforge.codegen.cmake_runtime import cmake_dir

    where = (files_dir(), cmake_dir(), src.executorch, src.cmsis_nn, src.schema, src.flatbuffers)
    h.update("\0".join(str(Path(p).resolve()) for p in where).encode() + b"\0")
    h.update("\0".join(_lib_utils(src) + cmsis_nn_sources(src.cmsis_nn)).encode())  # what gets compiled
    _hash_tree(h, src.executorch, _ET_DIRS)
    _hash_tree(h, src.cmsis_nn, _NN_DIRS)
    _hash_tree(h, src.schema, ("executorch",))
    _hash_tree(h, src.flatbuffers, ("flatbuffers",))
    return h.hexdigest()[:20]


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _include_root(src: Sources, where: Path) -> Path:
    """``executorch/...`` and ``flatbuffers/...`` as the sources include them, whatever the
    user's directories are called: a directory of symbolic links."""
    inc = where / "include"
    et = inc / "executorch"
    (et / "schema").mkdir(parents=True, exist_ok=True)
    links = {et / d: src.executorch / d for d in ("runtime", "kernels", "extension", "backends", "codegen")}
    for name in ("extended_header.h", "extended_header.cpp"):
        links[et / "schema" / name] = src.executorch / "schema" / name
    for gen in (src.schema / "executorch" / "schema").glob("*_generated.h"):
        links[et / "schema" / gen.name] = gen
    links[inc / "flatbuffers"] = src.flatbuffers / "flatbuffers"
    for link, target in links.items():
        if link.is_symlink() or link.exists():
            link.unlink()
        if target.exists():
            link.symlink_to(target)
    return inc


def _jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


#: Make's progress ("[ 42%] Building ...") and Ninja's ("[12/120] Building ...").
_PERCENT = re.compile(r"^\[\s*(?:(\d+)%|(\d+)/(\d+))\]")


def _percent(m: re.Match[str]) -> int:
    return int(m.group(1)) if m.group(1) is not None else int(m.group(2)) * 100 // max(1, int(m.group(3)))


#: A compiler, linker or CMake error line (not a progress line naming error_reporter.cc).
_ERROR = re.compile(
    r"\berror:|undefined reference|cannot find|CMake Error|No rule to make|missing and no known rule"
)


def _run(cmd: list[str], what: str, progress: str = "") -> None:
    """Run a CMake step; on failure one line: the first compiler/linker/CMake error. With
    ``progress`` the build's percentage is shown on stderr (the long first builds)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    lines: list[str] = []
    shown, files = -10, 0
    for line in proc.stdout:
        lines.append(line)
        m = _PERCENT.match(line)
        if not (progress and m):
            continue
        files += "Building" in line
        pct = _percent(m)
        if pct >= shown + 10 or ("Building" in line and files % 25 == 0):
            shown = max(shown, pct)
            print(f"etforge: {progress}: {pct}% ({files} files compiled)", file=sys.stderr, flush=True)
    if proc.wait() != 0:
        text = "".join(lines)
        at = next((i for i, ln in enumerate(lines) if _ERROR.search(ln)), None)
        first = None if at is None else lines[at].strip()
        if first and first.startswith("CMake Error"):  # its message is on the next line
            first += " " + next((ln.strip() for ln in lines[at + 1 :] if ln.strip()), "")
        raise EtforgeError(f"firmware build failed ({what}): {first or text.strip()[-400:]}")


#: Where the tree's generated runtime files go, relative to its CMake build directory: where the
#: CMake package puts them for a firmware target named ``firmware`` (``etforge_add_runtime``:
#: ``etforge-gen/<target>/runtime``, the examples' target). With the same flags
#: (``_configure``), a source's compile line relative to the build directory is then the same
#: in this tree and in such a firmware's, so a compiler cache (ccache with a base directory
#: above both) compiles it once for both.
RUNTIME_GEN = Path("etforge-gen", "firmware", "runtime")


def runtime_dir(tree: Path) -> Path:
    """The tree's generated runtime directory: ``include/`` (the sources' include root) and
    the TFLM resolver ``etforge_tflm_ops.cpp`` (``tflm.resolver_source``)."""
    return tree / "build" / RUNTIME_GEN


#: Release's optimisation, as in examples/firmware/arm-none-eabi.cmake (which also puts the CPU
#: flags in CMAKE_<LANG>_FLAGS): the compile lines are then a firmware project's.
_OPT = "-O2"


def _configure(src: Sources, tree: Path, image_lists: str) -> None:
    """(Re)configure the library tree ``tree`` with ``image_lists`` (an empty image: libraries)."""
    from etforge.codegen import cmake_runtime
    from etforge.codegen.cmake_runtime import cmake_dir

    lists = cmake_runtime.render_lists(cmake_runtime.library_lists(src, "cortex-m33", runtime_dir(tree)))
    cpu = cmake_runtime.CPU_FLAGS["cortex-m33"]
    cmake_runtime.write_if_changed(tree / "libs.cmake", lists)
    cmake_runtime.write_if_changed(tree / "image.cmake", image_lists)
    cmd = [
        "cmake", "-S", str(files_dir()), "-B", str(tree / "build"), "-G", generator(),
        "-DCMAKE_SYSTEM_NAME=Generic", "-DCMAKE_SYSTEM_PROCESSOR=arm",
        "-DCMAKE_C_COMPILER=arm-none-eabi-gcc", "-DCMAKE_CXX_COMPILER=arm-none-eabi-g++",
        "-DCMAKE_TRY_COMPILE_TARGET_TYPE=STATIC_LIBRARY", "-DCMAKE_BUILD_TYPE=Release",
        f"-DCMAKE_C_FLAGS={cpu}", f"-DCMAKE_CXX_FLAGS={cpu}",
        f"-DCMAKE_C_FLAGS_RELEASE={_OPT}", f"-DCMAKE_CXX_FLAGS_RELEASE={_OPT}",
        f"-DETFORGE_CMAKE_DIR={cmake_dir()}", f"-DETFORGE_LISTS={tree / 'libs.cmake'}",
        f"-DETFORGE_IMAGE={tree / 'image.cmake'}",
    ]  # fmt: skip
    _run(cmd, "CMake configure")


def _build(tree: Path, target: str, what: str, progress: str = "") -> None:
    _run(["cmake", "--build", str(tree / "build"), "--target", target, f"-j{_jobs()}"], what, progress)


def build_libraries(src: Sources, root: Path | None = None) -> tuple[Path, str, bool]:
    """The library tree for ``src`` (built when missing), its key, and whether it was built."""
    check_tools()
    root = root or cache_root()
    key = library_key(src)
    lib = root / f"libs-{key}"
    with _locked(root / f"libs-{key}.lock"):
        if (lib / _STAMP).is_file():
            return lib, key, False
        print(  # the first build takes minutes: say so before it starts
            f"etforge: building ExecuTorch's runtime and CMSIS-NN for these sources (once, about a hundred "
            f"files, minutes on a small machine) into {lib}",
            file=sys.stderr,
            flush=True,
        )
        _configure(src, lib, "")
        _build(lib, "libs", "runtime and CMSIS-NN libraries", "building the runtime and CMSIS-NN")
        (lib / _STAMP).write_text(key + "\n")
    return lib, key, True


def _lib_utils(src: Sources) -> list[str]:
    return util_closure(src.executorch, cortex_m_sources(src.executorch))


def model_namespace(header: Path) -> str:
    m = re.search(r"^namespace\s+([\w:]+)\s*\{", header.read_text(), re.MULTILINE)
    if m is None:
        raise EtforgeError(f"{header}: no namespace (not an etforge_model.h)")
    return m.group(1)


#: The emulated RAM the image's data, arena, pools, heap and stack share (``files/an505.ld``:
#: mps2-an505's PSRAM), and what the runner takes beside the arena (``files/runner.cpp``:
#: method and temp pools of 1 MiB each, stack and runtime state).
PSRAM_BYTES = 16 << 20
RUNNER_BYTES = (2 << 20) + (256 << 10)


def check_fits(header: Path, pte_bytes: int) -> None:
    """One line naming the buffer when the program cannot fit the emulated memory: the
    planned arenas (static), then the ``.pte`` the runner reads into the heap."""
    text = header.read_text()
    m = re.search(r"kArenaBytes\[\d+\]\s*=\s*\{([^}]*)\}", text)
    arenas = [int(x) for x in re.findall(r"\d+", m.group(1))] if m else []
    free = PSRAM_BYTES - RUNNER_BYTES
    for i, n in enumerate(arenas):
        if n > free:
            raise EtforgeError(
                f"{header}: planned arena memory id {i + 1} ({n} bytes) does not fit the emulated "
                f"{PSRAM_BYTES >> 20} MiB PSRAM of mps2-an505 ({free} bytes free beside the runner's pools)"
            )
        free -= n
    if pte_bytes > free:
        raise EtforgeError(
            f"{header.parent.parent / 'model.pte'} ({pte_bytes} bytes) does not fit the emulated PSRAM "
            f"beside the planned arenas ({free} bytes left)"
        )


def build_image(
    out: Path,
    executorch_src: str | Path | None = None,
    cmsis_nn_src: str | Path | None = None,
    arena_shrink: int = 0,
    root: Path | None = None,
    partitions: list[tuple[str, bytes]] | None = None,
) -> Image:
    """The image running ``out``'s program with its generated registration (built when missing);
    with ``partitions`` (name, LiteRT flatbuffer) the TFLM delegate runs them on the CPU."""
    from etforge.codegen import cmake_runtime

    gen = out / "codegen"
    header, registration = gen / "etforge_model.h", gen / "etforge_model_kernels.cpp"
    for f in (header, registration):
        if not f.is_file():
            raise EtforgeError(f"{f}: missing; run etforge codegen {out / 'model.pte'} -o {gen}")
    pte = out / "model.pte"
    check_fits(header, pte.stat().st_size if pte.is_file() else 0)
    src = locate(executorch_src, cmsis_nn_src)
    root = root or cache_root()
    t0 = time.monotonic()
    if partitions:  # a missing TFLM tree is told before minutes of library builds, not after
        from etforge.runtime.firmware import tflm

        tsrc = tflm.locate_tflm()
    lib, lib_key, lib_built = build_libraries(src, root)
    ops = kernel_sources(src.executorch, selected_operators(gen / "selected_operators.yaml"))
    in_lib = set(_lib_utils(src))
    kernels = ops + [u for u in util_closure(src.executorch, ops) if u not in in_lib]
    defs = [f"ETFORGE_MODEL_NS={model_namespace(header)}"]
    if arena_shrink:
        defs.append(f"ETFORGE_ARENA_SHRINK={int(arena_shrink)}")
    lists: dict[str, list[str]] = {"KERNEL_SOURCES": [str(src.executorch / k) for k in kernels]}
    ops_source = ""
    tflm_stamp: Path | None = None
    if partitions:
        from etforge.plugins.targets.tflm_arena import arena_bytes

        part_ops = sorted({op for _, model in partitions for op in tflm.partition_ops(model)})
        ops_source = tflm.resolver_source(part_ops, [arena_bytes(model) for _, model in partitions])
        tkey = tflm.library_key(tsrc, src.cmsis_nn)
        tflm_stamp = lib / f".tflm-{tkey}"
        lists.update(tflm.cmake_lists(tsrc, src.cmsis_nn, part_ops, runtime_dir(lib)))
        defs += ["ETFORGE_ALLOW_HOST_ONLY", "ETFORGE_TFLM_PARTITIONS", f"ETFORGE_TFLM_KEY={tkey}"]
    image_lists = cmake_runtime.render_lists(lists) + cmake_runtime.render_lists(
        {"GEN": [str(gen.resolve())], "DEFINITIONS": defs}, prefix="ETFORGE_IMAGE_"
    )
    h = hashlib.sha256(f"etforge-firmware-image {RECIPE_VERSION}\0{lib_key}\0".encode())
    for f in (header, registration, *(files_dir() / n for n in _RUNNER_FILES)):
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    if partitions:
        h.update((files_dir() / "tflm_delegate.cpp").read_bytes() + ops_source.encode())
    h.update("\0".join(kernels + defs).encode() + image_lists.replace(str(gen.resolve()), "").encode())
    key = h.hexdigest()[:20]
    img = root / "images" / key
    elf = img / "runner.elf"
    built = ["libraries"] if lib_built else []  # (the TFLM library included)
    with _locked(root / "images" / f"{key}.lock"):
        if not elf.is_file():
            with _locked(root / f"libs-{lib_key}.lock"):  # one image at a time in the library tree
                if ops_source:
                    cmake_runtime.write_if_changed(runtime_dir(lib) / tflm.OPS_SOURCE, ops_source)
                _configure(src, lib, image_lists)
                progress = ""
                if tflm_stamp is not None and not tflm_stamp.is_file():
                    print(f"etforge: building TensorFlow Lite Micro for the image (once; in {lib})",
                          file=sys.stderr, flush=True)  # fmt: skip
                    progress = "building TensorFlow Lite Micro"
                _build(lib, "runner", f"image for {out}", progress)
                if tflm_stamp is not None:
                    tflm_stamp.write_text(f"{time.monotonic() - t0:.0f} s\n")
                    if progress and "libraries" not in built:
                        built.append("libraries")
                img.mkdir(parents=True, exist_ok=True)
                (img / "image.cmake").write_text(image_lists)  # how the tree was configured for it
                if ops_source:
                    (img / tflm.OPS_SOURCE).write_text(ops_source)
                shutil.copyfile(lib / "build" / "runner.map", img / "runner.map")
                shutil.copyfile(lib / "build" / "runner.elf", img / "runner.elf.tmp")
                (img / "runner.elf.tmp").replace(elf)  # written last: a complete image
            built.append("image")
    return Image(elf, key, kernels, time.monotonic() - t0 if built else 0.0, built)
