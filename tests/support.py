"""Test helpers: installed distributions on disk, a CLI runner in a subprocess, CMSIS-NN built for the host."""

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


def run_cli(
    *args: str,
    pythonpath: Path | None = None,
    python: str = sys.executable,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **(env or {})}
    if pythonpath is not None:
        env["PYTHONPATH"] = f"{pythonpath}{os.pathsep}{env.get('PYTHONPATH', '')}"
    env["COLUMNS"] = "200"
    return subprocess.run(
        [python, "-m", "etforge", *args], capture_output=True, text=True, env=env, timeout=600
    )


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
