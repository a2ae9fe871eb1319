"""Benchmark: the architecture suite (tests/models/architectures.py) on every RT700 target.

Run: .venv/bin/python bench/architectures.py [--families ...] [--targets ...] [--samples 4] [--markdown]
Per family and target: NPU partitions, the NPU's share of the MACs, boundary transposes
(TRANSPOSE ops in the partitions), the operators left on the CPU (kernel-library ops of the
final program, q/dq excluded), and ``verify`` (host run vs the PT2E quantized reference).
A family the kernel rule refuses shows the refusal. With ``--markdown`` the table is the
one in docs/targets.md ("Architecture suite"); below it, why each family that is not one
partition on an NPU target keeps ops on the CPU (each refused node's op and reason, from
the report).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from models.architectures import FAMILIES, build  # noqa: E402

from etforge.api import compile as compile_model  # noqa: E402
from etforge.core.common.errors import EtforgeError  # noqa: E402

#: CPU ops that only move data in and out of int8 (not worth a column).
QDQ = ("quantize_per_tensor", "dequantize_per_tensor", "alloc", "getitem")


def cpu_ops(report: dict[str, Any]) -> list[str]:
    """The final program's CPU operators, without quantize/dequantize and bookkeeping."""
    return sorted(
        {
            op.split(".")[-2]
            for op in report["cpu_ops"]
            if not any(q in op for q in QDQ) and op.count(".") >= 2
        }
    )


def npu_refusals(report: dict[str, Any]) -> list[str]:
    """``op: reason`` of each distinct node the NPU refused (why a family is not one partition)."""
    seen: dict[str, str] = {}
    for n in report["nodes"]:
        if n["placement"] != "npu" and n.get("reason") and "quantize" not in n["op"]:
            seen.setdefault(n["op"], n["reason"])
    return [f"{op}: {why}" for op, why in seen.items()]


def row(family: str, target: str, samples: int) -> dict[str, Any]:
    model, example, calibration = build(family)
    try:
        compiled = compile_model(model, example, target=target, calibration=calibration)
    except EtforgeError as exc:
        return {"family": family, "target": target, "refused": str(exc)}
    except Exception as exc:  # a crash is a row too: the table must show it, not stop
        return {"family": family, "target": target, "refused": f"CRASH {type(exc).__name__}: {exc}"}
    report = compiled.report
    try:
        verification = compiled.verify(samples=samples)
    except Exception as exc:  # noqa: BLE001 (shown in the table)
        return {"family": family, "target": target, "refused": f"verify CRASH {type(exc).__name__}: {exc}"}
    return {
        "family": family,
        "target": target,
        "partitions": len(report["partitions"]),
        "npu_share": report["macs"]["npu_share"],
        "transposes": sum(p["boundary_transposes"] for p in report["partitions"]),
        "cpu_ops": cpu_ops(report),
        "verify": "pass" if verification.ok else "FAIL: " + "; ".join(verification.failures),
        "refusals": npu_refusals(report),
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| family | target | partitions | NPU MAC share | boundary transposes | CPU ops | verify |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "refused" in r:
            lines.append(f"| {r['family']} | {r['target']} | – | – | – | – | refused: {r['refused']} |")
            continue
        ops = ", ".join(r["cpu_ops"]) or "–"
        lines.append(
            f"| {r['family']} | {r['target']} | {r['partitions']} | {r['npu_share']:.0%} | "
            f"{r['transposes']} | {ops} | {r['verify']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--targets", default="imxrt700,imxrt700cm,cortex-m33")
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--markdown", action="store_true", help="the docs table plus the CPU reasons")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for family in args.families.split(","):
        for target in args.targets.split(","):
            rows.append(row(family, target, args.samples))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    print()
    print(table(rows))
    if args.markdown:
        print()
        for r in rows:
            if r.get("refusals") and r["target"] != "cortex-m33":
                print(f"- {r['family']} on {r['target']}: " + "; ".join(r["refusals"]))


if __name__ == "__main__":
    main()
