"""What ``etforge run`` and ``etforge verify --runtime`` print: plain lines and JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from etforge.runtime.firmware.device import DeviceRun, DeviceVerification


def _built(seconds: float, built: list[str]) -> str:
    return f"built {' and '.join(built)} in {seconds:.1f} s" if built else "from the build cache"


def run_lines(dev: DeviceRun) -> list[str]:
    q = dev.qemu
    lines = [
        f"image {dev.image.elf} ({_built(dev.image.seconds, dev.image.built)}; kernels compiled for this "
        f"program: {len(dev.image.kernels)})",
        "planned memory per memory id (bytes, allocated by ExecuTorch in the image's arena): "
        + ", ".join(str(b) for b in q.planned),
    ]
    for s, outs in enumerate(dev.outputs):
        shown = "; ".join(
            f"output {j} {str(o.dtype).removeprefix('torch.')}{list(o.shape)} {o.flatten()[:6].tolist()}"
            + ("..." if o.numel() > 6 else "")
            for j, o in enumerate(outs)
        )
        lines.append(f"sample {s}: {q.instructions[s]:,} instructions; {shown}")
    lines.append(
        f"instructions per inference: {dev.instruction_label} (resolution {q.instructions_per_tick})"
    )
    if dev.per_op:
        top = sorted(dev.per_op, key=lambda r: -r["instructions"])[:5]
        lines.append(
            "most instructions, sample 0 (per op: --json): "
            + "; ".join(f"#{r['instruction']} {r['op']} {r['instructions']:,}" for r in top)
        )
    elif dev.per_op_note:
        lines.append(dev.per_op_note)
    lines += partition_lines(dev.qemu.tflm_arenas, dev.per_op, q.instructions[0] if q.instructions else 0)
    return lines


def partition_lines(arenas: list[tuple[int, int]], per_op: list[dict[str, Any]], total: int) -> list[str]:
    """Where the NPU partitions ran when they ran on the CPU (TFLM), their arenas and counts."""
    if not arenas:
        return []
    lines = [
        f"NPU partitions ran on the Cortex-M33 in TensorFlow Lite Micro with CMSIS-NN (--cpu-partitions), "
        f"not on the NPU: {len(arenas)} partition(s); TFLM arena per partition (bytes, used of reserved): "
        + ", ".join(f"{used:,} of {size:,}" for size, used in arenas)
    ]
    delegates = [r for r in per_op if str(r["op"]).startswith("delegate")]
    if delegates and total:
        in_parts = sum(r["instructions"] for r in delegates)
        lines.append(
            "instructions, sample 0: "
            + "; ".join(f"partition at #{r['instruction']} {r['instructions']:,}" for r in delegates)
            + f"; CPU side (ExecuTorch runtime and CPU kernels) {total - in_parts:,}"
        )
    return lines


def run_json(dev: DeviceRun) -> dict[str, Any]:
    return {
        "runtime": dev.runtime,
        "image": str(dev.image.elf),
        "built": dev.image.built,
        "build_seconds": dev.image.seconds,
        "kernel_sources": dev.image.kernels,
        "planned_bytes": dev.qemu.planned,
        "instructions": dev.qemu.instructions,
        "instruction_label": dev.instruction_label,
        "instructions_resolution": dev.qemu.instructions_per_tick,
        "per_op": dev.per_op,
        "per_op_note": dev.per_op_note,
        "outputs": [[o.tolist() for o in outs] for outs in dev.outputs],
    }


def save_outputs(dev: DeviceRun, path: Path) -> None:
    """``path`` (.npz): ``out<j>`` arrays with a leading sample dimension."""
    arrays = {
        f"out{j}": np.stack([dev.outputs[s][j].contiguous().numpy() for s in range(len(dev.outputs))])
        for j in range(len(dev.outputs[0]) if dev.outputs else 0)
    }
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, **arrays)
    tmp.replace(path)  # never a half-written file under the final name


def verification_lines(v: DeviceVerification) -> list[str]:
    per = sorted(v.instructions)
    median = per[len(per) // 2] if per else 0
    return [
        f"image {v.image} ({_built(v.build_seconds, v.built)})",
        f"outputs identical to the host interpreter, bit for bit: {v.identical}/{v.samples} samples",
        f"planned memory per memory id on the device: {v.planned} bytes; report.json arena: {v.report_arena}",
        f"instructions per inference: {median:,} (median of {len(per)}; {v.instruction_label})",
        *partition_lines(v.tflm_arenas, v.per_op, v.instructions[0] if v.instructions else 0),
    ]
