"""Model loading: ``zoo:NAME``, ``path/to/file.py:factory`` or a ``.pt2`` ExportedProgram.

Every failure names the file, the factory and what was wrong, without a traceback wall.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from etforge.core.common.errors import EtforgeError, first_line


@dataclass
class LoadedModel:
    """What the pipeline compiles: a module (or program), example inputs, calibration data."""

    spec: str
    module: torch.nn.Module | None
    example_inputs: tuple[torch.Tensor, ...]
    calibration: list[tuple[torch.Tensor, ...]] | None
    program: torch.export.ExportedProgram | None = None
    #: What the user should know about the model as loaded (reported, not errors).
    notes: list[str] = field(default_factory=list)


def load_model(spec: str) -> LoadedModel:
    """The model ``spec`` names, built on one thread (its float reductions — a factory that
    calibrates BatchNorm, as the zoo's do — then give the same weights on every machine)."""
    from etforge.core.common.threads import one_thread

    with one_thread():
        return _load_model(spec)


def _load_model(spec: str) -> LoadedModel:
    if spec.startswith("zoo:"):
        from etforge import zoo

        name = spec[4:]
        if name not in zoo.ZOO:
            raise EtforgeError(f"unknown zoo model {name!r}; known: {', '.join(sorted(zoo.ZOO))}")
        module, example = zoo.build(name)
        return LoadedModel(spec, module, example, zoo.calibration(name))
    loaded = _load(spec)
    if loaded.program is not None:
        check_weights(_program_tensors(loaded.program), spec)
    elif loaded.module is not None:
        check_weights(_module_tensors(loaded.module), spec)
    check_inputs(loaded.example_inputs, f"{spec}: example input")
    return loaded


def _load(spec: str) -> LoadedModel:
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
        ep = load_program(path)
    except EtforgeError:
        raise
    except Exception as exc:
        raise EtforgeError(
            f"{path}: not a torch.export program ({type(exc).__name__}: {_first_line(exc)})"
        ) from None
    args = ep.example_inputs[0] if ep.example_inputs else None
    if not args:
        raise EtforgeError(
            f"{path}: the program carries no example inputs; save it from torch.export.export(...)"
        )
    return LoadedModel(spec, None, tuple(args), None, program=ep, notes=dynamic_dims_notes(ep))


class _Refused(Exception):
    """Raised inside torch's loader where it would unpickle more than tensors."""


_SAFE_LOCK = threading.Lock()


@contextlib.contextmanager
def _tensors_only() -> Iterator[None]:
    """``torch.export.load`` with every unpickling restricted to tensors and plain containers.

    torch's loader retries a failed ``torch.load(weights_only=True)`` with
    ``weights_only=False`` and reads pickled constants with ``pickle.loads``: a ``.pt2``
    from anywhere (an output directory, a shared cache) could run code. Here ``torch.load``
    is always ``weights_only=True`` and the raw unpicklers refuse; the loader's module
    globals are restored afterwards."""
    from torch.export.pt2_archive import _package

    real_load = torch.load

    def load(f: Any, *args: Any, **kwargs: Any) -> Any:
        kwargs["weights_only"] = True
        try:
            return real_load(f, *args, **kwargs)
        except Exception as exc:
            raise _Refused(str(exc)) from None

    def refuse(*_: Any, **__: Any) -> Any:
        raise _Refused("a pickled Python object (not a tensor)")

    class _NoPickle:
        loads = staticmethod(refuse)
        load = staticmethod(refuse)

    with _SAFE_LOCK:
        saved = (torch.load, _package.pickle, torch._C._pickle_load_obj)
        torch.load = load
        _package.pickle = _NoPickle  # type: ignore[assignment]
        torch._C._pickle_load_obj = refuse
        try:
            yield
        finally:
            torch.load, _package.pickle, torch._C._pickle_load_obj = saved


@contextlib.contextmanager
def lazy_graph_modules() -> Iterator[None]:
    """Inside the block, the graph modules ``torch.export`` builds for a loaded program generate
    their Python code when first called, not when built (``torch.fx``'s lazy graph module, as
    Dynamo builds its own). Each build otherwise generates and compiles the code of the whole
    graph, and a load builds several (the program, its submodules, an ``ExportedProgram`` check):
    verify interprets most graphs node by node and never calls them. The modules are
    ``GraphModule``s like any other; their code exists as soon as anything asks for it."""
    import torch.export.exported_program as exported
    from torch.fx._lazy_graph_module import _make_graph_module, _use_lazy_graph_module

    original = exported._create_graph_module_for_export

    def lazy(root: Any, graph: Any) -> Any:
        with _use_lazy_graph_module(True):
            return _make_graph_module(root, graph)

    exported._create_graph_module_for_export = lazy
    try:
        yield
    finally:
        exported._create_graph_module_for_export = original


def load_program(path: Path | str) -> torch.export.ExportedProgram:
    """A saved ``ExportedProgram`` (``.pt2``), loaded without executing anything from the file.

    A file whose weights, constants or example inputs need more than tensors (a pickled
    object, a ``__reduce__``) is refused with one line naming it."""
    import logging

    from torch._export.serde import union

    from etforge.core.front.serde_once import reflection_once

    path = Path(path)
    check_archive(path)  # before anything inflates it
    quiet = logging.getLogger("torch._export.serde.serialize")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # its "fallback to weights_only=False" warning never applies here
    try:
        with _tensors_only(), reflection_once(union), lazy_graph_modules():
            with open(path, "rb") as f:  # a file object: any path, non-UTF-8 ones too
                return torch.export.load(f)
    except _Refused as exc:
        raise EtforgeError(
            f"{path}: refused: holds pickled data other than tensors ({_unpickle_detail(str(exc))}); "
            "etforge never unpickles code from files"
        ) from None
    finally:
        quiet.setLevel(level)


#: A ``.pt2`` stores its tensors uncompressed (torch.export.save): its entries inflate to about
#: the archive's size. A bound well above that refuses a decompression bomb before any entry
#: is inflated, and still admits an archive someone recompressed.
MAX_INFLATE_RATIO = 16
#: Slack for small archives (their metadata compresses well).
INFLATE_SLACK_BYTES = 64 * 1024 * 1024


def check_archive(path: Path) -> None:
    """Refuse a zip archive whose entries, as its directory declares them (zip readers,
    Python's and torch's, stop at the declared size), inflate beyond the bound, naming it."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            declared = sum(info.file_size for info in archive.infolist())
    except (zipfile.BadZipFile, OSError, ValueError):
        return  # not an archive: the reader names the problem
    size = path.stat().st_size
    bound = MAX_INFLATE_RATIO * size + INFLATE_SLACK_BYTES
    if declared > bound:
        raise EtforgeError(
            f"{path}: refused: its {size:,}-byte archive inflates to {declared:,} bytes, more than "
            f"{MAX_INFLATE_RATIO}x its size + {INFLATE_SLACK_BYTES // 2**20} MiB (a .pt2 stores its tensors uncompressed)"
        )


def _unpickle_detail(text: str) -> str:
    """The line of torch's weights-only error that names what was refused (a GLOBAL ...)."""
    for line in text.splitlines():
        if "GLOBAL" in line or "Unsupported" in line:
            return line.strip().rstrip(".")[:160]
    return first_line(Exception(text))[:160]


def _load_factory(spec: str, path: Path, factory: str) -> LoadedModel:
    if path.suffix != ".py":
        raise EtforgeError(f"model {spec!r}: {path} is not a .py file")
    if not path.is_file():
        raise EtforgeError(f"model file {path} does not exist")
    # The module's name is recorded in the saved programs (each node's module stack): a digest
    # of the path, not Python's per-process string hash, so two compiles write the same bytes.
    name = f"etforge_user_model_{hashlib.sha256(os.fsencode(path.resolve())).hexdigest()[:16]}"
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
    seed, state = torch.initial_seed(), torch.random.get_rng_state()
    try:
        result = fn()
    except Exception as exc:
        raise EtforgeError(f"{path}:{factory}() raised {type(exc).__name__}: {_first_line(exc)}") from None
    loaded = _validate_factory_result(f"{path}:{factory}", result, spec)
    if torch.initial_seed() == seed and not torch.equal(torch.random.get_rng_state(), state):
        loaded.notes.append(UNSEEDED_NOTE.format(where=f"{path}:{factory}"))
    return loaded


def refuse_no_tensor_output(program: torch.export.ExportedProgram, what: str) -> None:
    """A program must return a tensor: one whose forward returns None, a string or other
    constants has nothing to compute (ExecuTorch's planner would fail on it without a name)."""
    out = next(n for n in program.graph.nodes if n.op == "output")
    leaves = torch.utils._pytree.tree_leaves(out.args[0])
    if not any(isinstance(leaf, torch.fx.Node) for leaf in leaves):
        got = ", ".join(sorted({type(x).__name__ for x in leaves})) or "nothing"
        raise EtforgeError(f"{what}: forward returns {got}, no tensor; return the model's output tensor(s)")


#: Told when a factory drew from torch's default generator without seeding it: with this torch
#: that generator starts from another seed in every process (docs/batch.md: determinism).
UNSEEDED_NOTE = (
    "{where} drew random numbers from torch's unseeded default generator (no torch.manual_seed): "
    "if its weights or calibration data depend on them, each compile gives other bytes"
)


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
    """A ``.pt`` file holding a list of input tuples (or tensors, for single-input models), or
    a ``.npz`` (:func:`load_calibration_npz`)."""
    file = Path(path)
    if not file.is_file():
        raise EtforgeError(f"calibration file {file} does not exist")
    if file.suffix == ".npz":
        return load_calibration_npz(file, example)
    try:
        data = torch.load(file, weights_only=True)
    except Exception as exc:
        text = str(exc)
        detail = first_line(Exception(text.split("WeightsUnpickler error:", 1)[-1])).split(". ")[0]
        if "WeightsUnpickler error: Unsupported global" in text:  # a pickled object that is not a tensor
            raise EtforgeError(
                f"calibration file {file}: holds objects other than tensors ({detail}); "
                "save a list of tuples of tensors with torch.save"
            ) from None
        raise EtforgeError(f"calibration file {file}: cannot load ({type(exc).__name__}: {detail})") from None
    if isinstance(data, torch.Tensor):
        data = list(data.unbind(0)) if data.dim() == example[0].dim() + 1 else [data]
    if not isinstance(data, (list, tuple)):
        raise EtforgeError(
            f"calibration file {file}: expected a list of input tuples, got {type(data).__name__}"
        )
    return check_calibration(list(data), example, str(file))


def load_calibration_npz(file: Path, example: tuple[torch.Tensor, ...]) -> list[tuple[torch.Tensor, ...]]:
    """Calibration samples from a ``.npz`` (``numpy.savez``), as ``verify --data`` reads one:
    array ``x`` for a one-input model (``y``, labels, is ignored), else one array per program
    input in order (``x0``, ``x1`` ... or the archive's order); each holds one sample per row
    without the batch dimension of 1 (``verify --data``'s ``x``), or ``[N, *input]``, or one
    sample of the input's shape. Floating arrays take the example
    input's float dtype (numpy saves float64); integer inputs need integer arrays."""
    import numpy as np

    try:
        with np.load(file, allow_pickle=False) as archive:
            arrays = {k: archive[k] for k in archive.keys()}  # noqa: SIM118 (an NpzFile)
    except Exception as exc:  # noqa: BLE001 - zip/pickle errors become one line
        raise EtforgeError(
            f"calibration file {file}: not a readable .npz archive ({type(exc).__name__}: {exc})"
        ) from None
    others = [k for k in arrays if k != "y"]
    if "x" in arrays and len(example) == 1:
        chosen = [arrays["x"]]
    elif sorted(others) == sorted(f"x{i}" for i in range(len(others))):
        chosen = [arrays[f"x{i}"] for i in range(len(others))]
    else:
        chosen = [arrays[k] for k in others]
    if len(chosen) != len(example):
        raise EtforgeError(
            f"calibration file {file}: holds {len(chosen)} array(s) ({', '.join(arrays) or 'none'}), the model "
            f"takes {len(example)} input(s); save x ([N, *input]) or x0, x1 ... one per input"
        )
    columns = []
    for j, (array, want) in enumerate(zip(chosen, example, strict=True)):
        t = torch.from_numpy(np.ascontiguousarray(array))
        if t.dim() == want.dim() and want.shape[0] == 1 and t.shape[1:] == want.shape[1:]:
            t = t.unsqueeze(1)  # one sample per row, batch dimension of 1 left out (verify --data's x)
        elif t.dim() == want.dim():
            t = t.unsqueeze(0)  # one sample
        if t.dim() != want.dim() + 1 or tuple(t.shape[1:]) != tuple(want.shape):
            raise EtforgeError(
                f"calibration file {file}: input {j} is {list(array.shape)}; expected "
                f"[N, {', '.join(map(str, want.shape[1:] if want.shape[0] == 1 else want.shape))}] (a sample per row)"
            )
        if want.is_floating_point() and t.is_floating_point():
            t = t.to(want.dtype)
        elif not want.is_floating_point() and not t.is_floating_point():
            t = t.to(want.dtype)
        else:
            raise EtforgeError(
                f"calibration file {file}: input {j} holds {t.dtype}; the model takes {want.dtype}"
            )
        columns.append(t.unbind(0))
    if len({len(c) for c in columns}) != 1:
        raise EtforgeError(
            f"calibration file {file}: the inputs hold different sample counts {[len(c) for c in columns]}"
        )
    return check_calibration(
        [tuple(c[i] for c in columns) for i in range(len(columns[0]))], example, str(file)
    )


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
        check_inputs(items, f"{where}: calibration batch {i}, input")
        out.append(items)
    return out


def non_finite_count(t: torch.Tensor) -> int:
    """Non-finite values in a floating-point tensor (0 for other dtypes)."""
    if not (t.is_floating_point() or t.is_complex()):
        return 0
    return int((~torch.isfinite(t.detach())).sum())


def check_inputs(tensors: Sequence[torch.Tensor], where: str) -> None:
    """NaN or infinite inputs poison the observers' ranges (all-NaN calibration gives NaN scales)."""
    for j, t in enumerate(tensors):
        bad = non_finite_count(t) if isinstance(t, torch.Tensor) else 0
        if bad:
            raise EtforgeError(
                f"{where} {j} holds {bad} NaN or infinite value(s) of {t.numel()}; quantization needs finite data"
            )


def check_weights(tensors: dict[str, torch.Tensor], where: str) -> None:
    """A NaN or infinite weight cannot be quantized (its scale is NaN): name it."""
    for name, t in tensors.items():
        bad = non_finite_count(t) if isinstance(t, torch.Tensor) else 0
        if bad:
            raise EtforgeError(
                f"{where}: weight {name!r} holds {bad} NaN or infinite value(s) of {t.numel()}"
            )


def _module_tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return dict(module.state_dict(keep_vars=False))


def _program_tensors(ep: torch.export.ExportedProgram) -> dict[str, torch.Tensor]:
    return {**ep.state_dict, **{k: v for k, v in ep.constants.items() if isinstance(v, torch.Tensor)}}


def dynamic_dims_notes(ep: torch.export.ExportedProgram) -> list[str]:
    """A program exported with dynamic dimensions is compiled for its example's sizes: say so."""
    notes = []
    user_inputs = set(ep.graph_signature.user_inputs)
    for node in ep.graph.nodes:
        val = node.meta.get("val")
        if node.op != "placeholder" or node.name not in user_inputs or not isinstance(val, torch.Tensor):
            continue
        dims = [i for i, d in enumerate(val.shape) if not isinstance(d, int)]
        if dims:
            example = dict(zip(user_inputs, ep.example_inputs[0] if ep.example_inputs else (), strict=False))
            shape = list(example[node.name].shape) if node.name in example else "the example's"
            notes.append(
                f"input {node.name!r} has dynamic dimension(s) {dims}; compiled for the example "
                f"shape {shape} (the .pte takes exactly that shape)"
            )
    return notes


def check_program_file(path: Path) -> None:
    """A saved program (``.pt2``) is a complete zip archive: a truncated or damaged one is named."""
    import zipfile

    if not path.is_file():
        raise EtforgeError(f"{path} is missing; recompile")
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise EtforgeError(
            f"{path}: truncated or not a torch.export program ({first_line(exc)}); recompile"
        ) from None
    if bad is not None:
        raise EtforgeError(f"{path}: damaged (member {bad} fails its checksum); recompile")


def _first_line(exc: BaseException) -> str:
    return first_line(exc)


def has_float64(tensors: Sequence[Any]) -> bool:
    return any(isinstance(t, torch.Tensor) and t.dtype == torch.float64 for t in tensors)


def as_float32(
    module: torch.nn.Module,
    example: tuple[torch.Tensor, ...],
    calibration: Sequence[tuple[torch.Tensor, ...]] | None,
) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], list[tuple[torch.Tensor, ...]] | None, str | None]:
    """A float64 model (parameters, buffers or inputs) cast to float32, with a note saying so.

    The int8 quantizer, the NPU and the CPU kernels work from float32; a double model would
    otherwise fail deep inside quantization with a dtype assertion.
    """

    def f32(t: torch.Tensor) -> torch.Tensor:
        return t.float() if t.dtype == torch.float64 else t

    if not has_float64([*module.parameters(), *module.buffers(), *example]):
        return module, example, list(calibration) if calibration is not None else None, None
    calib = [tuple(f32(t) for t in batch) for batch in calibration] if calibration is not None else None
    note = "the model is float64: compiled as float32 (parameters, buffers and inputs cast)"
    return module.float(), tuple(f32(t) for t in example), calib, note


def refuse_float64(program: torch.export.ExportedProgram, what: str) -> None:
    """An exported program's dtypes are fixed: a float64 one is refused with a clear message."""
    doubles = [
        n.name
        for n in program.graph.nodes
        if n.op == "placeholder"
        and isinstance(v := n.meta.get("val"), torch.Tensor)
        and v.dtype == torch.float64
    ]
    if doubles:
        raise EtforgeError(
            f"{what}: the exported program is float64 ({', '.join(doubles[:4])}"
            f"{' ...' if len(doubles) > 4 else ''}); export the model in float32 "
            "(model.float() and float32 inputs) — or pass the module itself, which is cast"
        )
