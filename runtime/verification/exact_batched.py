"""The quantized reference's exact (float64) value on every sample, a few samples per pass.

``runtime.verification.reference`` evaluates the PT2E program in float64 through an fx interpreter: per
sample, Python walks every node (MobileNetV2: ~560) to compute a network of small tensors, so
the walk costs more than the arithmetic. Under ``torch.vmap`` one walk computes ``CHUNK``
samples (``MAX_CHUNK`` where they fit), each exactly as alone (every op maps each sample on its
own; float64 keeps the value exact to ~1e-16 either way). A program vmap cannot run (an op without a batching
rule that fails, a data-dependent shape, an output that is not a tensor) is evaluated one
sample at a time, as before: same values, slower.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.export import ExportedProgram

from etforge.runtime.verification.outputs import exact_leaves, flatten

#: Samples per vmapped pass: the activations of that many samples live at once, in float64.
CHUNK = 8
#: Up to this many where their float64 values fit in ``CHUNK_BYTES`` (:func:`chunk_of`): one walk
#: of MobileNetV2-96's ~560 nodes for 16 samples instead of two for 8 (0.35-0.45 -> 0.30-0.34
#: CPU s for 32 samples, the same values; MobileNetV2-96 counts 24 MB a sample, its process
#: peaks 50-85 MB higher).
MAX_CHUNK, CHUNK_BYTES = 16, 512 << 20


def chunk_of(module: torch.fx.GraphModule) -> int:
    """Samples per pass: ``MAX_CHUNK`` where that many samples' float64 values alive at once
    (every value counted as float64, at the graph's worst point) fit in ``CHUNK_BYTES``, else
    ``CHUNK``."""
    from etforge.runtime.verification.simulate_batched import last_readers

    last = last_readers(module.graph)
    alive, peak, ends = 0, 0, {}
    for i, n in enumerate(module.graph.nodes):
        v = n.meta.get("val")
        size = v.numel() * 8 if isinstance(v, torch.Tensor) else 0
        alive += size
        ends[last.get(n, i)] = ends.get(last.get(n, i), 0) + size
        peak = max(peak, alive)
        alive -= ends.pop(i, 0)
    return MAX_CHUNK if MAX_CHUNK * peak <= CHUNK_BYTES else CHUNK


def exact_leaves_all(
    program: ExportedProgram,
    module: torch.fx.GraphModule,
    batches: Sequence[tuple[Any, ...]],
    constants: Any = None,
    sums: Any = None,
) -> list[list[Any]]:
    """Per sample, ``runtime.verification.outputs.exact_leaves`` of it; ``sums``: an
    ``exact_sums.Sums`` told which convs / linears were summed as integers."""
    out: list[list[Any]] = []
    size = chunk_of(module) if len(batches) > CHUNK else CHUNK
    for start in range(0, len(batches), size):
        chunk = list(batches[start : start + size])
        try:
            out.extend(_vmapped(program, module, chunk, constants, sums))
        except Exception:  # noqa: BLE001 - vmap's limits: the same values one sample at a time
            out.extend(exact_leaves(program, module, batch, constants, sums) for batch in chunk)
    return out


def _vmapped(
    program: ExportedProgram,
    module: torch.fx.GraphModule,
    chunk: list[tuple[Any, ...]],
    constants: Any,
    sums: Any = None,
) -> list[list[Any]]:
    from etforge.runtime.verification.reference import Float64

    if not all(isinstance(x, torch.Tensor) for batch in chunk for x in batch):
        raise TypeError("a non-tensor input")
    stacked = [torch.stack([batch[i] for batch in chunk]) for i in range(len(chunk[0]))]

    def run(*xs: torch.Tensor) -> Any:
        return Float64(module, constants, sums).run(*xs)

    # An op without a batching rule loops inside vmap (the same values); its warning is one the
    # CLI and the API scope filter (quiet.VMAP_FALLBACK). No catch_warnings: this runs on a
    # thread beside the sample loop, and catch_warnings restores the process's filters on exit.
    with torch.no_grad():
        value = torch.vmap(run)(*stacked)
    leaves = flatten(program, value)
    return [
        [
            v[k].float() if v.is_floating_point() else v[k]
            for v in leaves  # every leaf is a tensor here: vmap returns nothing else
        ]
        for k in range(len(chunk))
    ]
