"""The program serializers' ``import torch._inductor.ir``, answered without importing Inductor.

torch's and ExecuTorch's serializers import ``torch._inductor.ir`` on every argument they
serialize, only to ask ``isinstance(arg, ir.Buffer / ir.ReinterpretView / ir.TorchBindObject)``
(arguments of AOTInductor's graphs). A compile never imports Inductor, so each forked writer
of ``float.pt2``, ``quantized.pt2`` and ``lowered_edge.exir`` imported it itself: four modules,
0.12 CPU s and 6,400 page faults per child on resnet18 (a quarter of what its file costs).

While no ``torch._inductor.ir`` is imported, no object of its classes can exist, so every such
``isinstance`` is False. :func:`stand_in` puts a module in its place whose every class is one
nothing is an instance of (and that refuses to be instantiated), for the length of a block; a
process that has imported the real module keeps it. The bytes written are the same.

Only for a single-threaded process (a forked writer): ``sys.modules`` is the process's, so
another thread importing Inductor inside the block would get the stand-in.
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Iterator
from typing import Any

_NAME = "torch._inductor.ir"


class _Never(type):
    """A class no object is an instance of, and that cannot be instantiated."""

    def __instancecheck__(cls, obj: Any) -> bool:
        return False

    def __subclasscheck__(cls, sub: type) -> bool:
        return sub is cls

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"{_NAME}.{cls.__name__} is not imported in this process (a stand-in)")


class _StandIn(types.ModuleType):
    """``torch._inductor.ir`` as a module of :class:`_Never` classes, made as they are asked for."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        made = _Never(name, (), {"__module__": _NAME})
        setattr(self, name, made)
        return made


@contextlib.contextmanager
def stand_in() -> Iterator[None]:
    """Inside the block, ``import torch._inductor.ir`` gives the stand-in unless it was imported."""
    if _NAME in sys.modules:
        yield
        return
    module = sys.modules[_NAME] = _StandIn(_NAME, "a stand-in: etforge.core.serialize.inductor_stand_in")
    try:
        yield
    finally:
        if sys.modules.get(_NAME) is module:
            del sys.modules[_NAME]
