"""Layout algebra: a stored LiteRT tensor is the logical (Edge, NCHW) tensor permuted by ``perm``.

``stored = logical.permute(perm)``. Converters ask for the layout they need; a TRANSPOSE
is materialized only where the stored and wanted layouts differ, so a permute in the model
relabels the layout instead of moving data.
"""

from __future__ import annotations

from collections.abc import Sequence

Perm = tuple[int, ...]


def identity(rank: int) -> Perm:
    return tuple(range(rank))


def channels_last(rank: int) -> Perm:
    """NCHW -> NHWC (and N C L -> N L C, N C D H W -> N D H W C)."""
    if rank < 3:
        return identity(rank)
    return (0, *range(2, rank), 1)


def inverse(perm: Sequence[int]) -> Perm:
    out = [0] * len(perm)
    for i, p in enumerate(perm):
        out[p] = i
    return tuple(out)


def compose(first: Sequence[int], then: Sequence[int]) -> Perm:
    """x.permute(first).permute(then) == x.permute(compose(first, then))."""
    return tuple(first[i] for i in then)


def transpose_between(stored: Sequence[int], wanted: Sequence[int]) -> Perm:
    """The TRANSPOSE perm taking data stored as ``stored`` to ``wanted``."""
    inv = inverse(stored)
    return tuple(inv[w] for w in wanted)


def apply(shape: Sequence[int], perm: Sequence[int]) -> tuple[int, ...]:
    return tuple(int(shape[p]) for p in perm)


def stored_axis(perm: Sequence[int], logical_axis: int) -> int:
    return list(perm).index(logical_axis)


def is_identity(perm: Sequence[int]) -> bool:
    return all(i == p for i, p in enumerate(perm))


def is_trivial(shape: Sequence[int], perm: Sequence[int]) -> bool:
    """True when the permutation only moves size-1 dims: same bytes in both layouts."""
    moved = [p for p in perm if shape[p] != 1]
    return moved == sorted(moved)
