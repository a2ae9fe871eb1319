"""Shared fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest_plugins = ["cpu_table"]  # tests/cpu_table.py: CPU seconds per file at the end

# Every compile in the suite builds afresh (tests swap plugins, SDK doubles and fault hooks
# under one version); the build-cache tests turn the cache on explicitly.
os.environ.setdefault("ETFORGE_NO_CACHE", "1")
# The firmware sources the product takes from the user: the tests use CI's pinned snapshots
# (tests/support.THIRD_PARTY, $ETFORGE_THIRD_PARTY) unless the variables are already set.
from support import THIRD_PARTY as _THIRD_PARTY  # noqa: E402

if (_THIRD_PARTY / "executorch").is_dir():
    os.environ.setdefault("ETFORGE_EXECUTORCH_SRC", str(_THIRD_PARTY / "executorch"))
    os.environ.setdefault("ETFORGE_CMSIS_NN_SRC", str(_THIRD_PARTY / "cmsis-nn"))
if (_THIRD_PARTY / "tflite-micro").is_dir():
    os.environ.setdefault("ETFORGE_TFLM_SRC", str(_THIRD_PARTY / "tflite-micro"))
    os.environ.setdefault("ETFORGE_TFLM_DEPS", str(_THIRD_PARTY / "tflm-deps"))
# CI runs three workers (-n 3) on two cores: one numeric thread each, here and in every CLI
# subprocess, so no OpenMP pool spin-waits for a core another worker holds (issue 47).
# A test of the thread count's effect sets it itself (test_determinism).
os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_configure(config: pytest.Config) -> None:
    """Firmware builds go to pytest's cache directory: entries are named by content hash, so one
    cold build serves every later run (and every worker) until the sources or the recipe change."""
    cache = getattr(config, "cache", None)  # None under -p no:cacheprovider
    if cache is not None:
        os.environ.setdefault("ETFORGE_FIRMWARE_CACHE", str(cache.mkdir("etforge-firmware")))
        from compiler_cache import use_ccache  # tests/compiler_cache.py

        use_ccache(Path(cache.mkdir("ccache")), base=Path(cache.mkdir("etforge-firmware")).parent)


def pytest_collection_finish(session: pytest.Session) -> None:
    """The test process's collector as the ``etforge`` command sets its own
    (core/common/process_memory.py): young collections rarer, and the imported modules' objects
    (torch, ExecuTorch, every test module: collection is done) frozen out of every full
    collection. The pipeline runs in this process (``cli_in_process``, fixtures), so its
    collector costs are the command's; until the first in-process command they were the
    default's (issue 47: tests/test_early.py 24.0 -> 19.9 CPU s)."""
    from etforge.core.common import process_memory

    process_memory.tune_collector()
    process_memory.settle()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """How this session's firmware builds compiled (also under ``-q``, CI's mode)."""
    from compiler_cache import describe  # tests/compiler_cache.py

    terminalreporter.write_line(describe())


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    """Accept pyproject's ``-n 3 --dist loadfile`` when pytest-xdist is off (``-p no:xdist``)."""
    if pluginmanager.hasplugin("xdist"):
        return
    group = parser.getgroup("xdist", "pytest-xdist is not loaded: -n and --dist are ignored")
    # "-n" is a lowercase short option, which pytest reserves for itself and xdist.
    group._addoption("-n", "--numprocesses", dest="numprocesses", default=None, help="ignored")
    group.addoption("--dist", dest="dist", default="no", help="ignored")
    group.addoption("--no-loadscope-reorder", dest="loadscopereorder", action="store_false", help="ignored")


#: Files outside the fast tier (``pytest -m "not slow"``, README "Develop"): each compiles and
#: verifies whole models, runs the CLI or pip in subprocesses, or builds firmware — seconds to
#: minutes a test. The default run (CI) includes them. Other files mark their heaviest cases
#: ``slow`` themselves (``pytest.param(..., marks=pytest.mark.slow)``).
SLOW_FILES = frozenset(
    f"test_{name}.py"
    for name in (
        "accuracy", "api", "architectures", "attention", "bad_input", "batch", "boundaries", "cache",
        "cache_trust", "cli_errors", "cli_output", "cli_quiet", "cmake", "codegen", "compile_cli",
        "determinism", "direct_cache", "docs", "early", "errors", "fallbacks", "firmware", "gates",
        "grouped_tconv", "idiom", "inplace", "int_scalar", "kernel_check", "memory", "neutron_differential",
        "neutron_grouped_conv", "neutron_noop_values", "neutron_parity", "neutron_partition_parity",
        "npu_memory", "numeric_hazards", "odd_graphs", "output_integrity", "packaging", "placement", "profiling",
        "program_writer", "pte_interpreter", "pte_interpreter_cortex_m", "pte_interpreter_dim_orders",
        "realworld", "rewrites", "sdk_path", "signatures", "value_creating_ops", "verify_artifact",
        "verify_device", "zoo_graphs",
    )
)  # fmt: skip
#: Files the fast tier had taken in since the list above was drawn (issue 47): QEMU firmware
#: builds and runs, the CMake package, the cache-soundness and batch subprocesses, whole-model
#: verifies -- ten to a hundred seconds a test on CI.
SLOW_FILES |= frozenset(
    f"test_{name}.py"
    for name in (
        "bad_input_48", "c_api", "cache_sound", "cmake_package", "convnext", "cortex_m_int8_forms",
        "device_conformance", "device_profile", "docs_figures", "firmware_tflm", "firmware_torchvision",
        "memory_map", "no_cache", "placement_scale", "recipes", "recurrent",
    )
)  # fmt: skip
#: More of the same kind, from a fast-tier run's durations (issue 47, part 6): QEMU runs and
#: firmware builds (firmware_npu, firmware_build), a module fixture compiling every delegate kind
#: (partition_identity) or a face detector end to end (report_cortex_m) -- 25 to 700 s a file.
SLOW_FILES |= frozenset(
    f"test_{name}.py"
    for name in ("firmware_build", "firmware_npu", "partition_identity", "report_cortex_m", "shared_outputs")
)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Under ``-m "not slow"`` a ``SLOW_FILES`` file is not even imported: every test in it is
    deselected anyway, and importing them (ExecuTorch, hypothesis ...) was most of the fast
    tier's collection time (issue 47)."""
    if (
        collection_path.name in SLOW_FILES
        and " ".join(config.getoption("markexpr", "").split()) == "not slow"
    ):
        return True
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test of a ``SLOW_FILES`` file ``slow`` (a name no file has is an error: a
    renamed file would otherwise join the fast tier unnoticed)."""
    stale = sorted(f for f in SLOW_FILES if not (Path(__file__).parent / f).is_file())
    if stale:
        raise pytest.UsageError(f"tests/conftest.py SLOW_FILES names no file: {', '.join(stale)}")
    for item in items:
        if item.path.name in SLOW_FILES:
            item.add_marker(pytest.mark.slow)
    from file_order import longest_first  # tests/file_order.py: the files that take minutes start first

    longest_first(items)


@pytest.fixture(scope="session", autouse=True)
def _shared_outputs(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The session's directory for outputs several files share (tests/shared_outputs.py): the
    parent of the xdist workers' temporary directories (xdist makes each ``<session>/popen-gwN``),
    else this process's own."""
    import shared_outputs

    base = tmp_path_factory.getbasetemp()
    shared_outputs.ROOT[0] = (
        base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    ) / "shared-outputs"


@pytest.fixture
def plugin_dir(tmp_path: Path) -> Path:
    return tmp_path / "site"
