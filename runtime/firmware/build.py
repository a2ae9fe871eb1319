"""Build the QEMU mps2-an505 image for a compiled program, once per content.

Two stages, both ``make -j<cores>`` on ``files/firmware.mk``:

* **libraries** — ExecuTorch's runtime, prim ops and portable utilities, the ``cortex_m`` ops
  and CMSIS-NN (int8 paths) for Cortex-M33 with DSP: the same for every model, built once
  into a directory named by the hash of every source file they can include, the flags and
  the compiler's version. The portable/quantized kernels a program needs are compiled into
  the same directory on first use and reused by every later program;
* **image** — the program's generated registration (``OUT/codegen``) and the runner, linked
  with those: a directory named by the hash of the library key, the generated files, the
  runner and the kernel list.

The cache lives in ``$ETFORGE_FIRMWARE_CACHE`` or ``~/.cache/etforge/firmware``; a file lock
serialises builds of one key across processes (pytest workers), and a stamp written last
marks a library directory complete, so a killed build is redone, never trusted.
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
RECIPE_VERSION = "1"
TOOLS = ("arm-none-eabi-gcc", "arm-none-eabi-g++", "arm-none-eabi-ar", "make")
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


def check_tools() -> None:
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        raise EtforgeError(
            f"firmware build needs {', '.join(missing)} on PATH (Debian: apt-get install gcc-arm-none-eabi "
            "libnewlib-arm-none-eabi libstdc++-arm-none-eabi-newlib make)"
        )


def _hash_tree(h: hashlib._Hash, root: Path, dirs: tuple[str, ...]) -> None:
    for d in dirs:
        base = root / d
        for path in sorted(base.rglob("*")):
            if path.is_file() and "test" not in path.relative_to(base).parts[:-1]:
                h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")


def _compiler_version() -> bytes:
    return subprocess.run(["arm-none-eabi-gcc", "--version"], capture_output=True, check=True).stdout


def library_key(src: Sources) -> str:
    h = hashlib.sha256(f"etforge-firmware-libs {RECIPE_VERSION}\0".encode())
    h.update(_compiler_version())
    for name in ("firmware.mk", "startup.c", "pal_semihost.cpp", "an505.ld"):
        h.update(name.encode() + (files_dir() / name).read_bytes())
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


def _make(args: list[str], what: str) -> None:
    cmd = ["make", "-s", "-f", str(files_dir() / "firmware.mk"), f"-j{_jobs()}", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        text = proc.stderr + proc.stdout
        first = next((ln for ln in text.splitlines() if re.search(r"error|undefined reference", ln)), None)
        raise EtforgeError(f"firmware build failed ({what}): {first or text.strip()[-400:]}")


def build_libraries(src: Sources, root: Path | None = None) -> tuple[Path, str, bool]:
    """The library directory for ``src`` (built when missing), its key, and whether it was built."""
    check_tools()
    root = root or cache_root()
    key = library_key(src)
    lib = root / f"libs-{key}"
    with _locked(root / f"libs-{key}.lock"):
        if (lib / _STAMP).is_file():
            return lib, key, False
        inc = _include_root(src, lib)
        print(  # the first build takes minutes: say so before it starts
            f"etforge: building ExecuTorch's runtime and CMSIS-NN for these sources (once, about a hundred "
            f"files, minutes on a small machine) into {lib}",
            file=sys.stderr,
            flush=True,
        )
        _make(_lib_vars(src, lib, inc) + ["libs"], "runtime and CMSIS-NN libraries")
        (lib / _STAMP).write_text(key + "\n")
    return lib, key, True


def _lib_utils(src: Sources) -> list[str]:
    return util_closure(src.executorch, cortex_m_sources(src.executorch))


def _lib_vars(src: Sources, lib: Path, inc: Path) -> list[str]:
    utils = " ".join(_lib_utils(src))
    nn = " ".join(cmsis_nn_sources(src.cmsis_nn))
    return [
        f"ET={src.executorch}",
        f"NN={src.cmsis_nn}",
        f"INC={inc}",
        f"B={lib}",
        f"UTIL={utils}",
        f"NNSRC={nn}",
    ]


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
    lib, lib_key, lib_built = build_libraries(src, root)
    ops = kernel_sources(src.executorch, selected_operators(gen / "selected_operators.yaml"))
    in_lib = set(_lib_utils(src))
    kernels = ops + [u for u in util_closure(src.executorch, ops) if u not in in_lib]
    defs = [f"-DETFORGE_MODEL_NS={model_namespace(header)}"]
    if arena_shrink:
        defs.append(f"-DETFORGE_ARENA_SHRINK={int(arena_shrink)}")
    extra: list[str] = []
    ops_header = ""
    if partitions:
        from etforge.runtime.firmware import tflm

        tsrc = tflm.locate_tflm()
        tlib, tkey, tbuilt = tflm.build_library(tsrc, src.cmsis_nn, root)
        if tbuilt:
            lib_built = True
        ops = sorted({op for _, model in partitions for op in tflm.partition_ops(model)})
        from etforge.plugins.targets.tflm_arena import arena_bytes

        ops_header = tflm.resolver_header(ops, [arena_bytes(model) for _, model in partitions])
        kobjs = tflm.kernel_objects(tsrc, src.cmsis_nn, tlib, ops)
        defs += ["-DETFORGE_ALLOW_HOST_ONLY", "-DETFORGE_TFLM_PARTITIONS"]
        flags = " ".join(t for t in tflm.compile_flags(tsrc, src.cmsis_nn).split() if "HEADER_FILE" not in t)
        extra = [
            f"EXTRA_SRC={files_dir() / 'tflm_delegate.cpp'}",
            f"EXTRA_CXXFLAGS={flags}",
            f"EXTRA_LIBS={' '.join(map(str, kobjs))} {tlib / 'libtflm.a'} {tlib / 'libcmsis_nn_int.a'}",
        ]
        defs.append(f"-DETFORGE_TFLM_KEY={tkey}")
    h = hashlib.sha256(f"etforge-firmware-image {RECIPE_VERSION}\0{lib_key}\0".encode())
    for f in (header, registration, files_dir() / "runner.cpp", files_dir() / "firmware.mk"):
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    if partitions:
        h.update((files_dir() / "tflm_delegate.cpp").read_bytes() + ops_header.encode() + flags.encode())
    h.update("\0".join(kernels + defs).encode())
    key = h.hexdigest()[:20]
    img = root / "images" / key
    elf = img / "runner.elf"
    built = ["libraries"] if lib_built else []  # (the TFLM library included)
    with _locked(root / "images" / f"{key}.lock"):
        if not elf.is_file():
            if ops_header:
                img.mkdir(parents=True, exist_ok=True)
                (img / "etforge_tflm_ops.h").write_text(ops_header)
            with _locked(root / f"libs-{lib_key}.lock"):  # kernel objects go into the library dir
                _make(
                    _lib_vars(src, lib, lib / "include")
                    + [f"IMG={img}", f"GEN={gen.resolve()}", f"KERNELS={' '.join(kernels)}",
                       f"IMG_DEFS={' '.join(defs)}", *extra, "image"],
                    f"image for {out}",
                )  # fmt: skip
            built.append("image")
    return Image(elf, key, kernels, time.monotonic() - t0 if built else 0.0, built)
