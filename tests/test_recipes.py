"""ExecuTorch's recipe API targets etforge: ``executorch.export.export(model, inputs, recipe)``.

The recipe composes etforge's quantizer, early NPU delegation, partitioner, CPU lowering and
memory planning as ExecuTorch's own stages; its ``.pte`` must be, byte for byte, what
``etforge compile`` writes (and with ``lowering="classic"``, what a script's
``to_edge_transform_and_lower`` gives). The model is test_idiom's: it needs two float-graph
rewrites, the channels-last layout on Cortex-M targets and a Linear kept whole for CMSIS-NN.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

import pytest
import torch
from executorch.export import ExportRecipe, export, recipe_registry
from test_idiom import FACTORY, _model, _ops

import etforge
from etforge.core.common.errors import EtforgeError
from etforge.core.contracts.hookspecs import hookimpl
from etforge.core.registry.manager import extra_plugins, registry
from etforge.recipes import BACKEND, EtforgeRecipeType, member_name, recipe_types, target_recipe


def _recipe_pte(name: str, **kwargs: object) -> bytes:
    """The recipe's ``.pte`` for target ``name``: made once per target and options in this
    process (test_verify_takes_the_recipes_pte reads the ones the equality test made; a run
    that raises is not kept, so a failing recipe fails every test that asks for it)."""
    return _recipe_pte_once(name, tuple(sorted(kwargs.items())))


@functools.cache
def _recipe_pte_once(name: str, kwargs: tuple[tuple[str, object], ...]) -> bytes:
    model, _, calib = _model()
    recipe = ExportRecipe.get_recipe(EtforgeRecipeType[member_name(name)], **dict(kwargs))
    return export(model, calib, recipe).get_pte_buffer()


@pytest.mark.parametrize("name", ["imxrt700", "imxrt700cm", "cortex-m33"])
def test_recipe_gives_the_pte_etforge_compiles(name: str) -> None:
    """The default recipe: ``etforge compile``'s program (early lowering); ``lowering="classic"``:
    a script's (``etforge.compile(..., lowering="classic")``)."""
    model, example, calib = _model()
    compiled = etforge.compile(model, example, target=name, calibration=calib)
    assert "graph rewrites applied: Hardsigmoid, DivByConstant" in compiled.report["notes"]
    assert _recipe_pte(name) == compiled.pte
    model, example, calib = _model()
    classic = etforge.compile(model, example, target=name, calibration=calib, lowering="classic")
    assert _recipe_pte(name, lowering="classic") == classic.pte


def test_one_recipe_type_per_registered_target() -> None:
    assert BACKEND in recipe_registry.list_backends()
    assert sorted(t.value for t in EtforgeRecipeType) == sorted(registry().targets)
    assert set(recipe_registry.get_supported_recipes(BACKEND)) == set(EtforgeRecipeType)


class VariantPlugin:
    """A target plugin registered the way a third-party one is: the RT700 under another name."""

    @staticmethod
    @hookimpl
    def etforge_targets() -> list[Any]:
        return [dataclasses.replace(registry().target("imxrt700"), name="rt700-variant")]


def test_a_plugins_target_gets_a_recipe() -> None:
    """A target plugin's target has its recipe type, found through etforge's plugin registry,
    and its recipe writes what ``etforge compile`` writes for it."""
    model, example, calib = _model()
    with extra_plugins(VariantPlugin()):
        types = recipe_types()
        assert "rt700-variant" not in {t.value for t in EtforgeRecipeType}
        assert {t.value for t in types} == set(registry().targets) >= {"rt700-variant", "imxrt700cm"}
        pte = export(model, calib, ExportRecipe.get_recipe(types.RT700_VARIANT)).get_pte_buffer()
        assert pte == etforge.compile(model, example, target="rt700-variant", calibration=calib).pte
    with pytest.raises(EtforgeError, match="unknown target 'rt700-variant'"):
        ExportRecipe.get_recipe(types.RT700_VARIANT)  # the plugin is gone again


def test_unknown_target_and_option_are_refused() -> None:
    with pytest.raises(EtforgeError, match=r"unknown target 'imx93'; known targets: .*imxrt700cm"):
        target_recipe("imx93")
    with pytest.raises(EtforgeError, match="unknown option"):
        target_recipe("imxrt700", turbo=True)


def test_a_model_in_training_mode_is_refused() -> None:
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU()).train()
    x = torch.randn(2, 3, 6, 6)
    with pytest.raises(
        RuntimeError, match=r"captured in training mode \(batch_norm.*call model.eval\(\)"
    ) as err:
        export(model, [(x,)], target_recipe("imxrt700"))
    assert isinstance(err.value.__cause__, EtforgeError)


def test_options_pass_through_the_recipe() -> None:
    """A target option changes the program as it does ``etforge.compile``'s; the memory budget
    is checked where the arena is planned."""
    model, example, calib = _model()
    options = {"operators_not_to_delegate": "aten.linear.default"}
    compiled = etforge.compile(model, example, target="imxrt700cm", calibration=calib, options=options)
    fits = _recipe_pte("imxrt700cm", memory_budget=1 << 30, **options)
    assert fits == compiled.pte
    assert "cortex_m::quantized_linear.out" in _ops(fits)  # the option took effect
    with pytest.raises(EtforgeError, match=r"planned arena .* does not fit the memory budget 64 B"):
        _recipe_pte("imxrt700cm", memory_budget=64)


@pytest.mark.parametrize("lowering", ["early", "classic"])
def test_verify_takes_the_recipes_pte(lowering: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from etforge.runtime.verification.script_pte import verify_script_pte

    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    (tmp_path / "net.py").write_text(FACTORY)
    pte = tmp_path / "recipe.pte"
    pte.write_bytes(_recipe_pte("imxrt700cm", lowering=lowering))
    v = verify_script_pte(pte, f"{tmp_path / 'net.py'}:build", "imxrt700cm", samples=4)
    assert v.ok, v.failures
    assert "byte for byte the program etforge compiles from it" in v.notes[0]


def test_recipe_calibration_parameter() -> None:
    """``calibration=`` replaces the example inputs as calibration data (as ``etforge.compile``'s)."""
    model, example, calib = _model()
    compiled = etforge.compile(model, example, target="imxrt700", calibration=calib[:1])
    recipe = target_recipe("imxrt700", calibration=calib[:1])
    assert export(model, calib, recipe).get_pte_buffer() == compiled.pte
