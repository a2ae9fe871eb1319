"""A forward that reads a buffer it also updates (a running state) is refused, by name.

``torch.export`` turns the update into a buffer-mutation output, and the read into a read of
the buffer's value *before* the call: each call's result depends on the calls before it.
Quantization reads such a buffer as a constant (torchao folds its quantize), the Edge
verifier and the lowering expect a mutation to be a program input written back, and verify
replays calls independently, so no stage could compile it exactly; every one of them failed
with an unrelated error (``a leaf Variable that requires grad``, ``Expected output node``,
``Mutation node … is neither a buffer nor a user input``). A buffer that is written before it
is read (a cache of this call's value, ``tests/test_inplace.py``'s ``KeepsLast``) has no such
dependence and compiles.
"""

from __future__ import annotations

from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from etforge.core.common.errors import EtforgeError


def refuse_running_state(ep: ExportedProgram, what: str = "the model") -> None:
    """Raise :class:`EtforgeError` naming the first buffer ``ep`` reads and updates."""
    mutated = {s.target for s in ep.graph_signature.output_specs if s.kind == OutputKind.BUFFER_MUTATION}
    if not mutated:
        return
    placeholders = {n.name: n for n in ep.graph.find_nodes(op="placeholder")}
    for spec in ep.graph_signature.input_specs:
        if spec.kind != InputKind.BUFFER or spec.target not in mutated:
            continue
        node = placeholders.get(spec.arg.name)
        readers = [u.name for u in node.users] if node is not None else []
        if readers:
            raise EtforgeError(
                f"{what} reads buffer {spec.target!r} and updates it in forward (a running state: "
                f"each call depends on the calls before it; read by {', '.join(readers[:3])}); "
                "etforge compiles stateless inference: pass the state in as an input and return "
                "the new one, or leave it unchanged in eval mode"
            )
