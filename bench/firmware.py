"""Benchmark: every zoo model and architecture family compiled for cortex-m33, run in
ExecuTorch's C++ runtime with CMSIS-NN on QEMU's mps2-an505 (Cortex-M33), bit for bit against
etforge's host interpreter (``etforge verify OUT --runtime qemu-m33``).

Run: .venv/bin/python bench/firmware.py [--samples 3] [--only NAME ...] [--torchvision] [--markdown]

Per program: identical samples / samples, instructions per inference (QEMU's ``-icount``: an
emulator count, not device cycles), the arena ExecuTorch planned on the device beside
report.json's, and the first difference when there is one. The test suite runs five zoo
models and five families (tests/test_firmware.py); this runs all of them (docs/firmware.md).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from models.architectures import FAMILIES, build  # noqa: E402

import etforge  # noqa: E402
from etforge import zoo  # noqa: E402
from etforge.runtime.firmware import device  # noqa: E402

from support import THIRD_PARTY  # noqa: E402

# The sources are the user's (docs/firmware.md, Sources); like the tests, use CI's snapshots.
os.environ.setdefault("ETFORGE_EXECUTORCH_SRC", str(THIRD_PARTY / "executorch"))
os.environ.setdefault("ETFORGE_CMSIS_NN_SRC", str(THIRD_PARTY / "cmsis-nn"))

#: Input side of the torchvision rows (as tests/test_firmware_torchvision.py).
TORCHVISION_RESOLUTION = 64


def programs(torchvision: bool = False) -> list[tuple[str, Any]]:
    """(name, builder of (model, example, calibration)) for every zoo model and family, and
    with ``torchvision`` every torchvision family (tests/models/torchvision_families.py)."""
    out: list[tuple[str, Any]] = []
    for name in zoo.ZOO:
        out.append((f"zoo:{name}", lambda n=name: (*zoo.build(n), zoo.calibration(n, 4))))
    for family in FAMILIES:
        out.append((family, lambda f=family: build(f)))
    if torchvision:
        from models import torchvision_families as tv

        for name in tv.FAMILIES:
            out.append(
                (
                    f"torchvision:{name}",
                    lambda n=name: tv.build(n, resolution=TORCHVISION_RESOLUTION, calibration=4),
                )
            )
    return out


def row(name: str, make: Any, root: Path, samples: int) -> dict[str, Any]:
    model, example, calibration = make()
    compiled = etforge.compile(model, example, target="cortex-m33", calibration=calibration)
    out = compiled.save(root / name.replace(":", "_"))
    compiled.codegen(out / "codegen")
    v = device.verify(out, "qemu-m33", samples=samples)
    return {
        "program": name,
        "identical": f"{v.identical}/{v.samples}",
        "instructions": v.instructions[0] if v.instructions else None,
        "resolution": v.instructions_per_tick,
        "arena": v.planned == v.report_arena,
        "first_difference": v.first_difference or "; ".join(v.failures) or "",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--torchvision", action="store_true", help="also every torchvision family")
    args = parser.parse_args()
    chosen = [
        (n, m)
        for n, m in programs(args.torchvision)
        if not args.only or n in args.only or n.split(":", 1)[-1] in args.only
    ]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, make in chosen:
            try:
                r = row(name, make, Path(tmp), args.samples)
            except Exception as exc:  # a bench row, not a gate: print it and go on
                r = {"program": name, "identical": "error", "instructions": None, "arena": False,
                     "first_difference": f"{type(exc).__name__}: {exc}"}  # fmt: skip
            rows.append(r)
            if not args.markdown:
                print(r, flush=True)
    if args.markdown:
        print("| program | bit-exact samples | instructions / inference (emulator count) | arena = report |")
        print("|---|---|---|---|")
        for r in rows:
            count = f"{r['instructions']:,}" if r["instructions"] else "-"
            print(f"| {r['program']} | {r['identical']} | {count} | {'yes' if r['arena'] else 'no'} |")
    bad = [r for r in rows if r["identical"] != f"{args.samples}/{args.samples}"]
    print(f"{len(rows) - len(bad)}/{len(rows)} programs bit-exact on QEMU", flush=True)
    for r in bad:
        print(f"  {r['program']}: {r['first_difference']}")


if __name__ == "__main__":
    main()
