"""Test helpers: installed distributions on disk, a CLI runner (in process or a subprocess), CMSIS-NN built for the host."""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
#: Pinned third-party sources (``ETFORGE_THIRD_PARTY``, default ``shared/third_party`` beside the
#: repository or beside a directory above it, for a worktree).
THIRD_PARTY = Path(
    os.environ.get("ETFORGE_THIRD_PARTY")
    or next(
        (p / "shared" / "third_party" for p in REPO.parents if (p / "shared" / "third_party").is_dir()),
        REPO.parent / "shared" / "third_party",
    )
)
CMSIS_NN = THIRD_PARTY / "cmsis-nn"
CMSIS_NN_SHIM = Path(__file__).with_name("cmsis_nn_shim.c")


def write_distribution(
    root: Path, dist: str, version: str, entry_points: dict[str, str], modules: dict[str, str]
) -> Path:
    """An installed distribution on disk (dist-info + modules), as pip would leave it."""
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    eps = "[etforge]\n" + "".join(f"{k} = {v}\n" for k, v in entry_points.items())
    (info / "entry_points.txt").write_text(eps)
    for name, source in modules.items():
        (root / f"{name}.py").write_text(textwrap.dedent(source))
    return root


#: Environment variables ``run_cli`` can set for an in-process run (read when the command
#: runs, not at import; no kill points, no plugin paths): any other runs a subprocess.
IN_PROCESS_ENV = frozenset({"ETFORGE_NO_CACHE", "ETFORGE_CACHE_DIR", "COLUMNS"})
#: Commands that stay subprocesses: several models compile in worker processes. A device run
#: (``run --on``, ``verify --runtime``) builds firmware and runs QEMU in child processes either
#: way: in this process it saves the torch import, ~4 of its ~4.5 CPU s on a cached image
#: (issue 47); docs/firmware.md's two device commands stay end to end (tests/test_docs.py).
SUBPROCESS_ONLY = frozenset({"--manifest", "--jobs", "--ray"})


def run_cli(
    *args: str,
    pythonpath: Path | None = None,
    python: str = sys.executable,
    env: dict[str, str] | None = None,
    subprocess_only: bool = False,
) -> subprocess.CompletedProcess[str]:
    """``etforge ARGS``: in this process (``cli_in_process``) where a subprocess adds nothing —
    the same interpreter, no plugin path, only ``IN_PROCESS_ENV`` variables — else (or with
    ``subprocess_only``: the end-to-end runs) as ``python -m etforge``. Importing torch and
    ExecuTorch once per test process instead of once per command is most of what the CLI
    tests cost (issue 47)."""
    if (
        not subprocess_only
        and pythonpath is None
        and python == sys.executable
        and set(env or {}) <= IN_PROCESS_ENV
        and not SUBPROCESS_ONLY & set(args)
        and not (args and args[0] == "compile" and _several_models(args))
    ):
        return cli_in_process(*args, env=env)
    env = {**os.environ, **(env or {})}
    if pythonpath is not None:
        env["PYTHONPATH"] = f"{pythonpath}{os.pathsep}{env.get('PYTHONPATH', '')}"
    env["COLUMNS"] = "200"
    return subprocess.run(
        [python, "-m", "etforge", *args], capture_output=True, text=True, env=env, timeout=600
    )


#: ``sitecustomize`` of a child interpreter (``run_cli_recording_modules``): at exit, writes each
#: module the process imported, with its type's name (``module``, or a stand-in's class).
_MODULES_PROBE = r"""
import atexit, os, sys

def _report() -> None:
    where = os.environ.get("ETFORGE_TEST_MODULES_OUT")
    if where:
        with open(where, "w") as f:
            f.write("".join(f"{name}\t{type(m).__name__}\n" for name, m in sorted(sys.modules.items())))

atexit.register(_report)
"""


def run_cli_recording_modules(
    tmp: Path, *args: str, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], dict[str, str]]:
    """``etforge ARGS`` as a process of its own, and the modules it had imported at exit (name ->
    type name; a deferred package or module shows its stand-in's class): what a test of which
    imports a command does without reads."""
    tmp.mkdir(parents=True, exist_ok=True)
    probe, out = tmp / "probe", tmp / "modules"
    probe.mkdir(exist_ok=True)
    (probe / "sitecustomize.py").write_text(_MODULES_PROBE)
    out.unlink(missing_ok=True)
    proc = run_cli(*args, env={**(env or {}), "ETFORGE_TEST_MODULES_OUT": str(out)}, pythonpath=probe)
    modules = dict(line.split("\t") for line in out.read_text().splitlines()) if out.is_file() else {}
    return proc, modules


def compile_each(models: list[str], target: str, root: Path) -> dict[str, Path]:
    """``etforge compile MODEL... --target TARGET -o ROOT``'s output directories (model -> its
    ``ROOT/<model>/<target>``), each job's own command (``core.batch.run.plan``, what a batch
    child runs) in this process: a fixture that needs the programs, not the batch, saves a child
    process -- a torch import, about 5 s of CPU -- per model (issue 47); a job another file of the
    session compiled already is a copy of its output (``shared_outputs.compile_once``). The batch
    path itself is tested end to end in test_batch.py, test_no_cache.py and test_cache_sound.py."""
    from shared_outputs import compile_once

    from etforge.core.batch.run import plan

    found = {}
    for model, job in zip(models, plan(models, [target], [], root), strict=True):
        argv = job.argv()
        at = argv.index("-o")
        proc = compile_once(*argv[1:at], *argv[at + 2 :], out=Path(job.out))
        assert proc.returncode == 0, f"{' '.join(argv)}\n{proc.stdout}{proc.stderr}"
        found[model] = Path(job.out)
    return found


def _several_models(args: tuple[str, ...]) -> bool:
    """More than one positional MODEL after ``compile`` (a batch: worker processes)."""
    positional, skip = 0, False
    for a in args[1:]:
        if skip:
            skip = False
        elif a.startswith("-"):
            skip = "=" not in a and a not in (
                "--float",
                "--no-cache",
                "--quiet",
                "-q",
                "--json",
                "--no-fallback",
            )
        else:
            positional += 1
    return positional > 1


def cli_in_process(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``etforge ARGS`` run by click's runner in this process, as ``run_cli`` returns it: exit
    code, stdout, and stderr — Python's and what native code wrote to file descriptors 1 and 2
    (LiteRT's and ExecuTorch's C++ logs), so a test of the output sees what a terminal would.
    The CLI's per-run state (``--debug``, ``--quiet``, a broken pipe, the console width, the
    root logger's handlers) is reset around the run."""
    import logging
    import tempfile

    from click.testing import CliRunner

    from etforge.cli import common, main

    env = {"COLUMNS": "200", **(env or {})}
    saved = dict(common.DEBUG), dict(common.OUTPUT), dict(common.PIPE)
    widths = common.console.width, common.err_console.width
    common.DEBUG["on"] = env.get("ETFORGE_DEBUG", os.environ.get("ETFORGE_DEBUG", "")) not in ("", "0")
    common.console.width = common.err_console.width = int(env["COLUMNS"])
    sys.stdout.flush()
    sys.stderr.flush()
    native = [tempfile.TemporaryFile(), tempfile.TemporaryFile()]
    kept = [os.dup(1), os.dup(2)]
    # A log record reaches stderr as in a process of its own (``logging.lastResort``), not
    # pytest's capture handlers on the root logger.
    root_handlers, logging.getLogger().handlers = logging.getLogger().handlers, []
    try:
        os.dup2(native[0].fileno(), 1)
        os.dup2(native[1].fileno(), 2)
        result = CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)
    finally:
        os.dup2(kept[0], 1)
        os.dup2(kept[1], 2)
        for fd in kept:
            os.close(fd)
        common.DEBUG.update(saved[0])
        common.OUTPUT.update(saved[1])
        common.PIPE.update(saved[2])
        common.console.width, common.err_console.width = widths
        logging.getLogger().handlers = root_handlers
    out, err = (_read(f) for f in native)
    return subprocess.CompletedProcess(
        ["etforge", *args], result.exit_code, result.stdout + out, result.stderr + err
    )


def _read(f: Any) -> str:
    f.seek(0)
    text = f.read().decode(errors="replace")
    f.close()
    return text


def conv_head(calibration: int = 4) -> tuple[Any, list[tuple[Any, ...]]]:
    """A seeded conv -> ReLU -> global average pool -> linear head (eval) and seeded
    1x3x8x8 calibration batches: the smallest model that makes an NPU partition."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(8, 4),
    ).eval()
    g = torch.Generator().manual_seed(1)
    return model, [(torch.randn(1, 3, 8, 8, generator=g),) for _ in range(calibration)]


def torchvision_models() -> Any:
    """``torchvision.models``, importable beside the CPU torch wheel (model definitions only).

    The registry's torchvision wheel is built against CUDA torch: its C ops do not load, and
    ``import torchvision`` fails registering their meta/autograd kernels. Empty modules stand
    in for those two registration modules; ``torchvision.models`` needs no C op."""
    import sys
    import types

    for name in ("torchvision._meta_registrations", "torchvision._autograd_registrations"):
        sys.modules.setdefault(name, types.ModuleType(name))
    import torchvision.models

    return torchvision.models


def _cmsis_nn_sources() -> list[Path]:
    """The int8 CMSIS-NN sources (float, int16-only, int4, LSTM and SVDF parts left out)."""
    skip = ("_f16", "_f32", "_flt", "_s4", "lstm", "svdf")
    out = []
    for p in sorted((CMSIS_NN / "Source").glob("*/*.c")):
        name = p.name.lower()
        if any(s in name for s in skip) or (name.endswith("s16.c") and "s8_s16" not in name):
            continue
        out.append(p)
    return out


def cmsis_nn_library(cache: Path) -> ctypes.CDLL | None:
    """CMSIS-NN's int8 C sources and ``tests/cmsis_nn_shim.c`` built for the host with gcc (once
    per content, kept in ``cache``); None when the sources are not there."""
    if not (CMSIS_NN / "Include" / "arm_nnfunctions.h").is_file():
        return None
    sources = [*_cmsis_nn_sources(), CMSIS_NN_SHIM]
    digest = hashlib.sha256()
    for p in sources:
        digest.update(p.name.encode() + p.read_bytes())
    so = cache / f"libcmsisnn-{digest.hexdigest()[:16]}.so"
    if not so.exists():
        tmp = so.with_suffix(f".{os.getpid()}.tmp")  # two workers may build at once
        cmd = ["gcc", "-O1", "-shared", "-fPIC", "-w", f"-I{CMSIS_NN / 'Include'}", "-DARM_NN_ENABLE_F32=0",
               "-DARM_NN_ENABLE_F16=0", "-o", str(tmp), *map(str, sources), "-lm"]  # fmt: skip
        subprocess.run(cmd, check=True, capture_output=True)
        tmp.replace(so)
    return ctypes.CDLL(str(so))


def compiled_architecture(name: str, target: str) -> tuple[Any, dict[str, Any]]:
    """(compile result, report) of ``tests/models/architectures.py``'s model ``name`` for
    ``target``, compiled in this process (the programs a host-side check reads)."""
    from models.architectures import build

    from etforge.core.build.report import build_report
    from etforge.core.build.session import compile_model
    from etforge.core.registry.manager import registry

    model, _, calibration = build(name)
    reg = registry()
    result = compile_model(model.eval(), calibration[0], target, calibration=calibration, reg=reg)
    return result, build_report(result, reg, name)


def same_leaves(a: Any, b: Any) -> bool:
    """Bit for bit: the same tree, dtypes, values and signs of zero."""
    import torch

    la, sa = torch.utils._pytree.tree_flatten(a)
    lb, sb = torch.utils._pytree.tree_flatten(b)
    return sa == sb and all(
        x.dtype == y.dtype and torch.equal(x, y) and torch.equal(torch.signbit(x), torch.signbit(y))
        if isinstance(x, torch.Tensor)
        else x == y
        for x, y in zip(la, lb, strict=True)
    )
