"""Verify gates: a judgement ``etforge verify`` makes of a compile, added by a plugin.

``etforge verify`` runs its built-in gates (runtime/verification: the hash chain, the payload
bytes, each NPU and CPU op against its device-exact reference, the whole-program simulation,
``model.pte`` against the Edge program, top-1 and accuracy), then every gate the loaded
plugins return from ``etforge_verify_gates``, in plugin order. A new gate is one class and
its registration; what it finds is a failure line (verify fails) or a note.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class GateInput:
    """What a gate judges: the compile in ``out`` as ``verify`` read and ran it."""

    #: The compile's output directory (``model.pte``, ``report.json``, the side files).
    out: Path
    #: ``report.json``, as loaded (its hash chain already checked).
    report: dict[str, Any]
    #: The lowered program rebuilt from the output's program file (what ``model.pte`` holds).
    program: Any
    #: ``model.pte`` in the host interpreter (``runtime.execution.pte_interpreter.PteInterpreter``):
    #: ``run(inputs)`` gives its outputs, ``program`` its flatbuffer.
    pte: Any
    #: The seeded input batches ``verify`` ran (one tuple of tensors per sample).
    inputs: list[tuple[Any, ...]]
    #: The Edge program's outputs per sample (one list of tensors per batch of ``inputs``).
    edge_outputs: list[list[Any]]


@dataclass
class GateVerdict:
    """A gate's answer: ``failures`` fail ``verify`` (one line each, naming what is wrong),
    ``notes`` are told; ``line`` is the one-line summary ``verify`` prints for the step."""

    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    line: str = ""


class VerifyGate:
    """Base class: one judgement of a compile. ``name`` identifies it (unique over the plugins),
    ``description`` is what ``verify`` prints while it runs."""

    name: str = ""
    description: str = ""

    def check(self, given: GateInput) -> GateVerdict:
        """Judge the compile; raise nothing for a failing model (return failures), only for a
        bug in the gate itself (``verify`` then fails naming the gate's plugin)."""
        raise NotImplementedError
