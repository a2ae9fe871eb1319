"""Plugin discovery through entry points, validation, isolation and conflict resolution."""

from __future__ import annotations

import json
from pathlib import Path

from etforge.core.registry.manager import load_plugins

from support import run_cli, write_distribution

BUILTIN_TARGETS = {"imxrt700", "imxrt700cm", "cortex-m33", "litert"}

BROKEN_IMPORT = """
raise ImportError("this plugin needs a package that is not installed")
"""
WRONG_TYPE = """
from etforge import hookimpl

@hookimpl
def etforge_op_converters():
    return ["not a converter"]

@hookimpl
def etforge_targets():
    return "not a list"
"""
OVERRIDE = """
from etforge import hookimpl
from etforge.core.contracts.converter import elementwise

@hookimpl
def etforge_op_converters():
    return [elementwise("aten.relu.default", "RELU", name="FasterRelu", priority=10, targets=("neutron-c",))]
"""
TIE = """
from etforge import hookimpl
from etforge.core.contracts.converter import elementwise

@hookimpl
def etforge_op_converters():
    return [elementwise("aten.abs.default", "ABS", name="OtherAbs")]
"""


def test_builtins_load_through_entry_points() -> None:
    reg = load_plugins(strict=True)
    assert not reg.errors
    assert {p.distribution for p in reg.plugins} >= {"etforge"}
    assert BUILTIN_TARGETS <= set(reg.targets)
    ops = {op for c in reg.converters for op in c.ops}
    assert {"aten.convolution.default", "aten.linear.default", "aten._softmax.default"} <= ops
    # every converter, rule and target is attributed to the entry point that provided it
    assert all(reg.owner(c) != "?" for c in reg.converters)


def test_broken_plugins_are_named_and_others_still_load(plugin_dir: Path) -> None:
    write_distribution(
        plugin_dir, "broken-plugin", "1.2.3", {"broken": "broken_mod"}, {"broken_mod": BROKEN_IMPORT}
    )
    write_distribution(
        plugin_dir, "wrongtype-plugin", "0.0.1", {"wrong": "wrong_mod"}, {"wrong_mod": WRONG_TYPE}
    )
    proc = run_cli("plugins", "--json", pythonpath=plugin_dir)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    by_name = {p["name"]: p for p in data["plugins"]}
    broken = by_name["broken"]
    assert broken["distribution"] == "broken-plugin" and broken["version"] == "1.2.3"
    assert "broken-plugin 1.2.3" in broken["error"] and "'broken'" in broken["error"]
    assert "ImportError" in broken["error"] and "not installed" in broken["error"]
    wrong = by_name["wrong"]
    assert "wrongtype-plugin 0.0.1" in wrong["error"]
    assert "etforge_op_converters" in wrong["error"] and "str" in wrong["error"]
    # the warning is on stderr, one line per broken plugin
    assert proc.stderr.count("warning:") == 2
    # the built-ins are unaffected
    assert by_name["targets_neutron"]["error"] is None
    targets = run_cli("targets", "--json", pythonpath=plugin_dir)
    assert targets.returncode == 0
    assert BUILTIN_TARGETS <= {t["name"] for t in json.loads(targets.stdout)}


def test_strict_makes_a_broken_plugin_fatal(plugin_dir: Path) -> None:
    write_distribution(
        plugin_dir, "broken-plugin", "1.2.3", {"broken": "broken_mod"}, {"broken_mod": BROKEN_IMPORT}
    )
    proc = run_cli("--strict", "plugins", pythonpath=plugin_dir)
    assert proc.returncode == 1
    assert "broken-plugin 1.2.3" in proc.stderr and "Traceback" not in proc.stderr


def test_priority_override_and_tie_are_reported(plugin_dir: Path) -> None:
    write_distribution(plugin_dir, "fast-relu", "2.0", {"fastrelu": "fast_relu"}, {"fast_relu": OVERRIDE})
    write_distribution(plugin_dir, "other-abs", "1.0", {"otherabs": "other_abs"}, {"other_abs": TIE})
    proc = run_cli("plugins", "--json", pythonpath=plugin_dir)
    assert proc.returncode == 0, proc.stderr
    conflicts = {(c["op"], c["target"]): c for c in json.loads(proc.stdout)["conflicts"]}
    relu = conflicts[("aten.relu.default", "imxrt700")]
    assert relu["order"][0][:2] == ["fastrelu", "FasterRelu"]  # higher priority asked first
    assert relu["order"][1][1] == "Relu"
    assert "overrides" in relu["note"]
    tie = conflicts[("aten.abs.default", "litert")]
    assert "equal priority" in tie["note"]
    # OtherAbs names no NPU: the host LiteRT target takes it, the RT700's NPU did not ask for it
    assert ("aten.abs.default", "imxrt700") not in conflicts
    # the support matrix shows the override first and the built-in as fallback
    ops = json.loads(run_cli("ops", "--target", "imxrt700", "--json", pythonpath=plugin_dir).stdout)
    relu_rows = [r for r in ops if r["op"] == "aten.relu.default"]
    assert [(r["name"], r["rank"]) for r in relu_rows] == [("FasterRelu", 0), ("Relu", 1)]


def test_in_process_resolution_prefers_priority(plugin_dir: Path) -> None:
    import sys

    write_distribution(plugin_dir, "fast-relu", "2.0", {"fastrelu": "fast_relu"}, {"fast_relu": OVERRIDE})
    sys.path.insert(0, str(plugin_dir))
    try:
        reg = load_plugins()
        table = reg.converters_for(reg.target("imxrt700"))
        assert [c.name for c in table["aten.relu.default"]] == ["FasterRelu", "Relu"]
    finally:
        sys.path.remove(str(plugin_dir))
        sys.modules.pop("fast_relu", None)
