"""Never write an artifact that does not load: a partition LiteRT refuses is a compile error.

A converter plugin installed as a distribution converts ReLU into an int8 RELU with a float32
output, which LiteRT's kernels refuse to prepare. ``etforge compile`` must fail naming the
partition, the LiteRT op and the node, and leave no output directory behind.
"""

from __future__ import annotations

from pathlib import Path

from support import run_cli, write_distribution

BROKEN = """
from etforge import hookimpl
from etforge.core.contracts.converter import OpConverter


class BrokenRelu(OpConverter):
    targets = ("neutron-c",)
    '''RELU from int8 to float32 (LiteRT needs one type on both sides), then QUANTIZE.'''

    ops = ("aten.relu.default",)
    priority = 100

    def fused_activation(self, node):
        return None  # not fused into the conv: this converter emits the op

    def convert(self, node, ctx):
        x = ctx.input(node.args[0])
        wrong = ctx.temp(x.stored_shape, "float32", "broken")
        ctx.emit("RELU", [x], [wrong])
        ctx.emit("QUANTIZE", [wrong], [ctx.output(node, x.perm)])


@hookimpl
def etforge_op_converters():
    return [BrokenRelu()]
"""

MODEL = """
import torch


def build():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.ReLU(),  # after the pool: quantized on both sides, not fused into the conv
        torch.nn.Flatten(),
        torch.nn.Linear(8, 4),
    ).eval()
    g = torch.Generator().manual_seed(1)
    calibration = [(torch.randn(1, 3, 8, 8, generator=g),) for _ in range(4)]
    return model, calibration[0], calibration
"""


def _compile_with(tmp_path: Path, module: str, source: str) -> tuple[str, Path]:
    """``etforge compile`` of MODEL with converter plugin ``module`` installed; (stderr, OUT)
    of a compile that must fail."""
    dist = module.replace("_", "-")
    plugins = write_distribution(tmp_path / "site", dist, "0.1", {module: module}, {module: source})
    model = tmp_path / "model.py"
    model.write_text(MODEL)
    out = tmp_path / "out"
    proc = run_cli(
        "compile", f"{model}:build", "--target", "imxrt700", "-o", str(out), "--no-cache", pythonpath=plugins
    )
    assert proc.returncode != 0, proc.stdout
    return proc.stderr, out


def test_partition_litert_refuses_is_a_compile_error_and_nothing_is_written(tmp_path: Path) -> None:
    message, out = _compile_with(tmp_path, "broken_relu", BROKEN)
    assert "LiteRT refuses" in message and "RELU" in message, message
    assert "from node relu" in message, message  # the node the op came from
    assert "INT8 != FLOAT32" in message, message  # LiteRT's own reason
    assert "Traceback" not in message
    assert not out.exists()


RESHAPE_TO_FLOAT = """
from etforge import hookimpl
from etforge.core.contracts.converter import OpConverter


class BrokenFlatten(OpConverter):
    targets = ("neutron-c",)
    '''RESHAPE from int8 to float32, then QUANTIZE: LiteRT prepares it; XNNPACK would copy an
    int8 buffer's bytes as floats at invoke.'''

    ops = ("aten.view_copy.default",)
    priority = 100

    def convert(self, node, ctx):
        from etforge.sdk import shape_of

        x = ctx.input(node.args[0], tuple(range(len(shape_of(node.args[0])))))
        wrong = ctx.temp(shape_of(node), "float32", "broken")
        ctx.reshape(x, wrong, shape_of(node))
        ctx.emit("QUANTIZE", [wrong], [ctx.output(node)])


@hookimpl
def etforge_op_converters():
    return [BrokenFlatten()]
"""


def test_a_data_movement_op_that_changes_the_element_type_is_a_compile_error(tmp_path: Path) -> None:
    message, out = _compile_with(tmp_path, "broken_flatten", RESHAPE_TO_FLOAT)
    assert "RESHAPE, from node" in message and "turns INT8 into FLOAT32" in message, message
    assert "Traceback" not in message
    assert not out.exists()
