"""CPU seconds per test file, printed at the end of the session (issue 47's suite goal).

pytest's ``--durations`` are wall seconds: on CI's two cores shared by three workers they
measure the neighbours as much as the test, and a test that waits (a niced Ray worker) looks
as costly as one that computes. What bounds the suite's wall time there is its CPU, so each
phase of each test is charged what its worker spent (every thread, ``RUSAGE_SELF``) and what
the children it waited for spent (CLI subprocesses, firmware builds, QEMU:
``RUSAGE_CHILDREN``). A module fixture is charged to its file's first test; a process a test
leaves running unwaited (a daemon) is not counted anywhere. Beside each file's CPU: the
programs its tests started themselves (subprocess, multiprocessing's spawn; not their own
children, e.g. a build's compilers; each CLI child imports torch and ExecuTorch, 3-5 CPU s)
and the forks (the compile's program writer, a fork-start pool: a copy, no new imports).
Every file above :data:`MIN_SHOWN` is printed; the whole table is written to pytest's cache
(``.pytest_cache/d/etforge-cpu-table/files.tsv``: CPU s, programs, forks, file;
``tests.tsv``: the same per test) to compare runs.
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
STARTED = "programs_started"
FORKED = "forks"
#: Files printed: each costing at least this many CPU seconds (the total and the file in
#: pytest's cache cover every file).
MIN_SHOWN = 5.0
#: Programs this process started and forks it made so far (:func:`_count_starts`).
_started = [0]
_forked = [0]


def _counted(start: Callable[..., Any], counter: list[int]) -> Callable[..., Any]:
    @functools.wraps(start)
    def counted(*args: Any, **kwargs: Any) -> Any:
        counter[0] += 1
        return start(*args, **kwargs)

    return counted


def _count_starts() -> None:
    """Count every process this one starts: subprocess's two ways (its own binding of
    ``fork_exec``, ``os.posix_spawn``), multiprocessing's spawn (``_posixsubprocess.fork_exec``)
    and fork. Each wrapper replaces the name its caller looks up when it calls, so it sees every
    start; the started process runs unchanged."""
    import subprocess

    if hasattr(subprocess, "_fork_exec"):
        subprocess._fork_exec = _counted(subprocess._fork_exec, _started)
    _posixsubprocess.fork_exec = _counted(_posixsubprocess.fork_exec, _started)
    for name in ("posix_spawn", "posix_spawnp"):
        if hasattr(os, name):
            setattr(os, name, _counted(getattr(os, name), _started))
    os.fork = _counted(os.fork, _forked)


def _cpu() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _charged(item: pytest.Item) -> Iterator[None]:
    start, started, forked = _cpu(), _started[0], _forked[0]
    yield
    # read from the phase's report
    item.user_properties += [
        (KEY, _cpu() - start),
        (STARTED, _started[0] - started),
        (FORKED, _forked[0] - forked),
    ]


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
    """Collects the phases' CPU and starts from every report (a worker's arrive through xdist)."""

    def __init__(self) -> None:
        #: file or test id -> [CPU s, programs started, forks]
        self.files: dict[str, list[float]] = defaultdict(lambda: [0.0, 0, 0])
        self.tests: dict[str, list[float]] = defaultdict(lambda: [0.0, 0, 0])
        self.seen: set[tuple[str, str]] = set()

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # a report carries the item's properties so far: take only the newest phase's
        newest = {k: v for k, v in report.user_properties if k in (KEY, STARTED, FORKED)}
        if KEY in newest and (report.nodeid, report.when) not in self.seen:
            self.seen.add((report.nodeid, report.when))
            for row in (self.files[report.nodeid.split("::")[0]], self.tests[report.nodeid]):
                row[0] += newest[KEY]
                row[1] += newest.get(STARTED, 0)
                row[2] += newest.get(FORKED, 0)

    @staticmethod
    def _ordered(rows: dict[str, list[float]]) -> list[tuple[str, list[float]]]:
        """Costliest first (then by name)."""
        return sorted(rows.items(), key=lambda kv: (-kv[1][0], kv[0]))

    def _tsv(self, rows: dict[str, list[float]]) -> str:
        return "".join(f"{s:.2f}\t{n}\t{f}\t{name}\n" for name, (s, n, f) in self._ordered(rows))

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.files:
            return
        total = sum(row[0] for row in self.files.values())
        cache = getattr(terminalreporter.config, "cache", None)  # None under -p no:cacheprovider
        where = ""
        if cache is not None:
            path = cache.mkdir("etforge-cpu-table") / "files.tsv"
            path.write_text(self._tsv(self.files))
            (path.parent / "tests.tsv").write_text(self._tsv(self.tests))
            where = f"; every file: {path}"
        terminalreporter.write_sep(
            "=", f"CPU seconds per test file (workers + waited children): {total:.0f} in all{where}"
        )
        terminalreporter.write_line(
            f"{'CPU s':>8}  {'share':>5}  {'progs':>5}  {'forks':>5}  file (>= {MIN_SHOWN:.0f} CPU s)"
        )
        for name, (seconds, started, forked) in self._ordered(self.files):
            if seconds >= MIN_SHOWN:
                terminalreporter.write_line(
                    f"{seconds:8.1f}  {100 * seconds / total:4.1f}%  {started:5d}  {forked:5d}  {name}"
                )


def pytest_configure(config: pytest.Config) -> None:
    _count_starts()  # in every process that runs tests
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist) prints it
        config.pluginmanager.register(Table(), "etforge-cpu-table")
