"""Every byte of a compile's output is the compiled one.

``verify`` runs the lowered program the compile saved (``lowered_edge.exir``,
``runtime.verification.saved_program``) or rebuilds it from ``quantized.pt2`` (its NPU
partitions the hash-checked ``partitions/*.tflite``, or converted again with ``--reconvert``:
``runtime.verification.saved_partitions``); this module checks that what it ran is what the
output holds:

* a hash chain: ``report.json`` records the sha256 of ``model.pte`` and of each side file
  (``float.pt2``, ``quantized.pt2``, ``lowered_edge.exir``, ``partitions/*``) — a file from another compile, or
  changed after it, is named;
* every delegate payload inside ``model.pte`` equals, byte for byte, the payload of its
  partition in the program verify runs (a flipped weight bit inside the NPU payload is found even when
  ``report.json``'s hash of ``model.pte`` was updated to match: the partition file's own hash
  still holds it to the compiled bytes);
* ``partitions/`` holds only files of this program's partitions.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from etforge.core.build import output
from etforge.core.build.output import FILES_KEY, record_hashes, side_files
from etforge.core.common.digest import sha256_file
from etforge.core.common.errors import EtforgeError

# record_hashes and side_files are the writer's half of the hash chain (core.build.output),
# re-exported beside the checks that read it.
__all__ = [
    "FILES_KEY",
    "check_hashes",
    "compare_payloads",
    "record_hashes",
    "side_files",
    "stray_partition_files",
]


def check_hashes(out: Path, report: dict[str, Any]) -> list[str]:
    """Side files against report.json's hashes; raises naming the first that does not belong.

    Returns notes (a report from before the hash chain: nothing to check against)."""
    recorded = report.get(FILES_KEY)
    if recorded is None:
        return [
            f"{out / output.REPORT} records no side-file hashes (an older compile): side files not hash-checked"
        ]
    for name, digest in sorted(recorded.items()):
        path = out / name
        if not path.is_file():
            raise EtforgeError(f"{path}: missing (report.json records it); recompile {out}")
        actual = sha256_file(path)
        if actual != digest:
            raise EtforgeError(
                f"{path} is not the file its report.json records (sha256 {actual[:12]}… != {digest[:12]}…): "
                f"from another compile or modified; recompile {out}"
            )
    return []


def stray_partition_files(out: Path, partition_names: Sequence[str]) -> list[str]:
    """Files in ``partitions/`` that belong to no partition of the program."""
    parts = out / output.PARTITIONS
    if not parts.is_dir():
        return []
    own = set()
    for name in partition_names:
        own |= {f"{name}.tflite", f"{name}_kernel_selection.c"}
    return [str(p) for p in sorted(parts.iterdir()) if p.name not in own]


def compare_payloads(
    pte_path: Path,
    program: Any,
    rebuilt: dict[str, bytes],
    notes: list[str] | None = None,
    saved: bool = False,
) -> list[str]:
    """Each delegate payload in ``model.pte`` (``program``: its deserialized form) against the
    rebuilt one of its partition (``saved``: the one in the compile's saved lowered program).
    ``rebuilt``: partition name -> processed bytes. Returns failures, one line each; a
    comparison that cannot be made here goes to ``notes``.

    A host-only payload (etforge's framing) names its partition. A device payload (the NPU
    compiler's own format, e.g. NeutronBackend's) names none: it is paired, in partition
    order, with a rebuilt partition left unmatched."""
    from etforge.core.litert import payload

    kind = "saved" if saved else "rebuilt"
    source = output.LOWERED_PROGRAM if saved else f"rebuilt from {output.QUANTIZED_PROGRAM}"
    found = [bytes(d.data) for d in program.backend_delegate_data]
    wanted = dict(rebuilt)
    rest = []
    for i, raw in enumerate(found):
        name = next((n for n, ref in wanted.items() if ref == raw), None)
        if name is not None:
            del wanted[name]
        else:
            rest.append((i, raw))
    failures = []
    for i, raw in rest:
        device = not raw.startswith(payload.MAGIC)
        name = _partition_of(raw, wanted, device)
        if name is None:
            failures.append(f"{pte_path}: delegate payload {i} is not the payload of any partition {source}")
            continue
        ref = wanted.pop(name)
        if device and ref.startswith(payload.MAGIC):
            (notes if notes is not None else failures).append(
                f"{pte_path}: delegate payload {i} (partition {name}) is NPU device code and the NPU "
                "compiler is not available here (the rebuild is host-only): not compared byte for byte, "
                f"only through {output.REPORT}'s sha256 of {output.PTE}"
            )
            continue
        at = next(
            (k for k, (a, b) in enumerate(zip(raw, ref, strict=False)) if a != b), min(len(raw), len(ref))
        )
        failures.append(
            f"{pte_path}: delegate payload {i} (partition {name}) differs from the {kind} partition at byte "
            f"{at:,} of {len(ref):,}: the program's NPU bytes are not the compiled ones; recompile"
        )
    for name in sorted(wanted):
        failures.append(f"{pte_path}: holds no payload of partition {name}")
    return failures


def _partition_of(raw: bytes, wanted: dict[str, bytes], device: bool) -> str | None:
    """The unmatched partition a payload that matched none is of (None: of none)."""
    from etforge.core.litert import payload

    if not device:
        try:
            name = payload.unpack(raw).partition
        except (ValueError, KeyError, TypeError):  # a damaged header: of no partition
            return None
        return name if name in wanted else None
    # Device code carries no partition name: the first unmatched partition rebuilt as device
    # code too, else (the NPU compiler did not run here) the first unmatched one.
    devices = [n for n, ref in wanted.items() if not ref.startswith(payload.MAGIC)]
    return next(iter(devices or wanted), None)
