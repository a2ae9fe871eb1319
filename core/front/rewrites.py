"""The target's graph rewrites on the float program, before quantization.

A rewrite plugin changes the model's idioms into ops the NPU has; a rewrite that raises or
leaves a broken graph is an error naming it and its plugin."""

from __future__ import annotations

import torch
from torch.export import ExportedProgram

from etforge.core.common import fallbacks
from etforge.core.common.errors import EtforgeError
from etforge.core.contracts.target import TargetSpec
from etforge.core.registry.manager import Registry, registry


def rewrite(
    ep: ExportedProgram, target: TargetSpec, reg: Registry | None = None
) -> tuple[ExportedProgram, list[str]]:
    """Run the target's graph rewrites (``etforge_rewrites``) on the float program.

    Returns the rewritten program (``ep`` itself when nothing changed), built from the graph
    as a re-export would give it (``core/graph/program.py``, else re-exported), and the
    names of the rewrites that changed the graph. A rewrite that raises or leaves a broken graph is
    an :class:`EtforgeError` naming it and its plugin.
    """
    from etforge.core.contracts.rewrite import annotate_values

    reg = reg or registry()
    rewrites = [r for r in reg.rewrites_for(target) if r.stage == "export"]
    if not rewrites:
        return ep, []
    example = tuple(ep.example_inputs[0])
    gm = ep.module(check_guards=False)
    annotate_values(gm, example)
    applied: list[str] = []
    for rw in rewrites:
        try:
            changed = bool(rw.apply(gm, target))
            if changed:
                gm.graph.eliminate_dead_code()
                gm.graph.lint()
                gm.recompile()
                annotate_values(gm, example)
        except EtforgeError:
            raise
        except Exception as exc:
            label = reg.owner_label(rw) if hasattr(reg, "owner_label") else reg.owner(rw)
            first = (str(exc).strip().splitlines() or [""])[0]
            raise EtforgeError(
                f"graph rewrite {rw.name} ({label}) failed on {target.name}: {type(exc).__name__}: {first}"
            ) from None
        if changed:
            applied.append(rw.name)
    # The graph module's node cycles would keep every real activation alive until the
    # collector's next full pass; the re-export below computes its own values.
    for node in gm.graph.nodes:
        node.meta.pop("val", None)
    if not applied:
        return ep, []
    from etforge.core.graph.program import Unsupported, program_from_graph

    try:  # the program the re-export would give, without re-tracing every node
        return program_from_graph(gm, ep, example), applied
    except Unsupported as exc:
        fallbacks.record(
            "rewrite",
            "re-exported the rewritten program with torch.export (slower)",
            ", ".join(applied),
            str(exc),
        )
    try:
        return torch.export.export(gm, example, strict=False), applied
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        raise EtforgeError(
            f"torch.export rejected the model after rewrites {', '.join(applied)}: {type(exc).__name__}: {first}"
        ) from None
