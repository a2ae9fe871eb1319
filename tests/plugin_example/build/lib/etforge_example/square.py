"""A graph rewrite in one file: ``x ** 2`` (``aten.pow.Tensor_Scalar(x, 2)``) as ``x * x``.

No LiteRT converter takes ``pow``; every NPU takes ``mul``. The rewrite runs on the float
ATen program before quantization, so the quantizer and the converters see the ``mul``.
"""

from etforge.sdk import Rewrite, call, calls, hookimpl


class SquareAsMul(Rewrite):
    description = "pow(x, 2) -> mul(x, x)"

    def apply(self, gm, target) -> bool:  # noqa: ANN001
        import torch

        changed = False
        for node in calls(gm, torch.ops.aten.pow.Tensor_Scalar):
            x, exponent = node.args
            if exponent != 2:
                continue
            node.replace_all_uses_with(call(gm, torch.ops.aten.mul.Tensor, (x, x), node))
            changed = True
        return changed


@hookimpl
def etforge_rewrites() -> list[Rewrite]:
    return [SquareAsMul()]
