"""A content-addressed build cache: an unchanged model recompiles by copying its last output.

The key hashes everything that determines the output bytes — the exported program (graph
code, signature, every weight and constant), the example and calibration tensors, the target,
its options and flags, the versions of etforge's own sources, of every plugin distribution
and of the stack (torch, executorch, torchao, LiteRT), and the NPU compiler's availability.
An entry is a directory of files plus a manifest of their SHA-256; a restore re-hashes every
file, and an entry that does not match (truncated, edited, half-written) is deleted and
rebuilt, never trusted. Direct mode (:mod:`etforge.core.cache.direct`) asks first, with a key
that needs no torch; what it finds is restored through the same checked :meth:`BuildCache.restore`.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from etforge.core.common import lazy_imports
from etforge.core.common.digest import sha256_file

#: Bump when the entry layout or the key's composition changes.
CACHE_FORMAT = 1
MANIFEST = "manifest.json"
ENV_DIR = "ETFORGE_CACHE_DIR"


def default_dir() -> Path:
    """The platform's cache convention (XDG on Linux, Library/Caches on macOS, LOCALAPPDATA on Windows)."""
    if env := os.environ.get(ENV_DIR):
        return Path(env)
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "etforge"
    if os.name == "nt":
        base = os.environ.get("LOCALAPPDATA") or str(Path.home() / "AppData" / "Local")
        return Path(base) / "etforge" / "Cache"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "etforge"


class Fingerprint:
    """An incremental SHA-256 over labelled parts, so two different inputs cannot collide by
    concatenation (each part carries its label and length)."""

    def __init__(self) -> None:
        self._h = hashlib.sha256()

    def add(self, label: str, data: bytes | str) -> None:
        raw = data.encode() if isinstance(data, str) else data
        self._h.update(f"{label}\0{len(raw)}\0".encode())
        self._h.update(raw)

    def add_tensor(self, label: str, tensor: Any) -> None:
        t = tensor.detach().cpu()
        self.add(label + ".meta", f"{t.dtype}|{tuple(t.shape)}|{tuple(t.stride())}")
        flat = t.contiguous().reshape(-1)
        self.add(label + ".data", flat.view(dtype=_uint8()).numpy().tobytes() if flat.numel() else b"")

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def _uint8() -> Any:
    import torch

    return torch.uint8


#: Top-level directories of the source tree that are not the product (and never shipped).
_NOT_PRODUCT = frozenset({"tests", "bench", "build", "dist", ".venv", ".git"})
#: What :func:`package_sources` hashes: etforge's code and its templates.
_SOURCE_SUFFIXES = frozenset({".py", ".j2"})
#: The package's root (``etforge/``: this file is ``etforge/core/cache/store.py``).
ROOT = Path(__file__).resolve().parents[2]


@functools.lru_cache(maxsize=1)
def package_sources() -> str:
    """SHA-256 of etforge's own Python sources and templates: a changed converter is a new build.

    Walks the tree with pruning (a checkout holds ``.venv``: walking it would cost seconds
    on every cache lookup)."""
    h = hashlib.sha256()
    for path in sorted(_source_files(ROOT)):
        h.update(str(path.relative_to(ROOT)).encode() + b"\0")
        h.update(path.read_bytes())
    return h.hexdigest()


def _source_files(root: Path) -> list[Path]:
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        if here == root:
            dirnames[:] = [d for d in dirnames if d not in _NOT_PRODUCT and not d.startswith(".")]
        dirnames[:] = [d for d in dirnames if d != "__pycache__" and not d.endswith(".egg-info")]
        found += [here / f for f in filenames if Path(f).suffix in _SOURCE_SUFFIXES]
    return found


def is_etforge_source(path: str) -> bool:
    """Whether ``path`` (absolute, resolved) is one of the files :func:`package_sources` hashes."""
    try:
        rel = Path(path).relative_to(ROOT)
    except ValueError:
        return False
    parts = rel.parts
    return (
        len(parts) > 0
        and Path(path).suffix in _SOURCE_SUFFIXES
        and (len(parts) == 1 or (parts[0] not in _NOT_PRODUCT and not parts[0].startswith(".")))
        and "__pycache__" not in parts
        and not any(p.endswith(".egg-info") for p in parts[:-1])
    )


def stack_versions() -> dict[str, str]:
    """The stack's distribution versions, read from their metadata (nothing is imported)."""
    import importlib.metadata as md

    versions = {}
    for dist in ("torch", "executorch", "torchao", "ai-edge-litert", "flatbuffers", "jinja2"):
        try:
            versions[dist] = md.version(dist)
        except md.PackageNotFoundError:
            versions[dist] = "absent"
    return versions


def build_key(
    program: Any,
    example: Sequence[Any],
    calibration: Sequence[Sequence[Any]] | None,
    *,
    model: str,
    target: str,
    options: dict[str, Any],
    flags: dict[str, Any],
    plugins: Iterable[tuple[str, str]],
    npu_compiler: str,
) -> str:
    """The cache key of one compile (``program`` is the float ``ExportedProgram``)."""
    fp = Fingerprint()
    fp.add("format", str(CACHE_FORMAT))
    fp.add("model", model)
    fp.add("target", target)
    fp.add("options", json.dumps(options, sort_keys=True, default=str))
    fp.add("flags", json.dumps(flags, sort_keys=True, default=str))
    fp.add("etforge", package_sources())
    fp.add("plugins", json.dumps(sorted(set(plugins))))
    fp.add("stack", json.dumps(stack_versions(), sort_keys=True))
    fp.add("npu_compiler", npu_compiler)
    fp.add("graph", program.graph_module.print_readable(print_output=False, include_stride=True))
    fp.add("signature", str(program.graph_signature))
    for name in sorted(program.state_dict):
        fp.add_tensor(f"state:{name}", program.state_dict[name])
    for name in sorted(program.constants):
        value = program.constants[name]
        if hasattr(value, "detach"):
            fp.add_tensor(f"const:{name}", value)
        else:
            fp.add(f"const:{name}", repr(value))
    for i, t in enumerate(example):
        fp.add_tensor(f"example:{i}", t)
    for b, batch in enumerate(calibration or []):
        for i, t in enumerate(batch):
            fp.add_tensor(f"calib:{b}:{i}", t)
    return fp.hexdigest()


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


@dataclass
class Entry:
    key: str
    path: Path
    bytes: int
    last_used: float
    #: False for a directory without an intact manifest (a killed store, a planted or damaged entry).
    intact: bool = True


def _seal(key: str, files: dict[str, str], dirs: list[str]) -> str:
    """What binds an entry's manifest to its key and to every file's digest."""
    body = json.dumps({"key": key, "files": files, "dirs": dirs}, sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()


class BuildCache:
    """Entries live in ``<root>/v<format>/<key[:2]>/<key>/`` with ``files/`` and a manifest."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = (root or default_dir()) / f"v{CACHE_FORMAT}"
        #: Why the last :meth:`restore` missed (for the report).
        self.why = ""

    def _entry(self, key: str) -> Path:
        return self.root / key[:2] / key

    def restore(self, key: str, dest: Path) -> bool:
        """Copy the entry's files into ``dest`` (an empty directory) if the entry is intact:
        its manifest names this key, its seal matches, and every file (no more, no fewer)
        has the digest the manifest lists. Anything else is deleted, never trusted."""
        entry = self._entry(key)
        if not entry.is_dir():
            self.why = "no cached build for this program"
            return False
        manifest = _read_manifest(entry)
        files = entry / "files"
        listed: dict[str, str] = manifest["files"] if manifest is not None else {}
        dirs = manifest.get("dirs") if manifest is not None else None
        problem = None
        if manifest is None:
            problem = "its manifest is missing or unreadable"
        elif manifest.get("key") != key or not isinstance(dirs, list):
            problem = "its manifest names another key"
        elif manifest.get("seal") != _seal(key, listed, dirs):
            problem = "its manifest does not match its seal"
        else:
            present = {str(p.relative_to(files)) for p in _files(files)} if files.is_dir() else set()
            if files.is_dir() and any(p.is_symlink() for p in files.rglob("*")):
                problem = "it holds a symbolic link"  # never a link into the output
            elif present != set(listed) or any(sha256_file(files / rel) != d for rel, d in listed.items()):
                problem = "its files do not match its manifest"
        if problem is not None:
            self.why = f"the cached entry {entry} was damaged ({problem}): discarded"
            self.discard(key)  # corrupt: never trusted, rebuilt by the caller
            return False
        for rel in dirs or []:  # empty ones too: the output as it was written
            if isinstance(rel, str) and not Path(rel).is_absolute() and ".." not in Path(rel).parts:
                (dest / rel).mkdir(parents=True, exist_ok=True)
        for rel in sorted(listed):
            if Path(rel).is_absolute() or ".." in Path(rel).parts:
                continue
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(files / rel, target, follow_symlinks=False)
        with contextlib.suppress(OSError):
            os.utime(entry / MANIFEST)  # last use, for pruning
        self.why = ""
        return True

    def store(self, key: str, source: Path) -> None:
        """Add ``source``'s files as the entry for ``key`` (atomically; a failure stores nothing).

        Raises :class:`CacheError` (one line naming the cache) when the cache cannot be written."""
        staging: Path | None = None
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(dir=self.root, prefix=".store-"))
            shutil.copytree(source, staging / "files", dirs_exist_ok=True)
            digests = {
                str(p.relative_to(staging / "files")): sha256_file(p) for p in _files(staging / "files")
            }
            dirs = sorted(
                str(d.relative_to(staging / "files")) for d in (staging / "files").rglob("*") if d.is_dir()
            )
            manifest = {
                "format": CACHE_FORMAT,
                "key": key,
                "created": time.time(),
                "files": digests,
                "dirs": dirs,
                "seal": _seal(key, digests, dirs),
            }
            (staging / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
            entry = self._entry(key)
            entry.parent.mkdir(parents=True, exist_ok=True)
            if entry.exists():
                shutil.rmtree(entry, ignore_errors=True)
            os.replace(staging, entry)
        except (OSError, shutil.Error) as exc:
            raise CacheError(f"build cache {self.root} not updated: {_os_reason(exc)}") from None
        finally:
            if staging is not None and staging.exists():
                shutil.rmtree(staging, ignore_errors=True)

    def discard(self, key: str) -> None:
        shutil.rmtree(self._entry(key), ignore_errors=True)

    def entries(self) -> list[Entry]:
        """Every entry directory, intact or not (one without a manifest is listed too)."""
        found = []
        if not self.root.is_dir():
            return found
        for shard in self.root.iterdir():
            if shard.name in (DIRECT_DIR_NAME,) or shard.name.startswith(".") or not shard.is_dir():
                continue
            for entry in shard.iterdir():
                if not entry.is_dir() or entry.is_symlink():
                    continue
                manifest_path = entry / MANIFEST
                intact = _read_manifest(entry) is not None
                size = sum(p.lstat().st_size for p in _files(entry))
                try:
                    used = (manifest_path if intact else entry).stat().st_mtime
                except OSError:
                    used = 0.0
                found.append(Entry(entry.name, entry, size, used if intact else 0.0, intact))
        return sorted(found, key=lambda e: e.last_used)

    def prune(
        self, max_bytes: float = 0, older_than_seconds: float | None = None
    ) -> tuple[list[Entry], list[str]]:
        """Remove damaged entries, then least-recently-used ones until the cache holds at most
        ``max_bytes`` (and every entry unused for longer than ``older_than_seconds``).

        Returns (entries removed, one line per entry or leftover that could not be removed)."""
        entries = self.entries()
        total = sum(e.bytes for e in entries)
        removed: list[Entry] = []
        errors: list[str] = []
        now = time.time()
        for e in entries:
            stale = older_than_seconds is not None and now - e.last_used > older_than_seconds
            if total > max_bytes or stale or not e.intact:
                problem = _remove_tree(e.path)
                if problem is None:
                    total -= e.bytes
                    removed.append(e)
                else:
                    errors.append(problem)
        if self.root.is_dir():
            for leftover in self.root.glob(".store-*"):  # a store killed midway
                if (problem := _remove_tree(leftover)) is not None:
                    errors.append(problem)
        from etforge.core.cache.direct import DirectCache

        errors += DirectCache(self).prune()  # direct-mode manifests of removed entries
        return removed, errors


DIRECT_DIR_NAME = "direct"


class CacheError(Exception):
    """The cache could not be read or written: one line naming it (a warning, never a failure)."""


def _os_reason(exc: BaseException) -> str:
    if isinstance(exc, shutil.Error):  # copytree's list of (src, dst, why): the first says enough
        errs = exc.args[0] if exc.args and isinstance(exc.args[0], list) else []
        if errs and isinstance(errs[0], tuple) and len(errs[0]) == 3:
            return f"{errs[0][1]}: {str(errs[0][2]).split('] ', 1)[-1].split(': ', 1)[0]}"
        return str(exc).splitlines()[0][:200]
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        return f"{where}{exc.strerror or type(exc).__name__}"
    return f"{type(exc).__name__}: {exc}"


def _remove_tree(path: Path) -> str | None:
    """Remove ``path``; None on success, else one line naming it and why."""
    failures: list[str] = []

    def failed(_fn: Any, where: str, exc: Any) -> None:
        err = exc[1] if isinstance(exc, tuple) else exc
        failures.append(f"{where}: {getattr(err, 'strerror', None) or err}")

    shutil.rmtree(path, onerror=failed)
    if path.exists():
        return f"cannot remove {path} ({failures[0] if failures else 'still there'})"
    return None


def _read_manifest(entry: Path) -> dict[str, Any] | None:
    try:
        manifest = json.loads((entry / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if (
        not isinstance(manifest, dict)
        or manifest.get("format") != CACHE_FORMAT
        or not isinstance(manifest.get("files"), dict)
        or not manifest["files"]
    ):
        return None
    return manifest


def check_report(report: dict[str, Any], *, model: str, target: str, quantized: bool) -> str | None:
    """Whether a restored ``report.json`` is the build that was asked for (None) or another's.

    The key binds an entry to its program, not to the command line: an entry planted, or
    copied, under a key must still describe this model, this target and this precision."""
    for field, wanted in (("model", model), ("target", target), ("quantized", quantized)):
        if report.get(field) != wanted:
            return f"its report names {field} {report.get(field)!r}, not {wanted!r}"
    return None


def enabled() -> bool:
    """``ETFORGE_NO_CACHE=1`` turns the cache off for a process (the test suite does)."""
    return os.environ.get("ETFORGE_NO_CACHE", "") in {"", "0"}


def plugin_fingerprints(reg: Any) -> list[tuple[str, str]]:
    """Each plugin's distribution, version, entry point and module source: an edited plugin
    (an editable install, a development checkout) is a new build even at the same version.

    The module is found without importing it (a direct-mode lookup imports nothing heavy)."""
    found = []
    for p in reg.plugins:
        path = lazy_imports.module_origin(p.entry_point.split(":", 1)[0])
        source = hashlib.sha256(Path(path).read_bytes()).hexdigest() if path and Path(path).is_file() else ""
        found.append((f"{p.distribution} {p.version} {p.name}={p.entry_point}", source))
    return found


def npu_compiler_status(reg: Any, target: Any) -> str:
    """Whether the target's NPU compiler can run here (its plugin checks with ``find_spec``)."""
    npu = getattr(target, "npu", None)
    compiler_name = getattr(npu, "compiler", None) if npu is not None else None
    compiler = reg.npu_compilers.get(compiler_name) if compiler_name else None
    return repr(compiler.available()) if compiler is not None else f"no compiler ({compiler_name})"


def compile_key(
    front: Any, reg: Any, model: str, target: Any, options: dict[str, Any], flags: dict[str, Any]
) -> str:
    """The key of one ``etforge compile``: its front end (exported program, example and
    calibration tensors) and everything else the output depends on."""
    return build_key(
        front.program,
        front.example,
        front.calibration,
        model=model,
        target=target.name,
        options=target.output_options(options),
        flags=flags,
        plugins=plugin_fingerprints(reg),
        npu_compiler=npu_compiler_status(reg, target),
    )
