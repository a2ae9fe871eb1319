"""runtime/ is four rooms by role with doors one way (``etforge.runtime.ROOMS``): arithmetic,
execution, verification, firmware — each imports only from the rooms before it — and no
module of runtime/ takes part in an import cycle. Like core's walk (``tests/test_layers.py``,
whose import reader this uses), imports inside functions count and ``TYPE_CHECKING`` ones
(annotations only) do not. A CPU library's own code lives with its plugin: runtime reaches it
through the CPU backend contract, never by importing a plugin."""

from __future__ import annotations

from pathlib import Path

from test_layers import _imports

from etforge.runtime import ROOMS

from support import REPO

RUNTIME = REPO / "runtime"
#: Built on runtime, or a plugin's own business: runtime never imports them.
ABOVE = ("etforge.plugins", "etforge.cli", "etforge.api", "etforge.sdk", "etforge.testing", "etforge.qat")
#: Known imports of plugin modules left in runtime/firmware (issues 45/46 own those files):
#: (file, module) -> why it is still there. The goal is an empty table.
LEFT: dict[tuple[str, str], str] = {
    (
        "runtime/firmware/build.py",
        "etforge.plugins.targets.tflm_arena",
    ): "TFLM arena sizing for host-only partitions",
    (
        "runtime/firmware/conformance.py",
        "etforge.plugins.targets.dim_orders",
    ): "the conformance programs' dim-order pass",
}


def _module(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(("etforge", *parts[: -1 if parts[-1] == "__init__" else None]))


def _room(path: Path) -> str:
    return path.relative_to(RUNTIME).parts[0]


def _files() -> list[Path]:
    return [p for p in sorted(RUNTIME.rglob("*.py")) if p.parent != RUNTIME]


def test_every_module_lives_in_a_room_with_a_door_sign() -> None:
    import ast

    loose = sorted(p.name for p in RUNTIME.glob("*.py") if p.name != "__init__.py")
    assert not loose, f"modules outside any room of runtime/: {loose}"
    rooms = sorted(p.name for p in RUNTIME.iterdir() if (p / "__init__.py").is_file())
    assert rooms == sorted(ROOMS), f"runtime packages {rooms} != ROOMS {sorted(ROOMS)}"
    for room in ROOMS:
        doc = ast.get_docstring(ast.parse((RUNTIME / room / "__init__.py").read_text()))
        assert doc, f"runtime/{room}/__init__.py: say what the room is (its docstring is the door sign)"


def test_each_room_imports_only_from_the_rooms_before_it() -> None:
    rank = {room: i for i, room in enumerate(ROOMS)}
    wrong = []
    for path in _files():
        room, rel = _room(path), str(path.relative_to(REPO))
        for line, module in _imports(path):
            where = f"{rel}:{line}"
            if module == "relative":
                wrong.append(f"{where}: a relative import (write etforge.runtime.<room>.<module>)")
            elif module.startswith(ABOVE) and (rel, module) not in LEFT:
                wrong.append(f"{where}: imports {module} (runtime asks plugins through the contracts)")
            elif module.startswith("etforge.runtime"):
                other = module.split(".")[2] if module.count(".") >= 2 else ""
                if other not in rank:
                    wrong.append(f"{where}: imports {module}, not in a room")
                elif rank[other] > rank[room]:
                    wrong.append(f"{where}: {room} imports {module} from a later room ({other})")
    assert not wrong, "imports against the room order:\n" + "\n".join(wrong)


def test_the_left_overs_are_still_there() -> None:
    """Each entry of ``LEFT`` still names an import that exists (a fixed one leaves the table)."""
    for (rel, module), why in LEFT.items():
        assert module in {m for _, m in _imports(REPO / rel)}, (
            f"{rel} no longer imports {module} ({why}): remove it"
        )


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in _files():
        mine = _module(path)
        targets = graph.setdefault(mine, set())
        for _, module in _imports(path):
            if module.startswith("etforge.runtime.") and module != mine:
                targets.add(module)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (module -> modules it imports), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def test_no_module_of_runtime_is_in_an_import_cycle() -> None:
    cycle = _cycle(_graph())
    assert cycle is None, "an import cycle in runtime/: " + " -> ".join(cycle or [])


def test_the_cycle_finder_finds_one() -> None:
    """The checker itself: runtime's cycle before issue 44 (device_ref <-> device_ref_nonlinear),
    a chain without one, and a three-module loop."""
    assert _cycle({"a.device_ref": {"a.nonlinear"}, "a.nonlinear": {"a.device_ref"}}) is not None
    assert _cycle({"v.verify": {"v.outputs"}, "v.outputs": {"v.reference"}, "v.reference": set()}) is None
    assert _cycle({"v.verify": {"v.outputs"}, "v.outputs": {"v.x"}, "v.x": {"v.verify"}}) == [
        "v.outputs", "v.x", "v.verify", "v.outputs"
    ]  # fmt: skip
