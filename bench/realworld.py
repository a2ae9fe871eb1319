"""Benchmark: torchvision's families (tests/models/torchvision_families.py) on every RT700 target.

Run: .venv/bin/python bench/realworld.py [--families ...] [--targets ...] [--samples 4]
                                         [--resolution 96] [--no-bare] [--markdown]

Per family and target: does it compile, NPU partitions, the NPU's share of the MACs,
boundary transposes (TRANSPOSE ops in the partitions), the CPU's operators (q/dq excluded),
the lowering path (early / classic, and why), ``verify`` (the ``.pte`` run on the host
against the PT2E quantized reference), the compile's wall time and, beside it, the bare
ExecuTorch flow's on the same module and calibration tensors: ``torch.export``, PT2E with
ExecuTorch's XNNPACK quantizer, a partitioner-free ``to_edge_transform_and_lower``,
``to_executorch`` (bench/process.py's flow, here in-process: imports excluded from both).
Single-threaded torch; the table is docs/targets.md's "Real models (torchvision)".
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from architectures import cpu_ops, npu_refusals  # noqa: E402  (bench/architectures.py)
from bare_flow import pte as bare_pte  # noqa: E402  (bench/bare_flow.py)
from models.torchvision_families import FAMILIES, RESOLUTION, build  # noqa: E402

from etforge.api import compile as compile_model  # noqa: E402
from etforge.core.common.errors import EtforgeError  # noqa: E402


def bare_flow(model: torch.nn.Module, example: tuple[torch.Tensor, ...], calibration: list[Any]) -> float:
    """Seconds of the bare ExecuTorch flow (bench/bare_flow.py) on ``model``."""
    start = time.perf_counter()
    bare_pte(model, example, calibration)
    return time.perf_counter() - start


def row(family: str, target: str, samples: int, resolution: int, bare: float | None) -> dict[str, Any]:
    model, example, calibration = build(family, resolution)
    base = {"family": family, "target": target, "bare_s": bare}
    start = time.perf_counter()
    try:
        compiled = compile_model(model, example, target=target, calibration=calibration)
    except EtforgeError as exc:
        return {**base, "refused": str(exc)}
    except Exception as exc:  # a crash is a row too: the table must show it, not stop
        return {**base, "refused": f"CRASH {type(exc).__name__}: {exc}"}
    seconds = time.perf_counter() - start
    report = compiled.report
    try:
        verification = compiled.verify(samples=samples)
        verdict = "pass" if verification.ok else "FAIL: " + "; ".join(verification.failures)
    except Exception as exc:  # noqa: BLE001 (shown in the table)
        verdict = f"verify CRASH {type(exc).__name__}: {exc}"
    lowering = report.get("lowering", {})
    return {
        **base,
        "partitions": len(report["partitions"]),
        "npu_share": report["macs"]["npu_share"],
        "transposes": sum(p["boundary_transposes"] for p in report["partitions"]),
        "cpu_ops": cpu_ops(report),
        "lowering": lowering.get("path", "?"),
        "lowering_reason": lowering.get("reason", ""),
        "fallback": bool(lowering.get("fallback")),
        "verify": verdict,
        "compile_s": seconds,
        "refusals": npu_refusals(report),
    }


HEADER = (
    "| family | target | compiles | partitions | NPU MAC share | boundary transposes | CPU ops "
    "| lowering | verify | compile s | bare ExecuTorch s | ratio |"
)


def table(rows: list[dict[str, Any]]) -> str:
    lines = [HEADER, "|" + "---|" * (HEADER.count("|") - 1)]
    for r in rows:
        bare = f"{r['bare_s']:.1f}" if r.get("bare_s") else "–"
        if "refused" in r:
            why = r["refused"][:300].replace("|", "/")
            lines.append(f"| {r['family']} | {r['target']} | **no**: {why} |" + " – |" * 7 + f" {bare} | – |")
            continue
        ops = ", ".join(r["cpu_ops"]) or "–"
        path = r["lowering"] + (" (fallback)" if r["fallback"] else "")
        ratio = f"{r['compile_s'] / r['bare_s']:.2f}" if r.get("bare_s") else "–"
        lines.append(
            f"| {r['family']} | {r['target']} | yes | {r['partitions']} | {r['npu_share']:.0%} | "
            f"{r['transposes']} | {ops} | {path} | {r['verify']} | {r['compile_s']:.1f} | {bare} | {ratio} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--targets", default="imxrt700,imxrt700cm,cortex-m33")
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--resolution", type=int, default=RESOLUTION)
    parser.add_argument("--no-bare", action="store_true", help="skip the bare ExecuTorch flow's timing")
    parser.add_argument("--markdown", action="store_true", help="the docs table plus the CPU reasons")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    print(HEADER, flush=True)
    for family in args.families.split(","):
        bare = None
        if not args.no_bare:
            model, example, calibration = build(family, args.resolution)
            bare = bare_flow(model, example, calibration)
        for target in args.targets.split(","):
            rows.append(row(family, target, args.samples, args.resolution, bare))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    print()
    print(table(rows))
    if args.markdown:
        print()
        for r in rows:
            if r.get("fallback"):
                print(f"- {r['family']} on {r['target']}: classic lowering: {r['lowering_reason']}")
            if r.get("refusals") and r["target"] != "cortex-m33" and r.get("partitions", 0) != 1:
                print(f"- {r['family']} on {r['target']}: " + "; ".join(r["refusals"]))


if __name__ == "__main__":
    main()
