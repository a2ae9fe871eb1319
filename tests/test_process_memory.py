"""The command's collector and heap handling (core/common/process_memory.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

CHILD = textwrap.dedent(
    """
    import gc
    from etforge.core.common import process_memory

    def rss_mb():
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024

    chunks = [bytearray(100_000) for _ in range(800)]  # 80 MB of heap (below mmap's threshold)
    for c in chunks:
        c[::4096] = b"x" * len(c[::4096])  # touch every page
    pin = bytearray(100_000)  # keeps the heap's top in use, so free() alone cannot shrink it
    del chunks
    before = rss_mb()
    process_memory.release()
    after = rss_mb()
    print(before - after)

    process_memory.tune_collector()
    process_memory.settle()
    print(gc.get_threshold() == process_memory.THRESHOLDS, gc.get_freeze_count() > 0)
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc heap and /proc")
def test_release_returns_freed_heap_and_the_collector_is_tuned() -> None:
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True)
    returned, tuned = out.stdout.splitlines()
    assert float(returned) > 40  # of the 80 MB freed below the heap's top
    assert tuned == "True True"
