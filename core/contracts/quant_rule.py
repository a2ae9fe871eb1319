"""Quantizer rules: declarative PT2E annotation patterns contributed by op plugins."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch.fx import Node

KINDS = ("weighted", "io", "shared", "fixed", "custom")


@dataclass(frozen=True)
class QuantRule:
    """How the ATen ops in ``ops`` are quantized.

    kind:
      * ``weighted``: input 0 per-tensor activation, input 1 per-channel symmetric weight
        (``weight_axis``), input 2 int32 bias with scale ``in_scale * w_scale``.
      * ``io``: every tensor input and the output get their own per-tensor qparams.
      * ``shared``: the output and all tensor inputs share the first input's qparams
        (LiteRT requires equal in/out quantization, e.g. max pool, reshape, cat).
      * ``fixed``: inputs per-tensor, output fixed at ``fixed = (scale, zero_point)``.
      * ``custom``: ``annotate(node, specs) -> bool`` does it (``specs`` holds the
        scheme's activation/weight/bias specs); return False to leave the node alone.
    ``fuse``: activation ops that, as the single user, share this op's output observer.
    ``fusable``: on an activation's own rule, which of its nodes may be fused that way
    (e.g. a clamp only with bounds the converter can fold); None: every node.
    ``inputs``: positional args quantized (default: all tensor args).
    """

    ops: tuple[str, ...]
    kind: str = "io"
    scheme: str = "int8"
    weight_axis: int = 0
    fuse: tuple[str, ...] = ()
    fixed: tuple[float, int] | None = None
    inputs: tuple[int, ...] | None = None
    annotate: Callable[[Node, Any], bool] | None = None
    priority: int = 0
    fusable: Callable[[Node], bool] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.ops, str):
            raise ValueError(f"QuantRule ops must be a tuple of op names, got the string {self.ops!r}")
        if self.kind not in KINDS:
            raise ValueError(f"QuantRule kind {self.kind!r} not in {KINDS}")
        if self.kind == "fixed" and self.fixed is None:
            raise ValueError("QuantRule(kind='fixed') needs fixed=(scale, zero_point)")
        if self.kind == "custom" and self.annotate is None:
            raise ValueError("QuantRule(kind='custom') needs annotate=")

    def describe(self) -> dict[str, Any]:
        return {"ops": list(self.ops), "kind": self.kind, "scheme": self.scheme, "fuse": list(self.fuse)}
