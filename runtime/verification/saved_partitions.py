"""The compile's NPU partitions as ``verify``'s rebuild takes them: converted once, by the compile.

``verify`` lowers ``quantized.pt2`` again to get the Edge program it runs, and the lowering
converts each NPU partition to LiteRT. The compile already did, and wrote the result to
``partitions/NAME.tflite``, whose sha256 ``report.json`` records (``files_sha256``, checked
before this runs: ``artifact.check_hashes``). So by default the rebuild takes those bytes as
each partition's conversion (``core.lower.npu_backend.given_conversions``) instead of running
the converters again; what the program computes with them is still judged value by value
(the NPU ops against their device-exact references built from the Edge ops of
``quantized.pt2``, the whole output against the device simulation, ``model.pte`` against the
Edge program, its payloads against these files byte for byte). ``verify --reconvert`` runs
the converters again and requires their bytes to equal the files (a converter that is not
deterministic, or an etforge that converts differently from the one that compiled).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from etforge.core.build import output
from etforge.core.litert.convert import Converted


def conversions(out: Path, report: dict[str, Any]) -> dict[str, Converted]:
    """Each partition of ``report`` whose hash-checked file is in ``out``, as its conversion:
    the file's bytes, the dim orders and per-op record ``report.json`` keeps for it. A partition
    whose file or record is missing is left out (the rebuild converts it, and the comparison
    with the file names what is wrong)."""
    hashed = report.get(output.FILES_KEY) or {}
    given: dict[str, Converted] = {}
    for entry in report.get("partitions") or []:
        name, rel = entry.get("name"), entry.get("tflite")
        path = out / str(rel)
        # only a file the hash chain vouches for (an older report records no hashes: convert)
        if not name or not rel or rel not in hashed or not path.is_file():
            continue
        ops = sorted(entry.get("ops") or [], key=lambda o: o["index"])
        given[str(name)] = Converted(
            tflite=path.read_bytes(),
            debug_map={o["index"]: list(o["debug_handles"]) for o in ops if o.get("debug_handles")},
            op_nodes={o["index"]: list(o["nodes"]) for o in ops},
            operators=[str(o["op"]) for o in ops],
            input_names=[],
            output_names=[],
            input_dim_orders=[tuple(d) for d in entry.get("input_dim_orders") or []],
            output_dim_orders=[tuple(d) for d in entry.get("output_dim_orders") or []],
        )
    return given
