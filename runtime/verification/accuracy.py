"""``etforge verify --data``: accuracy of the float model and of the compiled program on labeled data.

Random inputs show that the program reproduces the quantized reference; only labeled
samples show what quantization cost the user. Formats (one sample per row, the model's
input shape without its batch dimension of 1):

- ``.npz`` (``numpy.savez``) with arrays ``x`` (floating point, ``[N, *input]``) and ``y``
  (integer class labels, ``[N]``);
- ``.pt`` (``torch.save``) of a dict ``{"x": tensor, "y": tensor}`` or a pair ``(x, y)``,
  loaded with ``weights_only=True`` (tensors only, no pickled code);
- ``zoo:NAME``: the held-out test split of a trained zoo model (``etforge zoo-data NAME
  FILE.npz`` writes the same samples as a ``.npz``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from etforge.core.common.errors import EtforgeError

#: Percentage points of top-1 accuracy the compiled program may lose against the float model
#: by default: int8 post-training quantization of a small classifier typically costs a
#: fraction of a point; a conversion error costs many.
DEFAULT_MAX_ACCURACY_DROP = 1.0


@dataclass
class Labeled:
    x: torch.Tensor  # [N, *input], the model's input dtype
    y: torch.Tensor  # [N], int64
    source: str


@dataclass
class Accuracy:
    samples: int
    float_accuracy: float  # percent
    compiled_accuracy: float  # percent

    @property
    def drop(self) -> float:
        """Percentage points lost by the compiled program (negative: it gained)."""
        return self.float_accuracy - self.compiled_accuracy


def _zoo(name: str) -> tuple[torch.Tensor, torch.Tensor]:
    from etforge.zoo import digits

    if name not in digits.CONFIGS:
        raise EtforgeError(
            f"--data zoo:{name}: no held-out data for that zoo model "
            f"(zoo models with data: {', '.join(sorted(digits.CONFIGS))})"
        )
    return digits.test_data(name)


def _read(path: Path) -> tuple[Any, Any]:
    """(x, y) as stored, before any check of their contents."""
    if not path.is_file():
        raise EtforgeError(f"--data {path}: no such file")
    if path.suffix == ".npz":
        try:
            with np.load(path, allow_pickle=False) as archive:
                keys = list(archive.keys())
                missing = [k for k in ("x", "y") if k not in keys]
                if missing:
                    raise EtforgeError(
                        f"--data {path}: no array {' or '.join(repr(k) for k in missing)} "
                        f"(holds {', '.join(map(repr, keys)) or 'nothing'}); expected x (samples) and y (labels)"
                    )
                return archive["x"], archive["y"]
        except EtforgeError:
            raise
        except Exception as exc:  # noqa: BLE001 - zip/pickle errors become one line
            raise EtforgeError(
                f"--data {path}: not a readable .npz archive ({type(exc).__name__}: {exc})"
            ) from None
    if path.suffix == ".pt":
        try:
            obj = torch.load(path, weights_only=True)
        except Exception as exc:  # noqa: BLE001
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise EtforgeError(
                f"--data {path}: not a tensors-only torch.save file ({type(exc).__name__}: {first})"
            ) from None
        if isinstance(obj, dict):
            missing = [k for k in ("x", "y") if k not in obj]
            if missing:
                raise EtforgeError(
                    f"--data {path}: no tensor {' or '.join(repr(k) for k in missing)} "
                    f"(holds {', '.join(map(repr, obj)) or 'nothing'}); expected x (samples) and y (labels)"
                )
            return obj["x"], obj["y"]
        if isinstance(obj, (tuple, list)) and len(obj) == 2:
            return obj[0], obj[1]
        raise EtforgeError(
            f"--data {path}: holds a {type(obj).__name__}; expected a dict with tensors x and y, or a pair (x, y)"
        )
    raise EtforgeError(f"--data {path}: expected a .npz or .pt file (or zoo:NAME)")


def _tensor(value: Any, what: str, where: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, np.ndarray):
        if value.dtype == object or value.dtype.kind not in "biuf":
            raise EtforgeError(f"--data {where}: {what} has dtype {value.dtype}; expected numbers")
        return torch.from_numpy(np.asarray(value, order="C"))
    raise EtforgeError(f"--data {where}: {what} is a {type(value).__name__}; expected an array or tensor")


def load_labeled(spec: str, report: dict[str, Any]) -> Labeled:
    """Read and check labeled samples for the compiled model described by ``report``."""
    if spec.startswith("zoo:"):
        x, y = _zoo(spec[4:])
    else:
        raw_x, raw_y = _read(Path(spec))
        x, y = _tensor(raw_x, "x", spec), _tensor(raw_y, "y", spec)
    inputs: Sequence[dict[str, Any]] = report["inputs"]
    if len(inputs) != 1:
        raise EtforgeError(
            f"--data {spec}: the model takes {len(inputs)} inputs; --data needs a single-input model"
        )
    shape, dtype = list(inputs[0]["shape"]), getattr(torch, inputs[0]["dtype"])
    expected = ["N", *shape[1:]]
    if not x.is_floating_point() and dtype.is_floating_point:
        raise EtforgeError(
            f"--data {spec}: x has dtype {str(x.dtype).removeprefix('torch.')}; expected floating-point samples"
        )
    if x.dim() != len(shape) or list(x.shape[1:]) != shape[1:] or shape[:1] != [1]:
        raise EtforgeError(
            f"--data {spec}: x has shape {list(x.shape)}; expected [{', '.join(map(str, expected))}] "
            f"(N samples of the model's input {shape})"
        )
    if y.dtype in (torch.bool,) or y.is_floating_point() or y.is_complex():
        raise EtforgeError(
            f"--data {spec}: y has dtype {str(y.dtype).removeprefix('torch.')}; expected integer class labels"
        )
    if y.dim() != 1 or len(y) != len(x):
        raise EtforgeError(
            f"--data {spec}: y has shape {list(y.shape)}; expected [{len(x)}] (one label per sample of x)"
        )
    if len(x) == 0:
        raise EtforgeError(f"--data {spec}: no samples")
    x = x.to(dtype)
    if dtype.is_floating_point and not bool(torch.isfinite(x).all()):
        bad = int((~torch.isfinite(x)).flatten(1).any(1).nonzero()[0])
        raise EtforgeError(f"--data {spec}: x holds NaN or infinity (sample {bad})")
    y = y.to(torch.int64)
    if int(y.min()) < 0:
        bad = int((y < 0).nonzero()[0])
        raise EtforgeError(f"--data {spec}: label {int(y[bad])} at sample {bad} is negative")
    return Labeled(x, y, spec)


def evaluate(
    program: Any,
    float_ep: Any,
    data: Labeled,
    report: dict[str, Any],
    kernels: str = "default",
) -> Accuracy:
    """Top-1 accuracy of the float model and of the compiled program, sample by sample
    (the programs are exported for a batch of 1)."""
    from etforge.runtime.execution.host import run_program
    from etforge.runtime.verification.outputs import first_float, flatten, rows

    channels_last = report["options"].get("dim_order") == "channels_last"
    float_fn = float_ep.module(check_guards=False)

    def sample(i: int) -> torch.Tensor:
        x = data.x[i : i + 1]
        return x.contiguous(memory_format=torch.channels_last) if channels_last and x.dim() == 4 else x

    with torch.no_grad():
        first = flatten(float_ep, float_fn(sample(0)))
    # the class scores: the first floating-point output (runtime.verification.outputs)
    at = first_float(first)
    if at is None or rows(first[at]).shape[0] != 1:
        why = "no floating-point output" if at is None else f"output {at} has shape {list(first[at].shape)}"
        raise EtforgeError(
            f"--data {data.source}: top-1 accuracy needs one row of class scores per sample, "
            f"the model's first floating-point output; {why}"
        )

    def scores(i: int) -> torch.Tensor:
        with torch.no_grad():
            return rows(flatten(float_ep, float_fn(sample(i)))[at])

    classes = scores(0).shape[1]
    if int(data.y.max()) >= classes:
        bad = int((data.y >= classes).nonzero()[0])
        raise EtforgeError(
            f"--data {data.source}: label {int(data.y[bad])} at sample {bad} is out of range for the "
            f"model's {classes} outputs (labels 0..{classes - 1})"
        )
    right_f = right_c = 0
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # batch-1 ops: a thread pool costs more than it gives
    try:
        for i in range(len(data.y)):
            label = int(data.y[i])
            right_f += int(int(scores(i).argmax(1)) == label)
            right_c += int(int(rows(run_program(program, (sample(i),), kernels)[at]).argmax(1)) == label)
    finally:
        torch.set_num_threads(threads)
    n = len(data.y)
    return Accuracy(n, 100.0 * right_f / n, 100.0 * right_c / n)
