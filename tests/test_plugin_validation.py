"""The plugin API checks what it is given, at load, naming the plugin (distribution, entry
point); misbehaviour while compiling names the plugin too, and --strict makes it fatal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from etforge.core.common.errors import EtforgeError, PluginError
from etforge.core.contracts.converter import Constraint, OpConverter, elementwise
from etforge.core.registry.manager import PluginInfo, Registry, load_plugins, registry

from support import run_cli, write_distribution

STRING_OPS = """
from etforge import hookimpl
from etforge.core.contracts.converter import OpConverter

class Sqrt(OpConverter):
    ops = "aten.sqrt.default"
    litert = "SQRT"

@hookimpl
def etforge_op_converters():
    return [Sqrt()]
"""
MISSPELLED = """
from etforge import hookimpl
from etforge.core.contracts.converter import elementwise

@hookimpl
def etforge_op_converters():
    return [elementwise("aten.floor.default", "FLOR", dtypes=("float32",))]
"""
RULE_OVERRIDE = """
from etforge import hookimpl
from etforge.core.contracts.quant_rule import QuantRule

@hookimpl
def etforge_quantizer_rules():
    return [QuantRule(ops=("aten.relu.default",), kind="shared", priority=5)]
"""
UNMATCHED = """
from etforge import hookimpl
from etforge.core.contracts.converter import elementwise
from etforge.core.contracts.quant_rule import QuantRule

@hookimpl
def etforge_op_converters():
    return [elementwise("aten.floor.default", "FLOOR")]

@hookimpl
def etforge_quantizer_rules():
    return [QuantRule(ops=("aten.ceil.default",), kind="shared")]
"""


def _plugins_json(plugin_dir: Path, *flags: str) -> tuple[int, dict, str]:
    proc = run_cli(*flags, "plugins", "--json", pythonpath=plugin_dir)
    return proc.returncode, (json.loads(proc.stdout) if proc.returncode == 0 else {}), proc.stderr


def test_string_ops_is_an_error_naming_the_plugin(plugin_dir: Path) -> None:
    write_distribution(plugin_dir, "sqrt-plugin", "0.3", {"sqrt": "sqrt_mod"}, {"sqrt_mod": STRING_OPS})
    rc, data, _ = _plugins_json(plugin_dir)
    assert rc == 0
    sqrt = next(p for p in data["plugins"] if p["name"] == "sqrt")
    assert sqrt["provides"] == {}  # not split into 17 one-letter "ops"
    assert "sqrt-plugin 0.3" in sqrt["error"] and "'sqrt'" in sqrt["error"]
    assert "ops must be a tuple" in sqrt["error"] and "'aten.sqrt.default'" in sqrt["error"]
    strict = run_cli("--strict", "plugins", pythonpath=plugin_dir)
    assert strict.returncode == 1
    assert "sqrt-plugin 0.3" in strict.stderr and "ops must be a tuple" in strict.stderr
    assert "Traceback" not in strict.stderr


def test_misspelled_litert_builtin_is_rejected_at_load(plugin_dir: Path) -> None:
    write_distribution(plugin_dir, "floor-plugin", "1.0", {"floor": "floor_mod"}, {"floor_mod": MISSPELLED})
    rc, data, _ = _plugins_json(plugin_dir)
    assert rc == 0
    err = next(p for p in data["plugins"] if p["name"] == "floor")["error"]
    assert "floor-plugin 1.0" in err and "'FLOR' is not a LiteRT builtin operator" in err
    assert "FLOOR" in err  # the suggestion
    # the names come from the installed schema: the correct spelling loads
    from ai_edge_litert import schema_py_generated as schema

    from etforge.core.registry.checks import converter_problems, litert_builtins

    assert litert_builtins() == {k for k in vars(schema.BuiltinOperator) if k.isupper()}
    assert converter_problems(elementwise("aten.floor.default", "FLOOR")) == []


def test_quant_rule_override_is_reported_as_a_conflict(plugin_dir: Path) -> None:
    write_distribution(
        plugin_dir, "relu-rule", "2.1", {"relurule": "relu_rule"}, {"relu_rule": RULE_OVERRIDE}
    )
    rc, data, _ = _plugins_json(plugin_dir)
    assert rc == 0
    conflict = next(c for c in data["rule_conflicts"] if c["op"] == "aten.relu.default")
    assert conflict["scheme"] == "int8"
    assert conflict["order"][0] == ["relurule", "shared", 5]
    assert conflict["order"][1][0] == "ops_activation"
    assert "overrides" in conflict["note"]
    # and the composed quantizer uses the override for that op
    import sys

    sys.path.insert(0, str(plugin_dir))
    try:
        from etforge.core.quantize.quantizer import ComposedQuantizer

        reg = load_plugins()
        rules = ComposedQuantizer(reg.rules_for(reg.target("imxrt700"))).rules
        assert (rules["aten.relu.default"].kind, reg.owner(rules["aten.relu.default"])) == (
            "shared",
            "relurule",
        )
    finally:
        sys.path.remove(str(plugin_dir))
        sys.modules.pop("relu_rule", None)


def test_converter_and_rule_op_lists_are_cross_checked(plugin_dir: Path) -> None:
    write_distribution(
        plugin_dir, "unmatched", "0.1", {"unmatched": "unmatched_mod"}, {"unmatched_mod": UNMATCHED}
    )
    proc = run_cli("plugins", pythonpath=plugin_dir)
    assert proc.returncode == 0, proc.stderr
    rc, data, _ = _plugins_json(plugin_dir)
    warnings = [w for w in data["warnings"] if "unmatched 0.1" in w]
    assert any("FloorConverter" in w and "takes int8 but no quantizer rule" in w for w in warnings)
    assert any("aten.ceil.default" in w and "no converter handles" in w for w in warnings)
    assert any("FloorConverter" in w for w in proc.stderr.splitlines() if w.startswith("warning:"))


# -- while compiling ------------------------------------------------------------------------------


class Floor(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.floor(x * 4.0)


class RaisingCheck(OpConverter):
    ops = ("aten.floor.default",)
    litert = "FLOOR"

    def check(self, node: torch.fx.Node, target: object) -> object:
        raise RuntimeError("boom in check")


class RaisingConvert(OpConverter):
    ops = ("aten.floor.default",)
    litert = "FLOOR"

    def convert(self, node: torch.fx.Node, ctx: object) -> None:
        raise ValueError("boom in convert")


def _registry(conv: OpConverter, strict: bool = False) -> Registry:
    info = PluginInfo("floorplug", "floor-dist", "9.9", "tests.floorplug")
    info.provides["converters"] = [conv]
    return Registry([*registry().plugins, info], strict=strict)


def _compile(reg: Registry) -> object:
    from etforge.core.build.session import compile_model

    x = (torch.linspace(-2, 2, 16).reshape(1, 16),)
    return compile_model(Floor(), x, "litert", quantize=False, reg=reg)


def test_raising_check_moves_the_node_off_and_names_the_plugin() -> None:
    from etforge.core.build.report import build_report

    reg = _registry(RaisingCheck())
    result = _compile(reg)
    report = build_report(result, reg, "floor")
    floor = next(n for n in report["nodes"] if n["op"] == "aten.floor.default")
    assert floor["placement"] != "npu"
    assert "RaisingCheck" in floor["reason"] and "plugin 'floorplug' (floor-dist 9.9)" in floor["reason"]
    assert "RuntimeError: boom in check" in floor["reason"]
    # the litert target has an NPU (host LiteRT) without a compiler plugin: say that, not "no NPU"
    status = report["npu_compiler"]["status"]
    assert "no NPU on this target" not in status and "no compiler plugin" in status
    assert report["npu_compiler"]["available"] is False


def test_raising_check_is_fatal_under_strict() -> None:
    with pytest.raises(
        PluginError, match=r"RaisingCheck \(plugin 'floorplug' \(floor-dist 9.9\)\).*boom in check"
    ):
        _compile(_registry(RaisingCheck(), strict=True))
    assert load_plugins(strict=True).strict and not load_plugins().strict


def test_failing_convert_names_converter_and_plugin() -> None:
    with pytest.raises(EtforgeError) as info:
        _compile(_registry(RaisingConvert()))
    msg = str(info.value)
    assert (
        "RaisingConvert (plugin 'floorplug' (floor-dist 9.9))" in msg and "ValueError: boom in convert" in msg
    )
    assert "Traceback" not in msg


def _rank_at_most_2(node: torch.fx.Node, target: object) -> bool | str:
    from etforge.core.graph.utils import shape_of

    rank = len(shape_of(node))
    return rank <= 2 or f"rank {rank}"


class RankLimited(OpConverter):
    ops = ("aten.floor.default",)
    litert = "FLOOR"
    constraints = (Constraint("rank <= 2", _rank_at_most_2),)

    def convert(self, node: torch.fx.Node, ctx: object) -> None:
        x = ctx.input(node.args[0])  # type: ignore[attr-defined]
        ctx.emit("FLOOR", [x], [ctx.output(node, x.perm)])  # type: ignore[attr-defined]


def test_structured_constraints_decide_support() -> None:
    """An advertised Constraint is what the support check applies; ``etforge ops`` shows its text."""
    from etforge.core.build.session import compile_model

    reg = _registry(RankLimited())
    ok = compile_model(Floor(), (torch.randn(2, 8),), "litert", quantize=False, reg=reg)
    assert next(d for d in ok.decisions if d.op == "aten.floor.default").npu
    refused = compile_model(Floor(), (torch.randn(2, 4, 8),), "litert", quantize=False, reg=reg)
    floor = next(d for d in refused.decisions if d.op == "aten.floor.default")
    assert not floor.npu and floor.reason == "rank <= 2: rank 3"
    assert RankLimited().describe()["constraints"] == ["rank <= 2"]
    assert RankLimited().describe()["unchecked_constraints"] == []


def test_partition_names_agree_between_nodes_and_partitions() -> None:
    """Portable fallback with several partitions (the issue's cifarnet repro)."""
    from etforge import zoo
    from etforge.core.build.report import build_report
    from etforge.core.build.session import compile_model

    model, example = zoo.build("cifarnet")
    result = compile_model(
        model,
        example,
        "imxrt700",
        calibration=zoo.calibration("cifarnet", 2),
        options={"operators_not_to_delegate": ("aten.convolution.default",)},
    )
    report = build_report(result, registry(), "zoo:cifarnet")
    names = [p["name"] for p in report["partitions"]]
    assert len(names) > 1
    for part in report["partitions"]:
        for op in part["ops"]:
            for node in op["nodes"]:
                entry = next((n for n in report["nodes"] if n["node"] == node), None)
                if entry is not None:
                    assert entry["partition"] == part["name"], (node, entry["partition"], part["name"])
    placed = {n["partition"] for n in report["nodes"] if n["partition"]}
    assert placed == set(names)
    for n in report["nodes"]:
        assert {o["partition"] for o in n["litert_ops"]} <= ({n["partition"]} if n["partition"] else set())


RAISING_CHECK = """
from etforge import hookimpl
from etforge.core.contracts.converter import OpConverter

class BrokenFloor(OpConverter):
    ops = ("aten.floor.default",)
    litert = "FLOOR"

    def check(self, node, target):
        raise KeyError("no such limit")

@hookimpl
def etforge_op_converters():
    return [BrokenFloor()]
"""


@pytest.mark.slow  # outside the fast tier: CLI subprocesses with a plugin path (issue 47)
def test_cli_strict_turns_a_raising_check_into_an_error(plugin_dir: Path, tmp_path: Path) -> None:
    write_distribution(
        plugin_dir, "broken-floor", "0.2", {"bfloor": "bfloor_mod"}, {"bfloor_mod": RAISING_CHECK}
    )
    model = tmp_path / "floor_model.py"
    model.write_text(
        "import torch\n"
        "class Floor(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return torch.floor(x * 4.0)\n"
        "def build():\n"
        "    return Floor(), (torch.linspace(-2, 2, 16).reshape(1, 16),)\n"
    )
    out = tmp_path / "out"
    proc = run_cli(
        "--strict", "compile", f"{model}:build", "--target", "litert", "--float", "-o", str(out),
        pythonpath=plugin_dir,
    )  # fmt: skip
    assert proc.returncode == 1
    assert "BrokenFloor (plugin 'bfloor' (broken-floor 0.2))" in proc.stderr and "KeyError" in proc.stderr
    assert "Traceback" not in proc.stderr and not (out / "model.pte").exists()


class RaisingMacs(OpConverter):
    """Refuses floor (it stays on the CPU), but its MAC count, asked all the same, is buggy."""

    ops = ("aten.floor.default",)
    litert = "FLOOR"

    def check(self, node: torch.fx.Node, target: object) -> object:
        from etforge.core.contracts.converter import unsupported

        return unsupported("floor stays on the CPU here")

    def macs(self, node: torch.fx.Node) -> int:
        raise ZeroDivisionError("boom in macs")


def test_raising_macs_is_a_named_fallback_not_a_silent_zero() -> None:
    from etforge.core.common.fallbacks import StrictFallback, recording

    result = _compile(_registry(RaisingMacs()))
    (fb,) = [f for f in result.fallbacks if f.stage == "partition"]
    assert fb.what == "counted 0 MACs" and "aten.floor.default" in fb.where
    assert "plugin 'floorplug' (floor-dist 9.9)" in fb.why and "boom in macs" in fb.why
    with recording(strict=True), pytest.raises(StrictFallback, match="boom in macs"):
        _compile(_registry(RaisingMacs()))


TOY_TARGET = """
from etforge.sdk import NpuSpec, OptionSpec, TargetSpec, hookimpl

NPU = NpuSpec(family="toy", limits={{"max_kernel": 3}}, requires=({flag!r},), declares={declares})

@hookimpl
def etforge_targets():
    return [TargetSpec(name="toy-npu", description="x", npu=NPU, options=({options}))]
"""
DECLARES = {"max_kernel": "largest kernel side", "no_broadcast": "binary ops take equal shapes"}


def _load_target(tmp_path: Path, module: str, strict: bool = False, **fields: object) -> PluginInfo:
    """Load one target plugin module written from :data:`TOY_TARGET` through an entry point."""
    import importlib.metadata as md
    import sys

    values = {"flag": "no_broadcast", "declares": DECLARES, "options": "", **fields}
    (tmp_path / f"{module}.py").write_text(TOY_TARGET.format(**values))
    sys.path.insert(0, str(tmp_path))
    try:
        reg = load_plugins([md.EntryPoint(name=module, value=module, group="etforge")], strict=strict)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(module, None)
    (info,) = reg.plugins
    return info


def test_a_misspelt_requires_flag_fails_naming_target_flag_and_declared(tmp_path: Path) -> None:
    """A flag the spec does not declare would switch a hardware rule off without a word."""
    ok = _load_target(tmp_path, "toy_ok")
    assert ok.error is None and ok.provides["targets"][0].npu.requirement("no_broadcast")
    info = _load_target(tmp_path, "toy_typo", flag="no_brodcast")
    assert info.error is not None and not info.provides
    assert "target 'toy-npu'" in info.error and "'no_brodcast' is not declared" in info.error
    assert "did you mean 'no_broadcast'?" in info.error and "declared: max_kernel, no_broadcast" in info.error
    with pytest.raises(PluginError, match="'no_brodcast' is not declared"):
        _load_target(tmp_path, "toy_typo_strict", strict=True, flag="no_brodcast")


def test_a_spec_that_declares_nothing_cannot_name_flags(tmp_path: Path) -> None:
    """Without ``declares`` nothing tells a misspelt flag from a real one: refused."""
    info = _load_target(tmp_path, "toy_bare", declares={})
    assert info.error is not None and "target 'toy-npu'" in info.error
    assert "'no_broadcast' is not declared: the toy spec declares no names" in info.error


def test_option_names_are_checked_against_the_target(tmp_path: Path) -> None:
    twice = 'OptionSpec("min_partition_ops", 1, "a"), OptionSpec("min_partition_ops", 2, "b")'
    info = _load_target(tmp_path, "toy_twice", options=twice)
    assert info.error is not None and "option 'min_partition_ops' is declared twice" in info.error
    outside = 'OptionSpec("mode", "fast", "how", choices=("small", "exact")),'
    info = _load_target(tmp_path, "toy_choice", options=outside)
    assert info.error is not None and "option 'mode': default 'fast' is not one of its choices" in info.error
