"""The compile's stages as plain functions, in order, each from the stage package that owns it:
export (front), rewrite (front), quantize (quantize), lower (lower), serialize (serialize).

ExecuTorch does the heavy lifting (``to_edge_transform_and_lower`` decomposes once and
runs our partitioner and backend); these functions only wire plugins into it. The compile
session (``core.build.session``) calls them in order.
"""

from __future__ import annotations

from etforge.core.front.export import export
from etforge.core.front.rewrites import rewrite
from etforge.core.graph.utils import clone_program
from etforge.core.lower.driver import Partition, drop_dead_constants, edge_config, lower
from etforge.core.quantize.ptq import StackedQuantizer, quantize, quantizer_for
from etforge.core.quantize.quantizer import convert, prepare
from etforge.core.serialize.emit import serialize

__all__ = [
    "Partition",
    "StackedQuantizer",
    "clone_program",
    "convert",
    "drop_dead_constants",
    "edge_config",
    "export",
    "lower",
    "prepare",
    "quantize",
    "quantizer_for",
    "rewrite",
    "serialize",
]
