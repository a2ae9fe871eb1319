"""The plugin kit judges every target: ``check_op`` reads the CPU backend's quantize forms,
plugins load one way (``@hookimpl`` checked, in ``extra_plugins`` as installed), a converter
reaches an NPU only by naming it, and an NPU name a converter reads must be declared."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from etforge.core.common.errors import PluginError
from etforge.core.contracts.converter import OpConverter, elementwise
from etforge.core.contracts.hookspecs import hookimpl
from etforge.testing import OpCheckError, check_op

from support import write_distribution


def _converters(name: str, *converters: OpConverter) -> types.ModuleType:
    module = types.ModuleType(name)
    module.etforge_op_converters = hookimpl(lambda: list(converters))  # type: ignore[attr-defined]
    return module


class Swish(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(x)


class ReluPlusInput(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) + x


class AvgPool(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.avg_pool2d(x, 2)


def _x() -> tuple[torch.Tensor]:
    return (torch.randn(1, 8, 6, 6, generator=torch.Generator().manual_seed(0)),)


#: A third-party MUL converter for the Neutron NPU family, asked before the built-in.
GOOD_MUL = elementwise("aten.mul.Tensor", "MUL", arity=2, name="MyMul", priority=10, targets=("neutron-c",))
#: The same converter emitting ADD: x + sigmoid(x) for x * sigmoid(x).
WRONG_MUL = elementwise(
    "aten.mul.Tensor", "ADD", arity=2, name="MulAsAdd", priority=10, targets=("neutron-c",)
)


def test_int8_check_on_imxrt700cm_passes_a_correct_converter_within_a_step() -> None:
    """The output leaves through CMSIS-NN's dequantize: held to max_steps (LiteRT rounds one
    step off the PT2E reference here), not to the float atol."""
    result = check_op(Swish(), _x(), target="imxrt700cm", plugins=[_converters("good_mul", GOOD_MUL)])
    assert "MUL" in result.litert_ops and result.delegated
    assert 0 < result.max_steps <= 1.0 + 1e-3


def test_int8_check_on_imxrt700cm_fails_a_wrong_converter_naming_the_tolerance() -> None:
    with pytest.raises(OpCheckError) as err:
        check_op(
            Swish(),
            _x(),
            target="imxrt700cm",
            plugins=[_converters("wrong_mul", WRONG_MUL)],
            float_check=False,
        )
    message = str(err.value)
    assert "dequantized by cortex_m.dequantize_per_tensor.default" in message, message
    assert "quantization steps > max_steps=1.0" in message and "'ADD'" in message, message
    assert "atol" not in message


def _cmsis_nn_variant(zero_point_shift: int) -> types.ModuleType:
    """A plugin deriving a target from cortex-m33 whose CPU backend is CMSIS-NN's with the
    output dequantize's zero point moved by ``zero_point_shift`` (0: a faithful copy). The
    kit must find the backend's dequantize form through the registry, not by its name."""
    import dataclasses

    from etforge.plugins.targets.cortex_m import CortexMBackend
    from etforge.sdk import node_op

    class Shifted(CortexMBackend):
        name = f"cmsis_nn_shift_{zero_point_shift}"

        def lower(self, ep: Any, target: Any, options: dict[str, Any]) -> Any:
            ep = super().lower(ep, target, options)
            out = next(n for n in ep.graph_module.graph.nodes if n.op == "output")
            dq = out.args[0][0]
            if node_op(dq) not in self.dequantize_ops:  # the float form: nothing to shift
                return ep
            dq.args = (dq.args[0], dq.args[1], dq.args[2] + zero_point_shift, *dq.args[3:])
            ep.graph_module.recompile()
            return ep

    module = types.ModuleType(f"shift_{zero_point_shift}")
    base = None

    def targets() -> list[Any]:
        nonlocal base
        from etforge.plugins.targets.cortex_m import CORTEX_M33

        base = dataclasses.replace(
            CORTEX_M33, name=f"m33-shift-{zero_point_shift}", cpu_fallback=Shifted.name
        )
        return [base]

    module.etforge_cpu_backends = hookimpl(lambda: [Shifted()])  # type: ignore[attr-defined]
    module.etforge_targets = hookimpl(targets)  # type: ignore[attr-defined]
    return module


def test_int8_check_on_cortex_m33_holds_cmsis_nn_outputs_to_steps() -> None:
    """cortex-m33 has no NPU: check_op judges its CPU lowering. CMSIS-NN's avg_pool, one step
    off the reference, passes; a derived target whose backend shifts the output's zero point
    by 3 fails, in steps, naming the backend's dequantize."""
    result = check_op(AvgPool(), _x(), target="cortex-m33", expect_delegated=False)
    assert 0 < result.max_steps <= 1.0 + 1e-3 and not result.litert_ops
    same = check_op(
        AvgPool(), _x(), target="m33-shift-0", expect_delegated=False, plugins=[_cmsis_nn_variant(0)]
    )
    assert same.max_steps == result.max_steps
    with pytest.raises(OpCheckError) as err:
        check_op(
            AvgPool(),
            _x(),
            target="m33-shift-3",
            expect_delegated=False,
            plugins=[_cmsis_nn_variant(3)],
            float_check=False,
        )
    message = str(err.value)
    assert "dequantized by cortex_m.dequantize_per_tensor.default" in message, message
    # 3 steps of shift, plus the one step avg_pool's rounding already had
    assert re.search(r"max error [34]\.00 quantization steps > max_steps=1\.0", message), message
    assert "atol" not in message


def test_a_float_output_says_it_was_held_to_the_float_tolerance() -> None:
    with pytest.raises(OpCheckError) as err:
        check_op(Swish(), _x(), target="litert", quantize=False, atol=0.0, rtol=0.0, expect_delegated=False,
                 plugins=[_converters("wrong_mul_litert", elementwise("aten.mul.Tensor", "ADD", arity=2, name="MulAsAdd2", priority=10))])  # fmt: skip
    message = str(err.value)
    assert "a float output: held to the float tolerance" in message and "rtol=0.0, atol=0.0" in message, (
        message
    )
    assert "off a reference of" in message


UNMARKED = """
from etforge.sdk import elementwise

def etforge_op_converters():
    return [elementwise("aten.floor.default", "FLOOR", name="Unmarked")]
"""


def test_a_hook_without_hookimpl_is_a_load_error_installed_and_in_process(plugin_dir: Path) -> None:
    from etforge.core.registry.manager import extra_plugins, load_plugins

    write_distribution(
        plugin_dir, "unmarked-plugin", "0.3", {"unmarked": "unmarked_mod"}, {"unmarked_mod": UNMARKED}
    )
    sys.path.insert(0, str(plugin_dir))
    try:
        reg = load_plugins()
        (info,) = [p for p in reg.plugins if p.name == "unmarked"]
        assert info.error and "unmarked-plugin 0.3" in info.error, info.error
        assert "etforge_op_converters() is not marked @hookimpl" in info.error
        with pytest.raises(
            PluginError, match=r"'unmarked_mod'.*etforge_op_converters\(\) is not marked @hookimpl"
        ):
            with extra_plugins(sys.modules["unmarked_mod"]):
                pass
    finally:
        sys.path.remove(str(plugin_dir))
        sys.modules.pop("unmarked_mod", None)


def test_a_marked_function_naming_no_hook_is_a_load_error() -> None:
    from etforge.core.registry.manager import extra_plugins

    module = types.ModuleType("misnamed_hook")
    module.etforge_op_converter = hookimpl(lambda: [])  # type: ignore[attr-defined]  # no trailing s
    with pytest.raises(
        PluginError, match=r"'misnamed_hook'.*etforge_op_converter\(\) is marked @hookimpl but no such hook"
    ):
        with extra_plugins(module):
            pass


class KernelLimited(OpConverter):
    ops = ("aten.floor.default",)
    litert = "FLOOR"
    targets = ("neutron-c",)
    reads = ("max_kernal",)


def test_a_misspelt_npu_name_in_a_converter_is_a_load_error_naming_the_plugin() -> None:
    from etforge.core.registry.manager import extra_plugins

    with pytest.raises(PluginError) as err:
        with extra_plugins(_converters("kernel_limited", KernelLimited())):
            pass
    message = str(err.value)
    assert "'kernel_limited'" in message and "KernelLimited reads NPU name 'max_kernal'" in message, message
    assert "did you mean 'max_kernel'?" in message
    KernelLimited.reads = ("max_kernel",)
    try:
        with extra_plugins(_converters("kernel_limited", KernelLimited())) as reg:
            assert any(c.name == "KernelLimited" for c in reg.converters)
    finally:
        KernelLimited.reads = ("max_kernal",)


def test_a_converter_that_names_no_npu_stays_off_the_npus_that_did_not_ask() -> None:
    """A third-party GELU without ``targets``: the host LiteRT target takes it, the RT700's
    Neutron does not; naming the family brings it there. Built-ins serve every NPU."""
    from etforge.core.registry.manager import extra_plugins

    gelu = elementwise("aten.gelu.default", "GELU", name="ThirdPartyGelu")
    neutron_gelu = elementwise("aten.gelu.default", "GELU", name="NeutronGelu", targets=("neutron-c",))
    with extra_plugins(_converters("gelus", gelu, neutron_gelu)) as reg:
        on = {t: [c.name for c in reg.converters_for(reg.target(t)).get("aten.gelu.default", [])]
              for t in ("litert", "imxrt700", "imxrt700cm", "cortex-m33")}  # fmt: skip
        assert on == {"litert": ["ThirdPartyGelu"], "imxrt700": ["NeutronGelu"],
                      "imxrt700cm": ["NeutronGelu"], "cortex-m33": []}, on  # fmt: skip
        for t in ("litert", "imxrt700", "imxrt700cm"):
            assert "aten.convolution.default" in reg.converters_for(reg.target(t))
