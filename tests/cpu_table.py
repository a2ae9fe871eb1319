"""CPU seconds per test file, printed at the end of the session (issue 47's suite goal).

pytest's ``--durations`` are wall seconds: on CI's two cores shared by three workers they
measure the neighbours as much as the test, and a test that waits (a niced Ray worker) looks
as costly as one that computes. What bounds the suite's wall time there is its CPU, so each
phase of each test is charged what its worker spent (every thread, ``RUSAGE_SELF``) and what
the children it waited for spent (CLI subprocesses, firmware builds, QEMU:
``RUSAGE_CHILDREN``). A module fixture is charged to its file's first test; a process a test
leaves running unwaited (a daemon) is not counted anywhere.
"""

from __future__ import annotations

import resource
from collections import defaultdict
from collections.abc import Iterator

import pytest

KEY = "cpu_seconds"
#: Files shown in the table; the total covers every file.
SHOWN = 15


def _cpu() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _charged(item: pytest.Item) -> Iterator[None]:
    start = _cpu()
    yield
    item.user_properties.append((KEY, _cpu() - start))  # read from the phase's report


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
        self.seen: set[tuple[str, str]] = set()

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # a report carries the item's properties so far: take only the newest phase's
        values = [v for k, v in report.user_properties if k == KEY]
        if values and (report.nodeid, report.when) not in self.seen:
            self.seen.add((report.nodeid, report.when))
            self.files[report.nodeid.split("::")[0]] += values[-1]

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.files:
            return
        total = sum(self.files.values())
        terminalreporter.write_sep(
            "=", f"CPU seconds per test file (workers + waited children): {total:.0f} in all"
        )
        for name, seconds in sorted(self.files.items(), key=lambda kv: -kv[1])[:SHOWN]:
            terminalreporter.write_line(f"{seconds:8.1f}  {100 * seconds / total:4.1f}%  {name}")


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist) prints it
        config.pluginmanager.register(Table(), "etforge-cpu-table")
