"""Model loading: ``zoo:NAME``, ``path/to/file.py:factory`` or a ``.pt2`` ExportedProgram.

Every failure names the file, the factory and what was wrong, without a traceback wall.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from etforge.core.errors import EtforgeError


@dataclass
class LoadedModel:
    """What the pipeline compiles: a module (or program), example inputs, calibration data."""

    spec: str
    module: torch.nn.Module | None
    example_inputs: tuple[torch.Tensor, ...]
    calibration: list[tuple[torch.Tensor, ...]] | None
    program: torch.export.ExportedProgram | None = None


def load_model(spec: str) -> LoadedModel:
    if spec.startswith("zoo:"):
        from etforge import zoo

        name = spec[4:]
        if name not in zoo.ZOO:
            raise EtforgeError(f"unknown zoo model {name!r}; known: {', '.join(sorted(zoo.ZOO))}")
        module, example = zoo.build(name)
        return LoadedModel(spec, module, example, zoo.calibration(name))
    if spec.endswith(".pt2"):
        return _load_pt2(spec)
    if ":" not in spec:
        raise EtforgeError(f"model {spec!r}: expected zoo:NAME, path/to/file.py:factory or a .pt2 file")
    path, factory = spec.rsplit(":", 1)
    return _load_factory(spec, Path(path), factory)


def _load_pt2(spec: str) -> LoadedModel:
    path = Path(spec)
    if not path.is_file():
        raise EtforgeError(f"model file {path} does not exist")
    import zipfile

    if not zipfile.is_zipfile(path):
        raise EtforgeError(
            f"{path}: not a torch.export program (a .pt2 is a zip archive from torch.export.save)"
        )
    try:
        ep = torch.export.load(str(path))
    except Exception as exc:
        raise EtforgeError(
            f"{path}: not a torch.export program ({type(exc).__name__}: {_first_line(exc)})"
        ) from None
    args = ep.example_inputs[0] if ep.example_inputs else None
    if not args:
        raise EtforgeError(
            f"{path}: the program carries no example inputs; save it from torch.export.export(...)"
        )
    return LoadedModel(spec, None, tuple(args), None, program=ep)


def _load_factory(spec: str, path: Path, factory: str) -> LoadedModel:
    if path.suffix != ".py":
        raise EtforgeError(f"model {spec!r}: {path} is not a .py file")
    if not path.is_file():
        raise EtforgeError(f"model file {path} does not exist")
    name = f"etforge_user_model_{abs(hash(str(path.resolve())))}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    assert module_spec is not None and module_spec.loader is not None
    mod = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = mod
    try:
        module_spec.loader.exec_module(mod)
    except Exception as exc:
        raise EtforgeError(f"{path}: importing failed: {type(exc).__name__}: {_first_line(exc)}") from None
    fn = getattr(mod, factory, None)
    if not callable(fn):
        funcs = sorted(
            n
            for n, v in vars(mod).items()
            if callable(v) and not n.startswith("_") and getattr(v, "__module__", "") == name
        )
        raise EtforgeError(
            f"{path}: no callable {factory!r} (callables defined there: {', '.join(funcs) or 'none'})"
        )
    try:
        result = fn()
    except Exception as exc:
        raise EtforgeError(f"{path}:{factory}() raised {type(exc).__name__}: {_first_line(exc)}") from None
    return _validate_factory_result(f"{path}:{factory}", result, spec)


def _validate_factory_result(where: str, result: Any, spec: str) -> LoadedModel:
    expected = "(torch.nn.Module, tuple_of_example_tensors[, calibration_batches])"
    if not isinstance(result, tuple) or len(result) not in (2, 3):
        raise EtforgeError(f"{where} returned {type(result).__name__}; expected {expected}")
    module, example = result[0], result[1]
    if not isinstance(module, torch.nn.Module):
        raise EtforgeError(
            f"{where} returned a {type(module).__name__} as the model; expected a torch.nn.Module"
        )
    if isinstance(example, torch.Tensor):
        example = (example,)
    if not isinstance(example, (tuple, list)) or not all(isinstance(t, torch.Tensor) for t in example):
        raise EtforgeError(
            f"{where}: example inputs must be a tuple of tensors; got {type(example).__name__}"
        )
    calibration = None
    if len(result) == 3 and result[2] is not None:
        calibration = check_calibration(list(result[2]), tuple(example), where)
    return LoadedModel(spec, module, tuple(example), calibration)


def load_calibration(path: str, example: tuple[torch.Tensor, ...]) -> list[tuple[torch.Tensor, ...]]:
    """A ``.pt`` file holding a list of input tuples (or tensors, for single-input models)."""
    file = Path(path)
    if not file.is_file():
        raise EtforgeError(f"calibration file {file} does not exist")
    try:
        data = torch.load(file, weights_only=True)
    except Exception as exc:
        raise EtforgeError(
            f"calibration file {file}: cannot load ({type(exc).__name__}: {_first_line(exc)})"
        ) from None
    if isinstance(data, torch.Tensor):
        data = list(data.unbind(0)) if data.dim() == example[0].dim() + 1 else [data]
    if not isinstance(data, (list, tuple)):
        raise EtforgeError(
            f"calibration file {file}: expected a list of input tuples, got {type(data).__name__}"
        )
    return check_calibration(list(data), example, str(file))


def check_calibration(
    batches: Sequence[Any], example: tuple[torch.Tensor, ...], where: str
) -> list[tuple[torch.Tensor, ...]]:
    """Each batch must match the example inputs' count, shapes and dtypes."""
    if not batches:
        raise EtforgeError(f"{where}: calibration data is empty")
    out = []
    for i, batch in enumerate(batches):
        items = (batch,) if isinstance(batch, torch.Tensor) else tuple(batch)
        if len(items) != len(example):
            raise EtforgeError(
                f"{where}: calibration batch {i} has {len(items)} inputs, the model takes {len(example)}"
            )
        for j, (got, want) in enumerate(zip(items, example, strict=True)):
            if not isinstance(got, torch.Tensor) or got.shape != want.shape or got.dtype != want.dtype:
                desc = (
                    f"{got.dtype}{list(got.shape)}" if isinstance(got, torch.Tensor) else type(got).__name__
                )
                raise EtforgeError(
                    f"{where}: calibration batch {i}, input {j} is {desc}; expected {want.dtype}{list(want.shape)}"
                )
        out.append(items)
    return out


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
