"""One registry: the registry a compile is given decides the partitioner, the conversion and
the report alike; plugins load once per CLI run; ``core/`` names no op and no chip."""

from __future__ import annotations

import ast
import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

import numpy as np
import pytest
import torch

from etforge.core.contracts.converter import OpConverter
from etforge.core.registry.manager import PluginInfo, Registry, registry

from support import REPO

#: LiteRT's float32 kernels against torch on the same inputs: both compute max(x, 0) and
#: x * 2 exactly in float32, so any difference is a conversion error.
EXACT = 0.0


class ReluAsLeakyZero(OpConverter):
    """relu as LEAKY_RELU(alpha=0): the same function through a different LiteRT builtin,
    so the partition shows which converter produced it."""

    ops = ("aten.relu.default",)
    priority = 10
    litert = "LEAKY_RELU"

    def convert(self, node: torch.fx.Node, ctx: object) -> None:
        from etforge.core.litert.builder import options

        x = ctx.input(node.args[0])  # type: ignore[attr-defined]
        ctx.emit("LEAKY_RELU", [x], [ctx.output(node, x.perm)], options("LeakyReluOptions", alpha=0.0))  # type: ignore[attr-defined]


class DoubleThenRelu(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * 2.0)


def _with_override() -> Registry:
    base = registry()
    info = PluginInfo("leaky_relu_override", "test-override", "1.0", "tests.test_registry")
    info.provides["converters"] = [ReluAsLeakyZero()]
    return Registry([*base.plugins, info])


def test_given_registry_decides_partition_and_report() -> None:
    """The override decides the node in the report *and* produced the partition's ops, and
    the process-wide registry (which lacks the override) is not consulted."""
    from ai_edge_litert.interpreter import Interpreter

    from etforge.core.build.report import build_report
    from etforge.core.build.session import compile_model

    reg = _with_override()
    x = (torch.randn(1, 16, generator=torch.Generator().manual_seed(0)),)
    result = compile_model(DoubleThenRelu(), x, "litert", quantize=False, reg=reg)
    report = build_report(result, reg, "double_then_relu")
    relu = next(n for n in report["nodes"] if n["op"] == "aten.relu.default")
    assert (relu["converter"], relu["plugin"]) == ("ReluAsLeakyZero", "leaky_relu_override")
    assert [o["op"] for o in relu["litert_ops"]] == ["LEAKY_RELU"]
    (part,) = result.partitions
    assert "LEAKY_RELU" in part.converted.operators and "RELU" not in part.converted.operators
    # per-node partitions agree with the partition list
    assert relu["partition"] == part.name == report["partitions"][0]["name"]
    # the partition computes relu
    interp = Interpreter(model_content=part.converted.tflite)
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], x[0].numpy())
    interp.invoke()
    got = interp.get_tensor(interp.get_output_details()[0]["index"])
    assert float(np.abs(got - DoubleThenRelu()(*x).numpy()).max()) <= EXACT
    # the same compile with the process-wide registry uses the built-in
    plain = compile_model(DoubleThenRelu(), x, "litert", quantize=False)
    assert "LEAKY_RELU" not in plain.partitions[0].converted.operators


def test_support_is_decided_once_per_node() -> None:
    """ExecuTorch asks which ops to keep whole (twice), the partitioner places the nodes, the
    backend converts them: each node's support check runs once, and its answer is carried."""
    from etforge.core.build.session import compile_model
    from etforge.plugins.ops.linear import Linear

    seen: list[str] = []

    class CountingLinear(Linear):
        priority = 10

        def check(self, node: torch.fx.Node, target: object) -> object:
            seen.append(node.name)
            return super().check(node, target)  # type: ignore[arg-type]

    base = registry()
    info = PluginInfo("counting", "test-counting", "1.0", "tests.test_registry")
    info.provides["converters"] = [CountingLinear()]
    reg = Registry([*base.plugins, info])
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    result = compile_model(m, (torch.randn(1, 8),), "litert", quantize=False, reg=reg)
    linears = [d for d in result.decisions if d.converter == "CountingLinear"]
    assert len(linears) == 2 and all(d.npu for d in linears)
    assert len(seen) == 2, seen  # one check per linear, although three stages needed the answer
    assert "FULLY_CONNECTED" in result.partitions[0].converted.operators


def test_lowering_token_is_not_serialized() -> None:
    """Each lowering has its own token; it is stripped, so two lowerings give the same bytes."""
    from etforge.core.build.session import compile_model

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    x = (torch.ones(1, 8),)
    first = compile_model(m, x, "litert", quantize=False)
    second = compile_model(m, x, "litert", quantize=False)
    assert b"etforge_lowering" not in first.pte
    assert first.pte == second.pte


@pytest.mark.slow  # outside the fast tier: CLI subprocesses (issue 47)
def test_plugins_load_once_per_cli_run(tmp_path: Path) -> None:
    """``etforge compile`` loads the entry points once (the backend uses the CLI's registry)."""
    model = tmp_path / "m.py"
    model.write_text(
        "import torch\n"
        "def build():\n"
        "    torch.manual_seed(0)\n"
        "    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()), (torch.randn(1, 8),)\n"
    )
    script = (
        "import sys\n"
        "from etforge.core.registry import manager as pm\n"
        "calls = []\n"
        "real = pm.load_plugins\n"
        "def counting(*a, **k):\n"
        "    calls.append(1)\n"
        "    return real(*a, **k)\n"
        "pm.load_plugins = counting\n"
        "import etforge.cli as cli\n"
        "import etforge.cli.common\n"
        "etforge.cli.common.load_plugins = counting\n"
        "try:\n"
        f"    cli.main([{'compile'!r}, {str(model) + ':build'!r}, '--target', 'litert', '--float',"
        f" '-o', {str(tmp_path / 'out')!r}], standalone_mode=False)\n"
        "finally:\n"
        "    print('LOADS', len(calls), file=sys.stderr)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "LOADS 1" in proc.stderr, proc.stderr[-3000:]
    assert (tmp_path / "out" / "model.pte").exists()


#: Words that name an op or a chip. ``core/`` is generic: ops belong to op plugins, chips and
#: CPU kernels to target plugins. Only code is checked (names, string literals, imports);
#: docstrings and comments may mention examples.
FORBIDDEN = re.compile(
    r"relu|hardtanh|clamp|sigmoid|tanh|softmax|conv(?:olution|\d?d)?\b|linear|addmm|(?:max|avg)_?pool"
    r"|cortex|cmsis|neutron|imxrt|rt700|\bm33\b|\bm55\b|\bmve\b|eiq|nxp|plugins\.(?:ops|targets)",
    re.IGNORECASE,
)


def _code_tokens(path: Path) -> list[tuple[int, str]]:
    """(line, text) of the NAME and STRING tokens of a module, docstrings and comments left out."""
    out: list[tuple[int, str]] = []
    tokens = list(tokenize.generate_tokens(io.StringIO(path.read_text()).readline))
    prev = tokenize.NEWLINE
    for tok in tokens:
        if tok.type == tokenize.STRING and prev in (
            tokenize.NEWLINE,
            tokenize.INDENT,
            tokenize.NL,
            tokenize.DEDENT,
        ):
            pass  # a statement that is only a string: a docstring
        elif tok.type in (tokenize.NAME, tokenize.STRING) or tok.type == getattr(
            tokenize, "FSTRING_MIDDLE", -1
        ):
            out.append((tok.start[0], tok.string))
        if tok.type not in (tokenize.COMMENT, tokenize.NL):
            prev = tok.type
    return out


def _op_or_chip_names(path: Path) -> list[str]:
    return [
        f"{line}: {text.strip()[:80]}" for line, text in _code_tokens(path) for _ in FORBIDDEN.finditer(text)
    ]


def test_core_names_no_op_and_no_chip() -> None:
    """Every module of every core subpackage, no exemption: op and chip knowledge is plugins'."""
    paths = sorted((REPO / "core").rglob("*.py"))
    assert {p.parent.name for p in paths} >= {"contracts", "litert", "lower", "serialize", "build"}
    found = [f"{p.relative_to(REPO)}:{hit}" for p in paths for hit in _op_or_chip_names(p)]
    assert not found, "op or chip names in core/:\n" + "\n".join(found)


def test_the_name_guard_sees_code_not_docstrings(tmp_path: Path) -> None:
    mod = tmp_path / "m.py"
    mod.write_text(
        '"""A docstring may say Conv2d and CMSIS-NN."""\n'
        "# so may a comment: neutron\n"
        "def f(conv):\n"
        '    """Nor here: relu."""\n'
        '    return conv.name, "cortex_m::x"\n'
    )
    assert [hit.split(":")[0] for hit in _op_or_chip_names(mod)] == ["3", "5", "5"]


def test_core_reads_no_npu_spec_name() -> None:
    """No ``requires`` flag, ``limits`` or ``choices`` key of any loaded target's NPU spec (nor
    any name a spec declares) is a string in core/: the core reads no NPU's rules; converters,
    partition checks and compiler hooks -- plugins -- do."""
    names: set[str] = set()
    for t in registry().targets.values():
        if t.npu is not None:
            names |= set(t.npu.requires) | set(t.npu.limits) | set(t.npu.choices) | set(t.npu.declares)
    assert "partition_needs_compute" in names and "max_kernel" in names  # the Neutron spec is loaded
    found = []
    for path in sorted((REPO / "core").rglob("*.py")):
        for line, text in _code_tokens(path):
            if text[:1] in "\"'" or text[:2].lower() in {'f"', "f'"}:
                for name in names:
                    if re.search(rf"\b{re.escape(name)}\b", text):
                        found.append(f"{path.name}:{line}: {name} in {text.strip()[:80]}")
    assert not found, "NPU spec names in core/:\n" + "\n".join(found)


PLUGIN_CODE = (REPO / "plugins", REPO / "tests" / "plugin_example")


def _etforge_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every ``etforge`` import in a module, at any depth (TYPE_CHECKING too)."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            module = "relative" if node.level else (node.module or "")
            if module == "etforge":
                out += [(node.lineno, f"etforge.{a.name}") for a in node.names]
            else:
                out.append((node.lineno, module))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
    return [(line, m) for line, m in out if m == "relative" or m.split(".")[0] == "etforge"]


def _sdk_bypasses(path: Path) -> list[tuple[int, str]]:
    """The imports of ``path`` that reach etforge other than through the sdk or a plugin sibling."""
    return [
        (line, m)
        for line, m in _etforge_imports(path)
        if m != "etforge.sdk" and not m.startswith("etforge.plugins.")
    ]


def test_plugins_import_only_the_sdk() -> None:
    """A plugin's door into etforge is ``etforge.sdk`` (and its own ``etforge.plugins`` siblings):
    what core keeps private can change without breaking a plugin."""
    paths = [p for root in PLUGIN_CODE for p in sorted(root.rglob("*.py"))]
    assert len(paths) > 20
    wrong = [f"{p.relative_to(REPO)}:{line}: imports {m}" for p in paths for line, m in _sdk_bypasses(p)]
    assert not wrong, "plugins reaching past etforge.sdk:\n" + "\n".join(wrong)


def test_every_sdk_name_resolves_and_is_in_its_index() -> None:
    """The sdk's docstring is the plugin author's index: each public name is listed and loads."""
    import etforge.sdk as sdk

    doc = sdk.__doc__ or ""
    unlisted = [n for n in sdk.__all__ if not re.search(rf"\b{re.escape(n)}\b", doc)]
    assert not unlisted, f"names missing from the sdk's docstring: {unlisted}"
    assert [n for n in sdk.__all__ if getattr(sdk, n, None) is None] == []


def test_the_sdk_walk_sees_a_bypass(tmp_path: Path) -> None:
    mod = tmp_path / "m.py"
    mod.write_text(
        "from etforge.sdk import hookimpl\n"
        "from etforge.plugins.ops.conv import X\n"
        "from etforge import hookimpl\n"
        "def f():\n"
        "    from etforge.core.graph.utils import shape_of\n"
        "    import etforge.core.litert.convert\n"
        "    from . import sibling\n"
    )
    assert sorted(_sdk_bypasses(mod)) == [
        (3, "etforge.hookimpl"),
        (5, "etforge.core.graph.utils"),
        (6, "etforge.core.litert.convert"),
        (7, "relative"),
    ]


def test_a_name_defined_twice_is_an_error_naming_both_plugins() -> None:
    """Two plugins giving one target (or CPU backend, NPU compiler) name: neither silently wins."""
    import dataclasses

    import pytest

    from etforge.core.common.errors import PluginError

    base = registry()
    info = PluginInfo("imposter", "imposter-dist", "0.1", "tests.imposter")
    info.provides["targets"] = [dataclasses.replace(base.target("imxrt700"), description="another chip")]
    reg = Registry([*base.plugins, info])
    with pytest.raises(PluginError) as err:
        reg.target("imxrt700")
    message = str(err.value)
    assert (
        "target 'imxrt700' is defined twice" in message and "plugin 'imposter' (imposter-dist 0.1)" in message
    )
    info.provides["targets"] = []
    info.provides["cpu_backends"] = [base.cpu_backends["portable"]]  # the same object again: no conflict
    assert Registry([*base.plugins, info]).cpu_backends["portable"] is base.cpu_backends["portable"]
