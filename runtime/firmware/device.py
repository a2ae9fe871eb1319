"""Run a compiled program in ExecuTorch's C++ runtime on an emulated Cortex-M33 and check it.

``run`` builds (or reuses) the image for ``OUT`` and runs ``model.pte`` on seeded inputs (made
as ``etforge verify`` makes them) or on inputs from a ``.npz``; ``verify`` also runs the same
inputs in etforge's host interpreter of the serialized program and requires every output to
be the same bytes, and the buffers ExecuTorch planned on the device to be the arena
``report.json`` states.

Programs with NPU partitions need their delegate's device runtime linked into the image;
``DELEGATE_BACKENDS`` is where such a backend is registered (none is: the Neutron runtime comes
with NXP's SDK). With ``cpu_partitions`` (an explicit opt-in) host-only LiteRT partitions run in
TensorFlow Lite Micro on the CPU instead (``tflm.py``) and ``verify`` compares them with LiteRT's
reference kernels in TFLM's arithmetic (``runtime.arithmetic.tflm_arith``); Neutron microcode, or partitions without the opt-in, are refused before
anything is built.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from etforge.core.build import output
from etforge.core.common.errors import EtforgeError
from etforge.runtime.firmware.build import Image, build_image
from etforge.runtime.firmware.qemu import INSTRUCTION_LABEL, QemuRun
from etforge.runtime.firmware.qemu import run as run_qemu

#: The device runtimes ``run``/``verify`` know: name -> the CPU the image is built for.
RUNTIMES = {"qemu-m33": "cortex-m33"}


@dataclass(frozen=True)
class DelegateBackend:
    """A delegate's device runtime: sources compiled into the image, one of which defines
    ``extern "C" int etforge_register_delegates(void)`` registering the backend with ExecuTorch."""

    backend_id: str
    sources: tuple[Path, ...]


#: Backend id -> its device runtime. Empty: no NPU runtime ships without NXP's SDK.
DELEGATE_BACKENDS: dict[str, DelegateBackend] = {}


#: The event ExecuTorch's tracer records for each kind of instruction (runtime/executor/method.cpp).
_EVENT_OF = {
    "KernelCall": "OPERATOR_CALL",
    "DelegateCall": "DELEGATE_CALL",
    "MoveCall": "MOVE_CALL",
    "FreeCall": "FREE_CALL",
    "JumpFalseCall": "JF_CALL",
}


@dataclass
class DeviceRun:
    runtime: str
    image: Image
    qemu: QemuRun
    inputs: list[tuple[torch.Tensor, ...]]
    outputs: list[list[torch.Tensor]]  #: per sample, logical shapes (as the host interpreter's)
    #: First sample, per instruction: {"instruction", "op", "instructions"} (a delegate call
    #: also its "partition"); empty when the tracer's events cannot be matched to the plan one
    #: to one (``per_op_note`` says why).
    per_op: list[dict[str, Any]] = field(default_factory=list)
    per_op_note: str = ""
    instruction_label: str = INSTRUCTION_LABEL


@dataclass
class DeviceVerification:
    runtime: str
    samples: int
    identical: int
    first_difference: str | None
    planned: list[int]
    report_arena: list[int]
    instructions: list[int]
    instruction_label: str = INSTRUCTION_LABEL
    per_op: list[dict[str, Any]] = field(default_factory=list)
    image: str = ""
    build_seconds: float = 0.0
    built: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    #: Host-only partitions run in TFLM on the CPU: (arena bytes, used) each; empty otherwise.
    tflm_arenas: list[tuple[int, int]] = field(default_factory=list)
    #: The count's quantum: instructions per timer tick (a count is a whole number of ticks,
    #: so two runs of one program may differ by one tick where the tick's phase moves).
    instructions_per_tick: int = 0
    #: Bytes ExecuTorch's method allocator used on the device (the runtime's own structures).
    method_allocator_bytes: int = 0

    @property
    def ok(self) -> bool:
        return not self.failures


def _load(out: Path) -> tuple[dict[str, Any], Any]:
    from etforge.core.serialize.pte_check import check_pte
    from etforge.runtime.execution.pte_interpreter import PteInterpreter

    output.recover(out)
    report_path, pte_path = out / output.REPORT, out / output.PTE
    if not report_path.is_file() or not pte_path.is_file():
        raise EtforgeError(
            f"{out}: no compiled program here (missing {output.PTE} or {output.REPORT}); run etforge compile first"
        )
    report = output.load_report(report_path)
    return report, PteInterpreter(check_pte(pte_path, report), str(pte_path))


def host_only_partitions(out: Path, interp: Any) -> list[tuple[str, bytes]]:
    """(partition name, LiteRT flatbuffer) of each delegate of ``interp``'s method; Neutron
    microcode is refused (``tflm.host_only_partitions``)."""
    from etforge.runtime.firmware import tflm

    return tflm.host_only_partitions(out, interp.program, interp.plan)


def _check_runnable(
    out: Path, runtime: str, report: dict[str, Any], interp: Any, cpu_partitions: bool = False
) -> None:
    if runtime not in RUNTIMES:
        raise EtforgeError(f"unknown runtime {runtime!r} (known: {', '.join(RUNTIMES)})")
    missing = sorted({str(d.id) for d in interp.plan.delegates} - set(DELEGATE_BACKENDS))
    if missing and cpu_partitions:
        host_only_partitions(out, interp)  # refuses microcode
    elif missing:
        raise EtforgeError(
            f"{out}: its NPU partitions ({', '.join(missing)} delegates) have no device runtime in the "
            f"{runtime} image (the Neutron runtime comes with NXP's SDK); --cpu-partitions runs "
            "host-only partitions in TensorFlow Lite Micro on the Cortex-M33 instead (not the NPU)"
        )
    cpu = report.get("cpu") or report.get("options", {}).get("cpu")
    if cpu != RUNTIMES[runtime]:
        raise EtforgeError(f"{out}: compiled for {cpu}, the {runtime} image is a {RUNTIMES[runtime]}")


def seeded_inputs(report: dict[str, Any], seed: int, count: int) -> list[tuple[torch.Tensor, ...]]:
    """The inputs ``etforge verify`` draws for ``seed`` (same generator, same order)."""
    g = torch.Generator().manual_seed(seed)
    return [
        tuple(torch.randn(s["shape"], generator=g).to(getattr(torch, s["dtype"])) for s in report["inputs"])
        for _ in range(count)
    ]


def load_inputs(path: Path, report: dict[str, Any]) -> list[tuple[torch.Tensor, ...]]:
    """Inputs from a ``.npz``: one array per program input, in order, each of the input's shape
    (one sample) or with a leading sample dimension."""
    try:
        data = np.load(path)
        arrays = [data[k] for k in data.files]
    except Exception as e:  # noqa: BLE001 - any unreadable file is the same user error
        raise EtforgeError(f"{path}: not a readable .npz ({e})") from e
    specs = report["inputs"]
    if len(arrays) != len(specs):
        raise EtforgeError(f"{path}: {len(arrays)} arrays, the program takes {len(specs)} inputs")
    stacked = []
    for i, (a, s) in enumerate(zip(arrays, specs, strict=True)):
        shape = list(s["shape"])
        if list(a.shape) == shape:
            a = a[None]
        if list(a.shape[1:]) != shape:
            raise EtforgeError(f"{path}: array {i} has shape {list(a.shape)}, input {i} is {shape}")
        stacked.append(torch.from_numpy(np.asarray(a, order="C")).to(getattr(torch, s["dtype"])))
    counts = {t.shape[0] for t in stacked}
    if len(counts) != 1:
        raise EtforgeError(f"{path}: the arrays hold different numbers of samples ({sorted(counts)})")
    return [tuple(t[k] for t in stacked) for k in range(counts.pop())]


def _dim_order(interp: Any, value: int) -> list[int]:
    return [int(d) for d in interp.plan.values[value].val.dim_order]


def _device_bytes(t: torch.Tensor, order: list[int]) -> bytes:
    """``t``'s bytes as the program lays it out (its dim order)."""
    return t.permute(tuple(order)).contiguous().numpy().tobytes()


def _from_device(data: bytes, spec: Any, order: list[int]) -> torch.Tensor:
    stored = torch.from_numpy(
        np.frombuffer(data, dtype=torch.empty(0, dtype=spec.dtype).numpy().dtype).copy()
    )
    stored = stored.reshape([spec.sizes[d] for d in order])
    inverse = sorted(range(len(order)), key=order.__getitem__)
    return stored.permute(tuple(inverse))


def _tensor_values(interp: Any, which: list[int], kind: str, out: Path) -> list[int]:
    values = [int(v) for v in which]
    odd = [v for v in values if v not in interp.specs]
    if odd:
        raise EtforgeError(f"{out}: {kind} values {odd} are not tensors; the runner handles tensor I/O only")
    return values


def run(
    out: Path,
    runtime: str = "qemu-m33",
    samples: int = 4,
    inputs: Path | None = None,
    seed: int = 0,
    executorch_src: str | Path | None = None,
    cmsis_nn_src: str | Path | None = None,
    arena_shrink: int = 0,
    cpu_partitions: bool = False,
) -> DeviceRun:
    """Build (or reuse) ``out``'s image and run its program on the inputs; with
    ``cpu_partitions`` the program's host-only NPU partitions run in TFLite Micro on the CPU."""
    report, interp = _load(out)
    _check_runnable(out, runtime, report, interp, cpu_partitions)
    batches = load_inputs(inputs, report) if inputs is not None else seeded_inputs(report, seed, samples)
    return run_program(
        out, interp, batches, runtime, executorch_src, cmsis_nn_src, arena_shrink, cpu_partitions
    )


def run_program(
    out: Path,
    interp: Any,
    batches: list[tuple[torch.Tensor, ...]],
    runtime: str = "qemu-m33",
    executorch_src: str | Path | None = None,
    cmsis_nn_src: str | Path | None = None,
    arena_shrink: int = 0,
    cpu_partitions: bool = False,
) -> DeviceRun:
    """Run ``out/model.pte`` (loaded as ``interp``, registration in ``out/codegen``) on the
    device for each input batch; no report needed (the conformance suite's programs)."""
    in_values = _tensor_values(interp, interp.plan.inputs, "input", out)
    out_values = _tensor_values(interp, interp.plan.outputs, "output", out)
    partitions = host_only_partitions(out, interp) if cpu_partitions and interp.plan.delegates else None
    image = build_image(out, executorch_src, cmsis_nn_src, arena_shrink, partitions=partitions)
    work = Path(tempfile.mkdtemp(prefix="etforge-qemu-"))
    try:
        shutil.copyfile(out / output.PTE, work / "model.pte")
        for s, batch in enumerate(batches):
            if len(batch) != len(in_values):
                raise EtforgeError(f"{out}: the program takes {len(in_values)} inputs, got {len(batch)}")
            for j, (t, v) in enumerate(zip(batch, in_values, strict=True)):
                (work / f"s{s}_in{j}.bin").write_bytes(_device_bytes(t, _dim_order(interp, v)))
        result = run_qemu(image.elf, work, len(batches), describe=lambda i: _describe(interp, i))
        outputs = [
            [
                _from_device((work / f"s{s}_out{j}.bin").read_bytes(), interp.specs[v], _dim_order(interp, v))
                for j, v in enumerate(out_values)
            ]
            for s in range(len(batches))
        ]  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)
    per_op, note = _per_op(interp, result)
    return DeviceRun(runtime, image, result, batches, outputs, per_op, note)


def _describe(interp: Any, index: int) -> str:
    """Instruction ``index`` of the plan and what it runs."""
    instructions = interp.plan.chains[0].instructions
    if not 0 <= index < len(instructions):
        return f"instruction {index}"
    return f"instruction {index} ({_op_name(interp, instructions[index].instr_args)})"


def _op_name(interp: Any, args: Any) -> str:
    if type(args).__name__ == "KernelCall":
        o = interp.plan.operators[args.op_index]
        return f"{o.name}.{o.overload}" if o.overload else o.name
    if type(args).__name__ == "DelegateCall":
        return f"delegate {interp.plan.delegates[args.delegate_index].id}"
    return type(args).__name__


def _per_op(interp: Any, q: QemuRun) -> tuple[list[dict[str, Any]], str]:
    """The tracer's events, one per executed instruction, matched to the plan's instructions
    (a plan without jumps runs each once, in order); a mismatch is reported, never guessed."""
    instructions = interp.plan.chains[0].instructions
    kinds = [type(i.instr_args).__name__ for i in instructions]
    events = [(name, ticks) for name, ticks in q.events if name.endswith("_CALL")]
    if "JumpFalseCall" in kinds:
        return [], "per-op counts not attributed: the plan has jumps"
    if [n for n, _ in events] != [_EVENT_OF.get(k, "?") for k in kinds]:
        return [], f"per-op counts not attributed: {len(events)} traced events for {len(kinds)} instructions"
    rows = []
    for index, (ins, (_, ticks)) in enumerate(zip(instructions, events, strict=True)):
        op = _op_name(interp, ins.instr_args)
        row = {"instruction": index, "op": op, "instructions": ticks * q.instructions_per_tick}
        if type(ins.instr_args).__name__ == "DelegateCall":  # named by the delegate it calls
            row["partition"] = _partition(interp, ins.instr_args.delegate_index)
        rows.append(row)
    return rows, ""


def _partition(interp: Any, delegate_index: int) -> str | None:
    """The partition of the plan's delegate ``delegate_index`` (its payload's or compile spec's
    name): delegate calls run in program order, not in report.json's tag order."""
    from etforge.codegen.program_facts import delegate_partition

    return delegate_partition(interp.program, interp.plan.delegates[delegate_index])


def _first_difference(host: torch.Tensor, device: torch.Tensor) -> str:
    h, d = host.contiguous().flatten(), device.contiguous().flatten()
    if h.shape != d.shape or h.dtype != d.dtype:
        return f"{d.dtype}{list(device.shape)} on the device, {h.dtype}{list(host.shape)} on the host"
    k = int(
        torch.nonzero(h.view(torch.uint8) != d.view(torch.uint8) if h.element_size() == 1 else h != d)[0, 0]
    )
    count = int((h != d).sum())
    return (
        f"flat index {k}: device {d[k].item()} vs host {h[k].item()} ({count} of {h.numel()} values differ)"
    )


def verify(
    out: Path,
    runtime: str = "qemu-m33",
    samples: int = 4,
    seed: int = 0,
    executorch_src: str | Path | None = None,
    cmsis_nn_src: str | Path | None = None,
    arena_shrink: int = 0,
    inputs: Path | None = None,
    cpu_partitions: bool = False,
) -> DeviceVerification:
    """Run ``out`` on the device runtime and require its outputs to equal the host
    interpreter's bit for bit, and its planned memory to be the report's arena. Partitions run
    in TFLM with CMSIS-NN (``cpu_partitions``) compute LiteRT's *reference* kernels'
    arithmetic but for FULLY_CONNECTED's requantization, so the host runs those kernels on a
    rewrite computing TFLM's FC (``runtime.arithmetic.tflm_arith``, kernels ``"tflm"``)."""
    dev = run(out, runtime, samples, inputs, seed, executorch_src, cmsis_nn_src, arena_shrink, cpu_partitions)
    report, interp = _load(out)
    out_values = [int(v) for v in interp.plan.outputs]
    identical, first = 0, None
    kernels = "tflm" if cpu_partitions else "default"
    for s, (batch, device_outs) in enumerate(zip(dev.inputs, dev.outputs, strict=True)):
        host_outs = interp.run(list(batch), kernels=kernels)
        same = True
        for j, (h, d, v) in enumerate(zip(host_outs, device_outs, out_values, strict=True)):
            order = _dim_order(interp, v)
            if _device_bytes(h, order) != _device_bytes(d, order):
                same = False
                if first is None:
                    first = f"sample {s}, output {j}: {_first_difference(h, d)}"
        identical += same
    failures = []
    if first is not None:
        failures.append(
            f"{out / output.PTE} on {runtime} differs from the host interpreter on "
            f"{len(dev.inputs) - identical}/{len(dev.inputs)} samples; first: {first}"
        )
    report_arena = [int(b) for b in report.get("memory", {}).get("arena_bytes", [])]
    if dev.qemu.planned != report_arena:
        failures.append(
            f"ExecuTorch planned {dev.qemu.planned} bytes per memory id on {runtime}, "
            f"report.json's arena is {report_arena}"
        )
    return DeviceVerification(
        runtime, len(dev.inputs), identical, first, dev.qemu.planned, report_arena,
        dev.qemu.instructions, per_op=dev.per_op, image=str(dev.image.elf), build_seconds=dev.image.seconds,
        built=dev.image.built, failures=failures, tflm_arenas=dev.qemu.tflm_arenas,
        instructions_per_tick=dev.qemu.instructions_per_tick,
        method_allocator_bytes=dev.qemu.method_allocator_bytes,
    )  # fmt: skip
