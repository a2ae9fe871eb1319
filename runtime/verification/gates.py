"""The plugins' verify gates (``etforge_verify_gates``), run after the built-in ones.

A gate is one class (``etforge.sdk.VerifyGate``) and its registration (a plugin's
``etforge_verify_gates`` hook): ``verify`` gives it a ``GateInput`` and adds its verdict's
failures and notes to the result, one progress step per gate. A gate that raises is a bug in
the gate, not a failing model: verify fails with one line naming the gate and its plugin.
"""

from __future__ import annotations

from typing import Any

from etforge.core.common.errors import EtforgeError
from etforge.core.contracts.verify_gate import GateInput
from etforge.core.registry.manager import Registry
from etforge.runtime.verification.verify_steps import Steps


def run_gates(given: GateInput, result: Any, steps: Steps, reg: Registry) -> None:
    """Each registered gate's verdict on ``given``, added to ``result`` (a ``Verification``)."""
    for name, gate in reg.verify_gates.items():
        with steps.step(f"gate:{name}", gate.description or f"gate {name}") as done:
            try:
                verdict = gate.check(given)
            except Exception as exc:
                raise EtforgeError(
                    f"verify gate {name!r} ({reg.owner_label(gate)}) raised {type(exc).__name__}: {exc}"
                ) from None
            result.failures.extend(f"{name}: {line}" for line in verdict.failures)
            result.notes.extend(f"{name}: {line}" for line in verdict.notes)
            done["line"] = verdict.line or (
                f"gate {name}: "
                + ("passed" if not verdict.failures else f"{len(verdict.failures)} failure(s)")
            )
