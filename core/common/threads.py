"""Thread counts: the numeric work whose rounding reaches the output bytes, and the work that
shares the machine's cores with other processes."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

#: Threads of LiteRT's interpreter (its XNNPACK thread pool). The host runs batch-1 partitions
#: whose ops are too small to split, and pthreadpool's workers spin-wait between ops: beside
#: another busy process on a 2-core machine they burn the core that process needs.
LITERT_THREADS = 1


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Run the block on one intra-op thread: the output bytes must not depend on the machine.

    A float reduction (a matmul, BatchNorm's batch statistics, an observer's min/max over a
    calibration batch) is split across threads, and the split — so the rounding — follows the
    thread count: ``OMP_NUM_THREADS=1`` (a Ray worker) and the default gave different weights
    and scales, hence different ``.pte`` bytes. Loading (a factory that calibrates its
    BatchNorm) and calibration run here; the lowering after it is exact integer work.

    ``verify`` runs here too, for another reason: its work is thousands of batch-1 ops, each
    too small to split, and torch's OpenMP workers spin-wait for work between them. With
    another busy process on the same cores, the spinning thread holds a core the process
    needs and each op waits for it (the issue-47 measurement: past 4 CPU-minutes without
    finishing, against 32 s on one thread under the same load)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
