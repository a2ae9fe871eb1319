"""What ``etforge verify`` defers besides the imports compile defers: torchao's package inits,
and Inductor's decomposition table that torchao's op registration imports (:class:`_Decompositions`).

ExecuTorch imports ``torchao`` for its quantize primitives (``executorch.exir.operator.util``
reads ``torch.ops.torchao.{quantize,dequantize,choose_qparams}_affine``) and the Arm and
Cortex-M quantizers import a few of torchao's PT2E modules; a host run reads nothing else of
it. ``torchao``'s and ``torchao.quantization``'s ``__init__`` import the whole library (its
optimizers, dtypes, quantization API: 98 modules), 0.27 CPU s of every verify (MobileNetV2-96,
in one process each, the same imports with and without). Deferred
(``core.common.lazy_imports.defer_package_inits``), they stay stand-ins whose submodules import
as usual and whose any other name runs the ``__init__`` in full; the one module that defines
the ops ExecuTorch reads is imported at once, as the ``__init__`` would have.

The ops a deferred ``__init__`` would have registered besides (torchao's C++ ops, none in a
program etforge compiles) are registered when a program fails to load: :func:`undefer` runs the
``__init__`` in full, and the load is tried again (``runtime.verification.verify._programs``).
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from etforge.core.common import lazy_imports

#: torchao's packages whose ``__init__`` verify defers (in this order: parent first).
VERIFY_DEFERRED_INITS = ("torchao", "torchao.quantization")
#: What those ``__init__`` s import that registers ops ExecuTorch reads at import.
_OPS = "torchao.quantization.quant_primitives"
#: Inductor's decomposition table, which torchao's op registration imports for one function.
DECOMPOSITIONS = "torch._inductor.decomposition"


class _Decompositions(lazy_imports.Deferred):
    """Stands in for Inductor's decomposition module while nothing reads it but torchao's op
    registration: its import builds torch's whole core-ATen decomposition table (0.13 CPU s),
    which only an Inductor compile reads, and verify compiles nothing. The decompositions
    registered meanwhile are kept, and registered in the real module when anything reads it
    (any other attribute imports it: ``lazy_imports.Deferred``)."""

    def __init__(self) -> None:
        super().__init__(DECOMPOSITIONS)
        self._etforge_pending: list[tuple[Any, Callable[..., Any]]] = []

    def register_decomposition(self, ops: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            self._etforge_pending.append((ops, fn))
            return fn

        return register

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(_real_decompositions(), name)


def _real_decompositions() -> types.ModuleType:
    """The real decomposition module in the stand-in's place, with what it kept registered."""
    held = sys.modules.get(DECOMPOSITIONS)
    real = lazy_imports.load(DECOMPOSITIONS)
    if not isinstance(held, _Decompositions):
        return real
    for ops, fn in held._etforge_pending:
        # built after the ops were defined, the table holds torch's generic decomposition of
        # each (a CompositeImplicitAutograd op): the registration made before it replaces it
        for packet in ops if isinstance(ops, list) else [ops]:
            for name in packet.overloads() if hasattr(packet, "overloads") else []:
                real.decompositions.pop(getattr(packet, name), None)
        real.register_decomposition(ops)(fn)
    held._etforge_pending.clear()
    return real


def defer() -> list[str]:
    """Defer ``VERIFY_DEFERRED_INITS`` (those not imported yet); returns those deferred."""
    import importlib
    import importlib.util

    try:
        if importlib.util.find_spec("torchao") is None:
            return []
    except (ImportError, ValueError):
        return []
    deferred = lazy_imports.defer_package_inits(VERIFY_DEFERRED_INITS)
    if deferred:
        if DECOMPOSITIONS not in sys.modules:
            lazy_imports.install_stand_in(_Decompositions())  # its parent may be a stand-in (deferred_dynamo)
        importlib.import_module(_OPS)
    return deferred


def undefer() -> bool:
    """Run each deferred ``__init__`` of ``VERIFY_DEFERRED_INITS`` in full (every op the
    library registers); True if one was still deferred."""
    ran = [lazy_imports.run_deferred_init(name) for name in VERIFY_DEFERRED_INITS]
    return any(ran)


#: The programs loaded again after :func:`undefer` and not yet told (:func:`take_reload_notes`).
_RELOADED: list[str] = []


def take_reload_notes() -> list[str]:
    """A note for each program :func:`load_program` loaded again since the last call, which
    empties the list: every retry is told once, by the verification that follows it (a
    script's ``--quantized`` program included, loaded before its ``verify`` starts)."""
    notes = [
        f"{Path(path).name}: loaded again after torchao's package init ran in full (an op only it registers)"
        for path in _RELOADED
    ]
    _RELOADED.clear()
    return notes


def load_program(path: Any) -> Any:
    """``core.front.load.load_program``; where it fails while an ``__init__`` is deferred (an
    op only that ``__init__`` registers), loaded again after :func:`undefer`."""
    from etforge.core.front.load import load_program as load

    try:
        return load(path)
    except RuntimeError:  # torch.export.load's, an op it could not resolve among them
        if not undefer():
            raise
        program = load(path)
        _RELOADED.append(str(path))
        return program
