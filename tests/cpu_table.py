"""CPU seconds per test file, printed at the end of the session (issue 47's suite goal).

pytest's ``--durations`` are wall seconds: on CI's two cores shared by three workers they
measure the neighbours as much as the test, and a test that waits (a niced Ray worker) looks
as costly as one that computes. What bounds the suite's wall time there is its CPU, so each
phase of each test is charged what its worker spent (every thread, ``RUSAGE_SELF``) and what
the children it waited for spent (CLI subprocesses, firmware builds, QEMU:
``RUSAGE_CHILDREN``). A module fixture is charged to its file's first test; a process a test
leaves running unwaited (a daemon) is not counted anywhere. Beside each file's CPU: the
processes its tests started themselves (subprocess, multiprocessing, a fork; not their own
children, e.g. a build's compilers): each CLI child imports torch and ExecuTorch, 3-5 CPU s.
Every file above :data:`MIN_SHOWN` is printed; the whole table is written to pytest's cache
(``.pytest_cache/d/etforge-cpu-table/files.tsv``: CPU s, processes, file; ``tests.tsv``:
the same per test) to compare runs.
"""

from __future__ import annotations

import _posixsubprocess
import functools
import os
import resource
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import pytest

KEY = "cpu_seconds"
STARTED = "processes_started"
#: Files printed: each costing at least this many CPU seconds (the total and the file in
#: pytest's cache cover every file).
MIN_SHOWN = 5.0
#: Processes this one started so far (:func:`_count_starts`).
_started = [0]


def _counted(start: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(start)
    def counted(*args: Any, **kwargs: Any) -> Any:
        _started[0] += 1
        return start(*args, **kwargs)

    return counted


def _count_starts() -> None:
    """Count every process this one starts: subprocess's two ways (its own binding of
    ``fork_exec``, ``os.posix_spawn``), multiprocessing's spawn (``_posixsubprocess.fork_exec``)
    and fork. Each wrapper replaces the name its caller looks up when it calls, so it sees every
    start; the started process runs unchanged."""
    import subprocess

    if hasattr(subprocess, "_fork_exec"):
        subprocess._fork_exec = _counted(subprocess._fork_exec)
    _posixsubprocess.fork_exec = _counted(_posixsubprocess.fork_exec)
    for name in ("posix_spawn", "posix_spawnp", "fork"):
        if hasattr(os, name):
            setattr(os, name, _counted(getattr(os, name)))


def _cpu() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _charged(item: pytest.Item) -> Iterator[None]:
    start, started = _cpu(), _started[0]
    yield
    # read from the phase's report
    item.user_properties += [(KEY, _cpu() - start), (STARTED, _started[0] - started)]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    yield from _charged(item)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    yield from _charged(item)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    yield from _charged(item)


class Table:
    """Collects the phases' CPU from every report (a worker's arrive through xdist)."""

    def __init__(self) -> None:
        self.files: dict[str, float] = defaultdict(float)
        self.started: dict[str, int] = defaultdict(int)
        self.tests: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
        self.seen: set[tuple[str, str]] = set()

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # a report carries the item's properties so far: take only the newest phase's
        values = [v for k, v in report.user_properties if k == KEY]
        if values and (report.nodeid, report.when) not in self.seen:
            self.seen.add((report.nodeid, report.when))
            name, started = (
                report.nodeid.split("::")[0],
                [v for k, v in report.user_properties if k == STARTED][-1],
            )
            self.files[name] += values[-1]
            self.started[name] += started
            self.tests[report.nodeid][0] += values[-1]
            self.tests[report.nodeid][1] += started

    def rows(self) -> list[tuple[str, float, int]]:
        """(file, CPU s, processes started), costliest first."""
        return sorted(((n, s, self.started[n]) for n, s in self.files.items()), key=lambda r: (-r[1], r[0]))

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.files:
            return
        rows, total = self.rows(), sum(self.files.values())
        cache = getattr(terminalreporter.config, "cache", None)  # None under -p no:cacheprovider
        where = ""
        if cache is not None:
            path = cache.mkdir("etforge-cpu-table") / "files.tsv"
            path.write_text("".join(f"{s:.2f}\t{n}\t{f}\n" for f, s, n in rows))
            tests = sorted(self.tests.items(), key=lambda kv: -kv[1][0])
            (path.parent / "tests.tsv").write_text("".join(f"{s:.2f}\t{n}\t{t}\n" for t, (s, n) in tests))
            where = f"; every file: {path}"
        terminalreporter.write_sep(
            "=", f"CPU seconds per test file (workers + waited children): {total:.0f} in all{where}"
        )
        terminalreporter.write_line(
            f"{'CPU s':>8}  {'share':>5}  {'procs':>5}  file (>= {MIN_SHOWN:.0f} CPU s)"
        )
        for name, seconds, started in rows:
            if seconds >= MIN_SHOWN:
                terminalreporter.write_line(
                    f"{seconds:8.1f}  {100 * seconds / total:4.1f}%  {started:5d}  {name}"
                )


def pytest_configure(config: pytest.Config) -> None:
    _count_starts()  # in every process that runs tests
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist) prints it
        config.pluginmanager.register(Table(), "etforge-cpu-table")
