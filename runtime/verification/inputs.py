"""The seeded inputs ``verify`` runs, one tensor per input ``report.json`` describes.

Floating-point inputs are standard normal samples. An integer or bool input cannot be drawn
that way (a negative token id fails an ``Embedding``; any id past its vocabulary does too):
it is drawn uniformly from the [min, max] range its example and calibration values spanned
(``inputs[i].range``, recorded by ``compile``), the only range the user's data vouches for.
"""

from __future__ import annotations

from typing import Any

import torch


def seeded_inputs(report: dict[str, Any], seed: int, count: int) -> list[tuple[torch.Tensor, ...]]:
    """``count`` input batches from ``seed``; the same seed gives the same batches."""
    g = torch.Generator().manual_seed(seed)
    channels_last = report["options"].get("dim_order") == "channels_last"
    batches = []
    for _ in range(count):
        batch = []
        for spec in report["inputs"]:
            dtype = getattr(torch, spec["dtype"])
            span = spec.get("range")
            if span is not None and not dtype.is_floating_point:
                lo, hi = int(span[0]), int(span[1])
                t = torch.randint(lo, hi + 1, spec["shape"], generator=g).to(dtype)
            else:  # floating point (and a report written before ranges were recorded)
                t = torch.randn(spec["shape"], generator=g).to(dtype)
            if channels_last and t.dim() == 4:
                t = t.to(memory_format=torch.channels_last)
            batch.append(t)
        batches.append(tuple(batch))
    return batches
