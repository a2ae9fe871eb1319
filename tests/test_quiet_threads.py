"""Quiet mode with verify's threads: overlapping blocks on two threads leave stderr and the
warning filters as they found them (the race that once let a vmap warning through)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from etforge.core.common import quiet


def _fd2() -> tuple[int, int]:
    st = os.fstat(2)
    return st.st_dev, st.st_ino


def test_overlapping_native_stderr_blocks_restore_stderr(monkeypatch: pytest.MonkeyPatch) -> None:
    """Thread A enters, B enters, A leaves, B leaves: fd 2 is the original again, and
    /dev/null while either block is open (with the save-and-restore of each block, B put
    /dev/null back for good)."""
    monkeypatch.setitem(quiet._STATE, "quiet", True)
    before = _fd2()
    null = os.stat(os.devnull)
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, tuple[int, int]] = {}

    def a() -> None:
        with quiet.native_stderr():
            a_in.set()
            b_in.wait(10)
        a_out.set()

    def b() -> None:
        a_in.wait(10)
        with quiet.native_stderr():
            b_in.set()
            a_out.wait(10)
            seen["inside"] = _fd2()

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert seen["inside"] == (null.st_dev, null.st_ino)
    assert _fd2() == before


def test_the_cli_filters_vmaps_fallback_warning() -> None:
    """verify's batched references run torch.vmap over ops without a batching rule on a
    thread; the quiet filters hold that warning without a catch_warnings around it."""
    code = (
        "import sys, torch\n"
        "from etforge.core.common import quiet\n"
        "if sys.argv[1] == 'quiet': quiet.install()\n"
        "torch.vmap(lambda x: x.clone().clamp_(0, 1))(torch.randn(3, 4))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(quiet.__file__).parents[3])}
    loud = subprocess.run([sys.executable, "-c", code, "loud"], capture_output=True, text=True, env=env)
    calm = subprocess.run([sys.executable, "-c", code, "quiet"], capture_output=True, text=True, env=env)
    assert loud.returncode == calm.returncode == 0, loud.stderr + calm.stderr
    assert quiet.VMAP_FALLBACK in loud.stderr  # torch still warns (else this test proves nothing)
    assert quiet.VMAP_FALLBACK not in calm.stderr, calm.stderr
