"""The per-op exactness gates from the device simulation's one pass, where that pass proves them.

``verify`` holds every int8 value of every op to its reference on the program's own inputs:
NPU ops teacher-forced in the partition (``stepwise.op_parity``), CPU ops in the quantized
program with the host's values forced (``HostInt8Values.compare``). The device simulation
(``runtime.verification.simulate``) computes the same references along the same program, on its own
values. Where every value the program computed equals the simulation's, the simulation's
inputs to each op *are* the program's, so each op's reference on the program's inputs is the
simulation's value at that op: the teacher-forced runs would compute the same numbers again.

So a sample is judged from the simulation when, for every op the first (fully teacher-forced)
sample compared: its value is there in both, the same shape, and — for an op with a rule —
the program's value equals the rule's; for an op without one, within ``FORCE_MAX_STEPS`` of
torch's (the simulation then continued on the program's value, as teacher forcing does); and
for a value the check could not compare (``skipped``), the simulation continued on torch's
value, as teacher forcing does. Any other sample — any value off, anything not matched —
runs the teacher-forced checks in full, which name the op, index and values as before.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from etforge.core.graph import layout
from etforge.core.litert import payload
from etforge.core.litert.builder import read_metadata
from etforge.runtime.execution import litert_run
from etforge.runtime.execution.host import stored_inputs
from etforge.runtime.verification.simulate import FORCE_MAX_STEPS
from etforge.runtime.verification.stepwise import DEVICE_KERNELS, OpParity, _measure

#: A simulation record per quantize node: (its rule's value or None, torch's value).
Seen = dict[str, tuple[torch.Tensor | None, torch.Tensor]]


def litert_values(
    calls: Sequence[tuple[Any, Sequence[torch.Tensor]]], parsed: dict[int, Any] | None = None
) -> dict[str, torch.Tensor]:
    """LiteRT's int8 values of every delegate call (reference kernels, every tensor kept), by
    the partition's node names, in logical order: what ``op_parity`` compares, without its
    teacher-forced run of the partition. ``parsed``: each delegate's payload as unpacked and
    its value map as read, kept by the caller across the samples of one run (the same
    delegates: unpacked and read once, not per sample)."""
    found: dict[str, torch.Tensor] = {}
    parsed = {} if parsed is None else parsed
    for lowered, args in calls:
        known = parsed.get(id(lowered))
        if known is None or known[0] is not lowered:
            blob = payload.unpack_for_host(bytes(lowered.processed_bytes))
            values = {}
            if blob.format.startswith("litert"):
                read = json.loads(read_metadata(blob.data).get("etforge_int8_values", b"{}"))
                values = {name: (index, layout.inverse(perm)) for name, (index, perm) in read.items()}
            known = parsed[id(lowered)] = (lowered, blob, values)
        _, blob, values = known
        if not blob.format.startswith("litert"):
            continue
        inputs = stored_inputs(blob, args)
        it = litert_run.kept(blob.data, DEVICE_KERNELS, inputs)  # the program's own run, when kept
        if it is None:
            it = litert_run.interpreter(blob.data, DEVICE_KERNELS, preserve_all_tensors=True)
            litert_run.set_inputs(it, inputs)
            it.invoke()
        for name, (index, back) in values.items():
            found[name] = torch.from_numpy(np.array(it.get_tensor(index))).permute(back)
    return found


def judged(
    template: Sequence[OpParity], npu: dict[str, torch.Tensor], cpu: dict[str, torch.Tensor], seen: Seen
) -> list[OpParity] | None:
    """This sample's per-op results, one per ``template`` entry (the first sample's, from the
    teacher-forced checks), from the simulation's records and the program's values (``npu``:
    LiteRT's by partition node, ``cpu``: the host's by quantize node); None when the
    simulation does not prove them (then the teacher-forced checks run)."""
    out: list[OpParity] = []
    for t in template:
        record = seen.get(t.qnode)
        if not t.qnode or record is None:
            return None
        rule, torch_value = record
        if t.skipped:  # teacher forcing continued on torch's value here: so must the simulation have
            if rule is not None and not torch.equal(rule, torch_value):
                return None
            out.append(t)  # the same count of the same node (static shapes)
            continue
        ours = (cpu if t.partition == "cpu" else npu).get(t.qnode)
        if ours is None or tuple(ours.shape) != tuple(torch_value.shape):
            return None
        if t.device_exact and (rule is None or not torch.equal(ours, rule.reshape(ours.shape))):
            return None  # a value off its reference: the full check names it
        vs_torch = _vs_torch(ours, torch_value)
        if t.device_exact:
            out.append(  # ``_measure`` of equal values: none off
                OpParity(
                    t.partition, t.node, 0, 0, ours.numel(), device_exact=True, reason=t.reason, qnode=t.qnode,
                    **vs_torch,
                )
            )  # fmt: skip
            continue
        if rule is not None or vs_torch["torch_max_steps"] > FORCE_MAX_STEPS:
            return None
        out.append(
            _measure(
                t.partition, t.node, ours, torch_value, device_exact=t.device_exact, reason=t.reason, qnode=t.qnode,
                **vs_torch,
            )
        )  # fmt: skip
    return out


def _vs_torch(ours: torch.Tensor, torch_value: torch.Tensor) -> dict[str, int]:
    """The largest distance of ``ours`` from torch's value and how many values differ, as
    ``op_parity`` measures them: int8 codes differ by at most 255, so int16 holds every
    difference (one buffer, in place)."""
    if ours.dtype not in (torch.int8, torch.uint8) or torch_value.dtype not in (torch.int8, torch.uint8):
        off = (ours.to(torch.int32) - torch_value.to(torch.int32)).abs()
    else:
        off = ours.to(torch.int16)
        off.sub_(torch_value).abs_()
    if not off.numel():
        return {"torch_max_steps": 0, "torch_values_off": 0}
    return {"torch_max_steps": int(off.max()), "torch_values_off": int(torch.count_nonzero(off))}
