"""Direct mode for the build cache, as in ccache: answer a recompile before importing torch.

The build cache's key (:mod:`etforge.core.cache`) hashes the exported program, so even a hit
pays for ``import torch``, loading the model and ``torch.export``. Direct mode puts a cheap
*front key* in front of it, computed from what the user typed and what is installed — the
model spec and its resolved path, the working directory, the target, the options that
affect the output, the flags, the calibration file's content, ``sys.path``, the Python
version, etforge's sources, every plugin's distribution and module source, the stack's
versions and the NPU compiler's presence — none of which needs an import.

The front key names a small manifest written by the build that filled the cache: every
file the model's code read or imported while it was loaded, exported, calibrated and built
(seen by an audit hook), with its content hash, the versions of the third-party
distributions it imported, and the full build key. A later compile with the same front key
whose recorded files all still hold the same bytes (and whose distributions have the same
versions) restores that build's entry through :meth:`BuildCache.restore`, which re-checks
every output file. Anything else — a missing or changed file, a corrupt manifest, a failed
restore — falls back to the normal path, which recompiles or hits with the full key and
rewrites the manifest.

Like ccache's direct mode, this assumes a model's output depends only on the files it
reads: a model that reads environment variables, the clock or the network must be
compiled with ``--no-cache``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import site
import stat
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from etforge.core import cache

#: Bump when the manifest layout or the front key's composition changes.
DIRECT_FORMAT = 1
DIRECT_DIR = "direct"
#: Directories whose files are never dependencies: they are not files (``/proc``) or they
#: are covered otherwise (the interpreter and site-packages by the distributions' versions).
_SYSTEM_DIRS = ("/proc", "/sys", "/dev")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


def _sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _model_path(spec: str) -> str:
    """The file a model spec names, resolved (relative specs depend on the working directory)."""
    if spec.startswith("zoo:"):
        return ""
    path, _, factory = spec.rpartition(":") if not spec.endswith(".pt2") else (spec, "", "")
    if not path:  # no ':' at all: the loader rejects it; keep the spec as typed
        return spec
    return str(Path(path).resolve()) + (f":{factory}" if factory else "")


def _model_file(spec: str) -> str | None:
    resolved = _model_path(spec)
    if not resolved or spec.startswith("zoo:"):
        return None
    return resolved if spec.endswith(".pt2") else resolved.rpartition(":")[0]


def front_key(
    *,
    model: str,
    target: Any,
    options: dict[str, Any],
    flags: dict[str, Any],
    calib: str | None,
    reg: Any,
) -> str | None:
    """The direct-mode key of one compile, from the command line and what is installed.

    None when direct mode cannot answer (an unreadable ``--calib`` file: the normal path
    names the problem).
    """
    fp = cache.Fingerprint()
    fp.add("format", f"{cache.CACHE_FORMAT}.{DIRECT_FORMAT}")
    fp.add("model", model)
    fp.add("model_path", _model_path(model))
    fp.add("cwd", os.getcwd())
    fp.add("target", target.name)
    fp.add("options", json.dumps(target.output_options(options), sort_keys=True, default=str))
    fp.add("flags", json.dumps(flags, sort_keys=True, default=str))
    if calib:
        try:
            fp.add("calib", f"{calib}\0{Path(calib).resolve()}\0{_sha256_file(calib)}")
        except OSError:
            return None
    fp.add("sys.path", json.dumps(sys.path))
    fp.add("python", f"{sys.version}\0{sys.executable}\0{sys.implementation.cache_tag}\0{sys.flags}")
    fp.add("etforge", cache.package_sources())
    fp.add("plugins", json.dumps(sorted(set(cache.plugin_fingerprints(reg)))))
    fp.add("stack", json.dumps(cache.stack_versions(), sort_keys=True))
    fp.add("npu_compiler", cache.npu_compiler_status(reg, target))
    return fp.hexdigest()


# --- recording the files a build reads ------------------------------------------------------

#: The recorder the audit hook feeds, or None. Audit hooks cannot be removed, so the hook
#: stays installed for the process and does nothing while this is None.
_RECORDER: Recorder | None = None
_HOOK_LOCK = threading.Lock()
_HOOK_INSTALLED = False


def _audit(event: str, args: tuple[Any, ...]) -> None:
    rec = _RECORDER
    if rec is None or event != "open":
        return
    try:
        rec.saw(*args[:3])
    except Exception:  # noqa: BLE001  (an audit hook must never break the open it watches)
        rec.broken = True


def _install_hook() -> None:
    global _HOOK_INSTALLED
    with _HOOK_LOCK:
        if not _HOOK_INSTALLED:
            sys.addaudithook(_audit)
            _HOOK_INSTALLED = True


class Recorder:
    """The files opened for reading, and the modules imported, between :meth:`start` and :meth:`stop`."""

    def __init__(self, exclude: Iterable[Path | str] = ()) -> None:
        self.read: set[str] = set()
        self.written: set[str] = set()
        self.broken = False
        self._exclude = list(exclude)
        self._modules: set[str] = set()
        self._new_modules: list[Any] = []
        self.start_ns = 0

    def saw(self, path: Any, mode: Any = None, flags: Any = None) -> None:
        if isinstance(path, int) or path is None:  # an already open descriptor
            return
        name = os.path.abspath(os.fsdecode(os.fspath(path)))
        if isinstance(mode, str):
            writes = any(c in mode for c in "wax+")
        else:
            writes = isinstance(flags, int) and bool(flags & _WRITE_FLAGS)
        (self.written if writes else self.read).add(name)

    def start(self) -> None:
        global _RECORDER
        _install_hook()
        self._modules = set(sys.modules)
        self.start_ns = time.time_ns()
        _RECORDER = self

    def stop(self) -> None:
        global _RECORDER
        if _RECORDER is self:
            _RECORDER = None
        self._new_modules = [m for name, m in list(sys.modules.items()) if name not in self._modules]

    @contextlib.contextmanager
    def recording(self) -> Any:
        self.start()
        try:
            yield self
        finally:
            self.stop()

    def dependencies(self, extra: Iterable[str] = ()) -> dict[str, dict[str, Any]] | None:
        """Each recorded file (path → size, mtime, ctime, inode, SHA-256), or None when one was
        changed while the build ran (its recorded hash might not be what the build read)."""
        extra = [os.path.abspath(p) for p in extra]
        candidates = (self.read - self.written) | set(extra)
        for module in self._new_modules:
            origin = getattr(module, "__file__", None)
            if isinstance(origin, str):
                candidates.add(os.path.abspath(origin))
        excluded = _Excluded(self._exclude)
        written = {os.path.realpath(p) for p in self.written}
        deps: dict[str, dict[str, Any]] = {}
        extra_paths = set(extra)
        wanted = {os.path.realpath(p) for p in extra}
        for name in sorted(candidates):
            if name.startswith(excluded.prefixes) and name not in extra_paths:
                continue  # the common case, without resolving links
            real = os.path.realpath(name)
            if real not in wanted and (real in written or excluded(real)):
                continue
            try:
                st = os.stat(real)
            except OSError:
                continue  # gone by the end of the build: a temporary
            if not stat.S_ISREG(st.st_mode):
                continue
            if _too_new(st, self.start_ns):
                return None  # changed while the build ran (ccache: "file too new")
            deps[real] = file_facts(real, st)
        return deps


def _too_new(st: os.stat_result, since_ns: int) -> bool:
    """Whether the file may have changed at or after ``since_ns``.

    On POSIX every write sets ctime to the clock, and nobody can set it otherwise (mtime can
    be set to anything, the future included, by ``touch -d`` or an archive). File times come
    from a coarse clock (a jiffy behind) or are whole seconds on some file systems (two on
    FAT), so a write just after ``since_ns`` can carry an earlier time: allow for it."""
    changed = st.st_ctime_ns if os.name == "posix" else st.st_mtime_ns
    margin = 2_000_000_000 if changed % 1_000_000_000 == 0 else 50_000_000
    return changed >= since_ns - margin


def file_facts(path: str, st: os.stat_result | None = None) -> dict[str, Any]:
    """What a manifest records of a dependency: its stat (a fast check) and its SHA-256."""
    return {**_stat_facts(st or os.stat(path)), "sha256": _sha256_file(path)}


def _stat_facts(st: os.stat_result) -> dict[str, int]:
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "ino": st.st_ino}


class _Excluded:
    """Paths that are not dependencies: the interpreter, site-packages, etforge's own sources,
    ``/proc`` and friends, compiled bytecode, and the caller's own directories."""

    def __init__(self, extra: Iterable[Path | str]) -> None:
        dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, *_SYSTEM_DIRS}
        dirs.update(_site_dirs())
        paths = sysconfig.get_paths()
        dirs.update(paths[k] for k in ("stdlib", "platstdlib") if k in paths)
        dirs.update(str(p) for p in extra)
        resolved = {os.path.realpath(d) for d in dirs if d} | {os.path.abspath(d) for d in dirs if d}
        self.prefixes = tuple(sorted(d.rstrip(os.sep) + os.sep for d in resolved))

    def __call__(self, real: str) -> bool:
        if real.startswith(self.prefixes) or cache.is_etforge_source(real):
            return True
        parts = Path(real).parts
        return real.endswith(".pyc") and "__pycache__" in parts


def _site_dirs() -> set[str]:
    """Where installed distributions live (their files are covered by their versions)."""
    dirs = set(site.getsitepackages()) if hasattr(site, "getsitepackages") else set()
    with contextlib.suppress(Exception):
        dirs.add(site.getusersitepackages())
    paths = sysconfig.get_paths()
    dirs.update(paths[k] for k in ("purelib", "platlib") if k in paths)
    return dirs


def imported_distributions() -> dict[str, str]:
    """name → version of every installed distribution a loaded module comes from.

    Owners are found by name (``torch`` → ``torch-*.dist-info``) and ``top_level.txt``;
    only names neither gives (``yaml`` and the like without one) pay for scanning every
    distribution's file list (``packages_distributions``, a quarter of a second)."""
    import importlib.metadata as md

    site_dirs = set()
    for d in _site_dirs():
        site_dirs |= {os.path.abspath(d).rstrip(os.sep) + os.sep, os.path.realpath(d).rstrip(os.sep) + os.sep}
    prefixes = tuple(site_dirs)
    tops = set()
    for name, module in list(sys.modules.items()):
        origin = getattr(module, "__file__", None)
        if isinstance(origin, str) and os.path.abspath(origin).startswith(prefixes):
            tops.add(name.split(".", 1)[0])
    found: dict[str, str] = {}
    owned: set[str] = set()
    for dist in md.distributions():
        names = {_normalize(getattr(dist, "_normalized_name", None) or dist.metadata["Name"] or "")}
        names |= set((dist.read_text("top_level.txt") or "").split())
        hits = {t for t in tops if t in names or _normalize(t) in names}
        if hits:
            meta = dist.metadata
            if meta["Name"] and meta["Version"]:
                found[meta["Name"]] = meta["Version"]
                owned |= hits
    # pip's finders for editable installs: the project's files are outside site-packages,
    # so they are recorded as files.
    rest = {t for t in tops - owned if not t.startswith("__editable__")}
    if rest:
        owners = md.packages_distributions()
        for top in sorted(rest):
            for dist_name in owners.get(top, []):
                if (version := _version(dist_name)) is not None:
                    found[dist_name] = version
    return found


def _normalize(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


def _version(dist: str) -> str | None:
    import importlib.metadata as md

    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


# --- the manifests ---------------------------------------------------------------------------


def _checksum(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


class DirectCache:
    """Front key → manifest files in ``<cache>/v<format>/direct/``."""

    def __init__(self, build_cache: cache.BuildCache | None = None) -> None:
        self.build_cache = build_cache or cache.BuildCache()
        self.root = self.build_cache.root / DIRECT_DIR

    def _path(self, front: str) -> Path:
        return self.root / front[:2] / f"{front}.json"

    def _read(self, front: str) -> dict[str, Any] | None:
        """The manifest, if it is intact (a corrupt one is never trusted)."""
        try:
            data = json.loads(self._path(front).read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict):
            return None
        body = data.get("body")
        if not isinstance(body, dict) or data.get("sha256") != _checksum(body):
            return None
        files, dists = body.get("files"), body.get("dists")
        if (
            body.get("format") != DIRECT_FORMAT
            or body.get("front_key") != front
            or not isinstance(body.get("build_key"), str)
            or not isinstance(files, dict)
            or not isinstance(dists, dict)
            or not all(isinstance(v, dict) and isinstance(v.get("sha256"), str) for v in files.values())
        ):
            return None
        return body

    def lookup(self, front: str) -> str | None:
        """The build key the manifest names, if every recorded file and distribution is unchanged."""
        body = self._read(front)
        if body is None:
            return None
        refreshed = False
        for path, facts in body["files"].items():
            try:
                st = os.stat(path)
            except OSError:
                return None
            if not stat.S_ISREG(st.st_mode) or st.st_size != facts.get("size"):
                return None  # the fast negative: another size is another file
            if os.name == "posix" and _stat_facts(st) == {k: facts.get(k) for k in _stat_facts(st)}:
                # Untouched since it was hashed: every write changes ctime, which no one can set
                # back, and the file's ctime predates the recording build, so no write raced it.
                continue
            try:
                if _sha256_file(path) != facts["sha256"]:
                    return None
            except OSError:
                return None
            if not _too_new(st, time.time_ns()):  # touched, same bytes: remember the new stat
                facts.update(_stat_facts(st))
                refreshed = True
        if any(_version(d) != v for d, v in body["dists"].items()):
            return None
        if refreshed:
            with contextlib.suppress(OSError):
                self._write(front, body)
        return str(body["build_key"])

    def restore(self, front: str, dest: Path) -> bool:
        """Restore the build the manifest names into ``dest`` (empty); False on any miss."""
        key = self.lookup(front)
        return key is not None and self.build_cache.restore(key, dest)

    def save(
        self, front: str, build_key: str, files: dict[str, dict[str, Any]], dists: dict[str, str]
    ) -> None:
        body = {
            "format": DIRECT_FORMAT,
            "front_key": front,
            "build_key": build_key,
            "created": time.time(),
            "files": files,
            "dists": dists,
        }
        self._write(front, body)

    def _write(self, front: str, body: dict[str, Any]) -> None:
        path = self._path(front)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".manifest-")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump({"body": body, "sha256": _checksum(body)}, f, indent=1, sort_keys=True)
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)

    def prune(self) -> int:
        """Remove manifests whose build entry is gone (and leftovers of killed writes)."""
        removed = 0
        for path in self.root.glob("*/*"):
            body = self._read(path.stem) if path.suffix == ".json" else None
            gone = (
                body is None
                or not (self.build_cache.root / body["build_key"][:2] / body["build_key"]).is_dir()
            )
            if gone:
                with contextlib.suppress(OSError):
                    path.unlink()
                    removed += 1
        return removed


class Session:
    """Direct mode for one compile: look up before anything heavy, record during the build,
    write the manifest after it."""

    def __init__(self, front: str, exclude: Iterable[Path | str], model: str, calib: str | None) -> None:
        self.front = front
        self.store = DirectCache()
        excluded = [*exclude, cache.default_dir()]
        if calib:
            excluded.append(Path(calib).resolve())  # in the front key by content
        self.recorder = Recorder(excluded)
        model_file = _model_file(model)
        self._extra = [model_file] if model_file else []

    @classmethod
    def open(
        cls,
        *,
        model: str,
        target: Any,
        options: dict[str, Any],
        flags: dict[str, Any],
        calib: str | None,
        reg: Any,
        exclude: Iterable[Path | str] = (),
    ) -> Session | None:
        try:
            front = front_key(model=model, target=target, options=options, flags=flags, calib=calib, reg=reg)
        except Exception:  # noqa: BLE001  (direct mode is an optimisation: off, never an error)
            return None
        return None if front is None else cls(front, exclude, model, calib)

    def restore(self, dest: Path) -> bool:
        """Restore the recorded build into ``dest``; on any failure ``dest`` is emptied again."""
        try:
            if self.store.restore(self.front, dest):
                return True
        except Exception:  # noqa: BLE001  (direct mode only ever falls back)
            pass
        self.restore_failed(dest)
        return False

    @staticmethod
    def restore_failed(dest: Path) -> None:
        """Empty ``dest`` (the staging directory) for the normal path."""
        for child in list(dest.iterdir()):
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    child.unlink()

    def save(self, build_key: str) -> None:
        """Write the manifest of the build just recorded (skipped if a file changed under it)."""
        if self.recorder.broken:
            return
        try:
            files = self.recorder.dependencies(self._extra)
            if files is None:
                return
            self.store.save(self.front, build_key, files, imported_distributions())
        except Exception:  # noqa: BLE001  (a manifest that cannot be written never fails a compile)
            return
