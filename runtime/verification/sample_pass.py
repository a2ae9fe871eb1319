"""``verify``'s device simulation over a chunk of samples: one batched pass, checked once.

``verify`` runs the compiled program sample by sample (LiteRT and the host interpreter take
one input at a time), then simulates the quantized program in the device's arithmetic
(``runtime.verification.simulate``) for a chunk of samples at once
(``runtime.verification.simulate_batched``), whose values are each sample's own by construction.
The first chunk's first sample is also simulated alone and the two compared, every output,
every recorded value: a difference (a torch kernel whose value depends on the batch size in a
way the construction missed) turns the batched pass off for the rest of the run and is told
(``BatchState.note``); the per-sample simulation is then used, as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from etforge.runtime.verification.constant_nodes import ConstantNodes
from etforge.runtime.verification.simulate import Simulation, simulate
from etforge.runtime.verification.simulate_batched import Seen, sample_bytes, simulate_batched

#: Bytes of one chunk's simulated values (each kept until its last reader, a rule reading
#: back included): the chunk holds as many samples as fit, at most ``MAX_CHUNK``. 16 samples
#: halve the walk's per-node cost against 8; 32 fault in more fresh memory than that saves
#: (MobileNetV2-96, 32 samples, with the fused convolution rules: user + system CPU 0.80 s in
#: chunks of 8, 0.72 s of 16, 0.84 s of 32).
CHUNK_BYTES = 256 << 20
MAX_CHUNK = 16


@dataclass
class BatchState:
    """How the simulation ran: batched passes, node runs that went per sample, and why the
    batched pass was turned off (empty: it was not)."""

    passes: int = 0
    samples: int = 0
    per_sample: dict[str, int] = field(default_factory=dict)
    note: str = ""
    checked: bool = False


def chunk_size(module: torch.fx.GraphModule) -> int:
    """Samples per batched pass: ``CHUNK_BYTES`` over what one sample adds (``sample_bytes``,
    from the graph's metadata)."""
    return max(1, min(MAX_CHUNK, CHUNK_BYTES // max(sample_bytes(module.graph), 1)))


def simulations(
    module: torch.fx.GraphModule,
    batches: Sequence[tuple[torch.Tensor, ...]],
    kinds: Sequence[dict[str, tuple[str, str]]],
    program_values: Sequence[dict[str, torch.Tensor]],
    constants: ConstantNodes | None,
    state: BatchState,
) -> list[tuple[Simulation, Seen]]:
    """Each sample's simulation and its records (``simulate``'s ``seen``)."""
    if not state.note and all(k == kinds[0] for k in kinds):
        seen: list[Seen] = [{} for _ in batches]
        batched = simulate_batched(module, batches, kinds[0], program_values, seen, constants)
        if not state.checked:
            state.checked = True
            alone: Seen = {}
            one = simulate(module, batches[0], kinds[0], program_values[0], alone, constants)
            differs = difference(one, alone, batched.samples[0], seen[0])
            if differs:
                state.note = (
                    f"the device simulation ran one sample at a time: its batched pass differed from the "
                    f"per-sample one on sample 1 ({differs})"
                )
        if not state.note:
            state.passes += 1
            state.samples += len(batches)
            for name, count in batched.per_sample.items():
                state.per_sample[name] = state.per_sample.get(name, 0) + count
            return list(zip(batched.samples, seen, strict=True))
    out = []
    for batch, k, values in zip(batches, kinds, program_values, strict=True):
        record: Seen = {}
        out.append((simulate(module, batch, k, values, record, constants), record))
    return out


def _same(a: Any, b: Any) -> bool:
    """Equal structure (pytree: tuples, lists, dicts by key) and equal leaves: tensors of one
    dtype and shape, bit for bit; anything else by ``==``."""
    leaves, spec = torch.utils._pytree.tree_flatten(a)
    other_leaves, other_spec = torch.utils._pytree.tree_flatten(b)
    if spec != other_spec:
        return False
    for x, y in zip(leaves, other_leaves, strict=True):
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            if not (
                isinstance(x, torch.Tensor)
                and isinstance(y, torch.Tensor)
                and x.dtype == y.dtype
                and x.shape == y.shape
                and torch.equal(x, y)
            ):
                return False
        elif not (x is None and y is None or type(x) is type(y) and bool(x == y)):
            return False
    return True


def difference(one: Simulation, one_seen: Seen, other: Simulation, other_seen: Seen) -> str:
    """Where two simulations of one sample differ ("" when they do not): outputs, the nodes
    without a rule and those left to torch, every recorded value."""
    if not _same(one.outputs, other.outputs):
        return "an output"
    if not _same(one.raw, other.raw):  # structure and leaves (``_same`` flattens both)
        return "the returned structure"
    if one.not_exact != other.not_exact or one.unforced != other.unforced:
        return "the values without a device-exact rule"
    if one_seen.keys() != other_seen.keys():
        return "the recorded nodes"
    for name, record in one_seen.items():
        if not _same(record, other_seen[name]):
            return f"node {name}"
    return ""
