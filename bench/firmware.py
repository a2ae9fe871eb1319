"""Benchmark: every zoo model, architecture family (and torchvision family) compiled for
cortex-m33, imxrt700 and imxrt700cm, run whole in ExecuTorch's C++ runtime on QEMU's
mps2-an505 (Cortex-M33), bit for bit against etforge's host interpreter
(``etforge verify OUT --runtime qemu-m33 [--cpu-partitions]``); and beside it, each model whole
in TensorFlow Lite Micro (the single partition of a ``--target litert`` compile).

Run: .venv/bin/python bench/firmware.py [--samples 3] [--target cortex-m33|imxrt700|imxrt700cm|all ...]
     [--only NAME ...] [--torchvision] [--tflm] [--markdown]

Per program: identical samples / samples, instructions per inference (QEMU's ``-icount``: an
emulator count, not device cycles), the arena ExecuTorch planned on the device beside
report.json's, and the first difference when there is one. On the NPU targets the partitions
run in TFLM with CMSIS-NN on the Cortex-M33 (``--cpu-partitions``: a stand-in, not the NPU);
the row splits the count into the partitions and the CPU side and gives the TFLM arena used /
reserved. ``--tflm`` prints, per model, etforge's cortex-m33 program beside the same model
whole in TFLM (``--target litert``'s one partition, run by the same image's TFLM delegate):
instructions per inference and RAM (etforge: planned arena + ExecuTorch's method allocator as
used on the device; TFLM: its arena as used, and as reserved by etforge's compile-time figure).
The test suite runs a few of each (tests/test_firmware*.py); this runs all (docs/firmware.md).
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
os.environ.setdefault("ETFORGE_TFLM_SRC", str(THIRD_PARTY / "tflite-micro"))
os.environ.setdefault("ETFORGE_TFLM_DEPS", str(THIRD_PARTY / "tflm-deps"))

#: Input side of the torchvision rows (as tests/test_firmware_torchvision.py).
TORCHVISION_RESOLUTION = 64
TARGETS = ("cortex-m33", "imxrt700", "imxrt700cm")


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


def _compile(made: tuple[Any, Any, Any], target: str, root: Path, name: str) -> Path:
    model, example, calibration = made
    compiled = etforge.compile(model, example, target=target, calibration=calibration)
    out = compiled.save(root / f"{name.replace(':', '_')}-{target}")
    compiled.codegen(out / "codegen")
    return out


def row(name: str, make: Any, root: Path, samples: int, target: str = "cortex-m33") -> dict[str, Any]:
    """One program on the device: ``make`` is a builder from ``programs`` or what it built."""
    out = _compile(make() if callable(make) else make, target, root, name)
    v = device.verify(out, "qemu-m33", samples=samples, cpu_partitions=target != "cortex-m33")
    delegates = [r["instructions"] for r in v.per_op if r["op"].startswith("delegate")]
    total = v.instructions[0] if v.instructions else None
    return {
        "program": name,
        "target": target,
        "identical": f"{v.identical}/{v.samples}",
        "instructions": total,
        "resolution": v.instructions_per_tick,
        "partitions": sum(delegates) if delegates else None,
        "cpu_side": total - sum(delegates) if delegates and total else None,
        "tflm_arena": v.tflm_arenas,
        "arena": v.planned == v.report_arena,
        "planned": sum(v.planned),
        "method_pool": v.method_allocator_bytes,
        "first_difference": v.first_difference or "; ".join(v.failures) or "",
    }


def tflm_row(name: str, made: tuple[Any, Any, Any], root: Path, samples: int) -> dict[str, Any]:
    """The model whole in TFLM: a ``litert`` compile's one partition, run by the image's TFLM
    delegate, checked against the host (LiteRT's reference kernels in TFLM's arithmetic)."""
    out = _compile(made, "litert", root, name)
    report, interp = device._load(out)
    if len(interp.plan.delegates) != 1:
        raise RuntimeError(f"litert compile has {len(interp.plan.delegates)} partitions, not one")
    batches = device.seeded_inputs(report, 0, samples)
    dev = device.run_program(out, interp, batches, cpu_partitions=True)
    same = sum(
        all(
            h.contiguous().numpy().tobytes() == d.contiguous().numpy().tobytes()
            for h, d in zip(interp.run(list(b), kernels="tflm"), outs, strict=True)
        )
        for b, outs in zip(batches, dev.outputs, strict=True)
    )
    partition = next(r["instructions"] for r in dev.per_op if r["op"].startswith("delegate"))
    (reserved, used) = dev.qemu.tflm_arenas[0]
    return {
        "identical": f"{same}/{samples}",
        "partition": partition,
        "tflm_used": used,
        "tflm_reserved": reserved,
    }


def _count(n: int | None) -> str:
    return f"{n:,}" if n else "-"


def _markdown(rows: list[dict[str, Any]], side: list[dict[str, Any]]) -> None:
    if rows:
        print("| program | target | bit-exact samples | instructions / inference (emulator count) "
              "| in TFLM partitions / CPU side | TFLM arena used / reserved (B) | arena = report |")  # fmt: skip
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            split = f"{_count(r['partitions'])} / {_count(r['cpu_side'])}" if r.get("partitions") else "-"
            arenas = ", ".join(f"{u:,} / {a:,}" for a, u in r["tflm_arena"]) if r.get("tflm_arena") else "-"
            print(f"| {r['program']} | {r['target']} | {r['identical']} | {_count(r['instructions'])} "
                  f"| {split} | {arenas} | {'yes' if r['arena'] else 'no'} |")  # fmt: skip
    if side:
        print()
        print("| model | etforge cortex-m33 instructions | TFLM instructions (partition) | ratio "
              "| etforge RAM: arena + method pool (B) | TFLM arena used / reserved (B) | bit-exact (etforge / TFLM) |")  # fmt: skip
        print("|---|---|---|---|---|---|---|")
        for s in side:
            ratio = f"{s['etforge'] / s['tflm']:.4f}" if s.get("etforge") and s.get("tflm") else "-"
            ram = (
                f"{s['arena']:,} + {s['method_pool']:,} = {s['arena'] + s['method_pool']:,}"
                if s.get("arena")
                else "-"
            )
            tram = f"{s['tflm_used']:,} / {s['tflm_reserved']:,}" if s.get("tflm_used") else "-"
            print(f"| {s['program']} | {_count(s.get('etforge'))} | {_count(s.get('tflm'))} | {ratio} | {ram} "
                  f"| {tram} | {s.get('etforge_identical', '-')} / {s.get('tflm_identical', '-')} |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--torchvision", action="store_true", help="also every torchvision family")
    parser.add_argument("--target", nargs="+", choices=[*TARGETS, "all"], default=["cortex-m33"])
    parser.add_argument(
        "--tflm",
        action="store_true",
        help="also each model whole in TFLM beside etforge's cortex-m33 program",
    )
    args = parser.parse_args()
    targets = list(TARGETS) if "all" in args.target else list(dict.fromkeys(args.target))
    if args.tflm and "cortex-m33" not in targets:
        targets.insert(0, "cortex-m33")
    chosen = [
        (n, m)
        for n, m in programs(args.torchvision)
        if not args.only or n in args.only or n.split(":", 1)[-1] in args.only
    ]
    rows: list[dict[str, Any]] = []
    side: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, make in chosen:
            made = make()
            for target in targets:
                try:
                    r = row(name, made, Path(tmp), args.samples, target)
                except Exception as exc:  # a bench row, not a gate: print it and go on
                    r = {"program": name, "target": target, "identical": "error", "instructions": None,
                         "arena": False, "first_difference": f"{type(exc).__name__}: {exc}"}  # fmt: skip
                rows.append(r)
                print(r, flush=True, file=sys.stderr if args.markdown else sys.stdout)
            if args.tflm:
                m33 = next(r for r in rows if r["program"] == name and r["target"] == "cortex-m33")
                s: dict[str, Any] = {
                    "program": name, "etforge": m33["instructions"], "etforge_identical": m33["identical"],
                    "arena": m33.get("planned"), "method_pool": m33.get("method_pool", 0),
                }  # fmt: skip
                try:
                    t = tflm_row(name, made, Path(tmp), args.samples)
                    s.update(tflm=t["partition"], tflm_identical=t["identical"], tflm_used=t["tflm_used"],
                             tflm_reserved=t["tflm_reserved"])  # fmt: skip
                except Exception as exc:  # noqa: BLE001
                    s["tflm_error"] = f"{type(exc).__name__}: {exc}"
                side.append(s)
                print(s, flush=True, file=sys.stderr if args.markdown else sys.stdout)
    if args.markdown:
        _markdown(rows, side)
    bad = [r for r in rows if r["identical"] != f"{args.samples}/{args.samples}"]
    print(f"{len(rows) - len(bad)}/{len(rows)} programs bit-exact on QEMU", flush=True)
    for r in bad:
        print(f"  {r['program']} ({r['target']}): {r['first_difference']}")
    for s in side:
        if s.get("tflm_error") or s.get("tflm_identical") != f"{args.samples}/{args.samples}":
            print(f"  {s['program']} whole in TFLM: {s.get('tflm_error') or s.get('tflm_identical')}")


if __name__ == "__main__":
    main()
