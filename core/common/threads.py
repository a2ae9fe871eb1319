"""The thread count of the numeric work whose rounding reaches the output bytes."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Run the block on one intra-op thread: the output bytes must not depend on the machine.

    A float reduction (a matmul, BatchNorm's batch statistics, an observer's min/max over a
    calibration batch) is split across threads, and the split — so the rounding — follows the
    thread count: ``OMP_NUM_THREADS=1`` (a Ray worker) and the default gave different weights
    and scales, hence different ``.pte`` bytes. Loading (a factory that calibrates its
    BatchNorm) and calibration run here; the lowering after it is exact integer work."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
