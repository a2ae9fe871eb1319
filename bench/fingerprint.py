"""Fingerprint every compile output: the zoo and the architecture suite on every target.

Run: OMP_NUM_THREADS=1 .venv/bin/python bench/fingerprint.py OUT.json [--models ...] [--families ...]
                                                                      [--targets ...]
     .venv/bin/python bench/fingerprint.py --diff BEFORE.json AFTER.json

A refactor that should change no behaviour (issue 44) is checked by fingerprinting before and
after it: each model x target is compiled by the command line's own path (``etforge compile
--no-cache``, one process each, so no state carries between compiles) into one fixed
directory, and every file written there (``model.pte``, partitions' ``.tflite``, the ``.pt2``
programs, generated C/CMake/YAML, ``report.json``) gets a sha256. ``--diff`` prints the files
that differ and exits 1 if any does.

Nothing is skipped whole. ``report.json`` is hashed with its ``stages`` field removed: those are
wall-clock seconds per stage, different on every run; and without the raw sha256 of the
``.pt2`` files in ``files_sha256``: ``quantized.pt2`` holds torch's node provenance, whose
``graph_id`` was a memory address before session 59 (two runs of one tree differed there), so each
``.pt2`` is hashed member by member with ``graph_id`` zeroed and its derived
``serialization_id`` left out (``--raw-pt2``: byte for byte). Every other field is kept. A compile that fails is fingerprinted by its exit code and
error line, so a changed refusal shows too.

Run both fingerprints from the same path: ``float.pt2`` and ``quantized.pt2`` record the
source file of each node (the model's and etforge's own modules, by absolute path), so the
same tree at another path gives other bytes. To fingerprint a second tree while the first
stays where it is, mount it over the first's path in a private mount namespace::

    unshare -m --propagation private sh -c 'mount --bind AFTER BEFORE && PYTHONPATH=BEFORE ...'
 The architecture families are compiled through
factories defined below (``family_<name>``), which the CLI loads as ``this_file.py:factory``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

TARGETS = ("imxrt700", "imxrt700cm", "cortex-m33", "litert")
#: report.json fields that hold wall-clock timings (removed before hashing, never compared).
TIMING_FIELDS = ("stages",)


def _families() -> Any:
    """tests/models/architectures.py of the etforge package imported (the tree under test)."""
    import etforge

    tests = str(Path(etforge.__file__).resolve().parent / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    from models import architectures

    return architectures


def __getattr__(name: str) -> Any:
    """``family_<name>``: a CLI factory returning (model, example inputs, calibration)."""
    if name.startswith("family_"):
        family = name[len("family_") :]
        arch = _families()
        if family in arch.FAMILIES:
            return lambda: arch.build(family)
    raise AttributeError(name)


#: In a ``.pt2``, torch's node provenance (``from_node``) records ``graph_id``: ``id()`` of a
#: graph object, a memory address that differs from run to run of the same tree; and
#: ``serialization_id`` is derived from the bytes. Both are normalised (``--raw-pt2``: not).
_GRAPH_ID = re.compile(rb'(graph_id\\?": )\d+')


def pt2_digest(path: Path) -> str:
    """sha256 over a ``.pt2``'s members, ``graph_id`` zeroed and ``serialization_id`` left out."""
    digest = hashlib.sha256()
    with zipfile.ZipFile(path) as archive:
        for name in sorted(archive.namelist()):
            if name.endswith(".data/serialization_id"):
                continue
            data = archive.read(name)
            if name.endswith(".json"):
                data = _GRAPH_ID.sub(rb"\g<1>0", data)
            digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    return digest.hexdigest()


def file_digest(path: Path, raw_pt2: bool = False) -> str:
    data = path.read_bytes()
    if path.suffix == ".pt2" and not raw_pt2:
        return pt2_digest(path)
    if path.name == "report.json":
        report = json.loads(data)
        for field in TIMING_FIELDS:
            report.pop(field, None)
        if not raw_pt2:  # the .pt2 files' raw hashes (each .pt2 is fingerprinted itself)
            files = report.get("files_sha256") or {}
            report["files_sha256"] = {k: v for k, v in files.items() if not k.endswith(".pt2")}
        data = json.dumps(report, sort_keys=True).encode()
    return hashlib.sha256(data).hexdigest()


def compile_one(spec: str, target: str, out: Path, raw_pt2: bool = False) -> dict[str, str]:
    if out.exists():
        shutil.rmtree(out)
    cmd = [sys.executable, "-m", "etforge", "compile", spec, "-t", target, "-o", str(out), "--no-cache", "-q"]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode != 0:
        lines = [ln for ln in done.stderr.splitlines() + done.stdout.splitlines() if ln.strip()]
        return {"<exit>": str(done.returncode), "<error>": lines[-1] if lines else ""}
    return {str(p.relative_to(out)): file_digest(p, raw_pt2) for p in sorted(out.rglob("*")) if p.is_file()}


def diff(before: dict[str, dict[str, str]], after: dict[str, dict[str, str]]) -> int:
    bad = 0
    for key in sorted(set(before) | set(after)):
        b, a = before.get(key, {}), after.get(key, {})
        for name in sorted(set(b) | set(a)):
            if b.get(name) != a.get(name):
                bad += 1
                print(f"DIFFERS {key} {name}: {b.get(name)} -> {a.get(name)}")
    files = sum(len(v) for v in after.values())
    print(f"{len(after)} compiles, {files} files, {bad} differ")
    return 1 if bad else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", help="the JSON to write")
    parser.add_argument("--diff", nargs=2, metavar=("BEFORE", "AFTER"))
    parser.add_argument("--models", default=None, help="zoo models (default: all)")
    parser.add_argument("--families", default=None, help="architecture families (default: all)")
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--workdir", default="/tmp/etforge-fingerprint")
    parser.add_argument(
        "--raw-pt2", action="store_true", help="hash .pt2 files byte for byte (see _GRAPH_ID)"
    )
    parser.add_argument("--families-first", action="store_true", help="compile the families before the zoo")
    args = parser.parse_args()
    if args.diff:
        before, after = (json.loads(Path(p).read_text()) for p in args.diff)
        return diff(before, after)
    if not args.out:
        parser.error("give OUT.json or --diff BEFORE AFTER")
    from etforge import zoo

    models = args.models.split(",") if args.models else list(zoo.ZOO)
    families = args.families.split(",") if args.families else list(_families().FAMILIES)
    specs = [f"zoo:{m}" for m in models] + [f"{Path(__file__).resolve()}:family_{f}" for f in families]
    if args.families_first:
        specs = specs[len(models) :] + specs[: len(models)]
    out = Path(args.workdir)
    result: dict[str, dict[str, str]] = {}
    for spec in specs:
        for target in args.targets.split(","):
            key = f"{spec.rsplit('/', 1)[-1]} @ {target}"
            result[key] = compile_one(spec, target, out, args.raw_pt2)
            print(key, len(result[key]), "files", flush=True)
            Path(args.out).write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
