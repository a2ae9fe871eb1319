"""``etforge zoo-data``: a trained zoo model's held-out test split as ``.npz``."""

from __future__ import annotations

import os

import click

from etforge.cli.common import (
    console,
)
from etforge.core.common.errors import EtforgeError


@click.command(name="zoo-data")
@click.argument("model")
@click.argument("path", type=click.Path(dir_okay=False))
def zoo_data(model: str, path: str) -> None:
    """Write the held-out test split of trained zoo MODEL (e.g. digits_cnn) to PATH (.npz: x, y)."""
    import numpy as np

    from etforge.zoo import digits

    name = model.removeprefix("zoo:")
    if name not in digits.CONFIGS:
        raise EtforgeError(
            f"zoo model {name!r} has no held-out data; trained zoo models: {', '.join(sorted(digits.CONFIGS))}"
        )
    if not path.endswith(".npz"):
        raise EtforgeError(f"{path}: zoo-data writes a .npz file")
    x, y = digits.test_data(name)
    tmp = f"{path}.tmp.npz"
    np.savez(tmp, x=x.numpy(), y=y.numpy())
    os.replace(tmp, path)  # never a half-written file under the final name
    console.print(f"wrote {path}: x {list(x.shape)} float32, y {list(y.shape)} int64 ({len(y)} test samples)")
