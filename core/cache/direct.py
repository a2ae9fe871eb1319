"""Direct mode for the build cache, as in ccache: answer a recompile before importing torch.

The build cache's key (:mod:`etforge.core.cache.store`) hashes the exported program, so even a hit
pays for ``import torch``, loading the model and ``torch.export``. Direct mode puts a cheap
*front key* in front of it, computed from what the user typed and what is installed — the
model spec and its resolved path, the working directory, the target, the options that
affect the output, the flags, the calibration file's content, ``sys.path``, the Python
version, etforge's sources, every plugin's distribution and module source, the stack's
versions and the NPU compiler's presence — none of which needs an import.

The front key names a small manifest written by the build that filled the cache: every
input the model's code read while it was loaded and exported (:mod:`etforge.core.cache.record`:
files under the path as opened, absent files, probes, listings, environment variables,
failed imports), the versions of the third-party distributions it imported, and the full
build key. A later compile with the same front key whose recorded inputs are all unchanged
restores that build's entry through :meth:`BuildCache.restore`, which re-checks every output
file. Anything else — a changed input, a corrupt manifest, a failed restore — falls back to
the normal path, which recompiles or hits with the full key and rewrites the manifest; a
build that read something nothing observes writes no manifest (docs/batch.md: the rule).

Direct mode answers only where every input is known by construction (:func:`basis`): a
``.pt2`` program (its bytes are in the front key), a ``zoo:`` model (etforge's sources and
versions are), and a factory whose author opted in with ``--cache direct`` (then the
recorder's observations are trusted, with the caveat docs/batch.md gives). Any other factory
is answered by the full key after the export, which nothing the factory reads can make stale.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from etforge.core.cache import store as cache
from etforge.core.cache.record import (  # noqa: F401  (Recorder, file_facts: this module's API too)
    Recorder,
    _site_dirs,
    _stat_facts,
    _too_new,
    file_facts,
    listing_hash,
    path_kind,
)
from etforge.core.common import lazy_imports
from etforge.core.common.digest import sha256_file

#: Bump when the manifest layout or the front key's composition changes.
DIRECT_FORMAT = 3
#: Direct-mode bases (:func:`basis`): inputs known by construction, or observed (opt-in).
PT2, ZOO, OPT_IN = "pt2", "zoo", "opt-in"
#: Environment variables of the stack that may change a build (a zoo model's or a program's,
#: whose code no recorder watches): their values are in the front key. The cache's own
#: location and switch are not (they change where outputs are kept, not what they are), nor
#: the test suite's hooks (``ETFORGE_TEST_*``: where a test process writes what it imported).
_KEY_ENV = ("TORCH", "PYTORCH", "EXECUTORCH", "ETFORGE", "LITERT", "INDUCTOR", "AOT", "FX_")
_NOT_KEY_ENV = frozenset({"ETFORGE_CACHE_DIR", "ETFORGE_NO_CACHE"})
#: Distributions a zoo model's code imports besides the stack (its data sets ship in one).
_ZOO_DISTS = ("scikit-learn", "numpy", "scipy")


def basis(model: str, opt_in: bool) -> tuple[str | None, str]:
    """(how direct mode may answer for ``model``, or None; why), from the spec alone.

    A ``.pt2`` and a ``zoo:`` model have inputs known by construction; a factory's code can
    read anything (a C extension's reads are invisible), so it gets direct mode only when its
    author opts in (``--cache direct``)."""
    if model.endswith(".pt2"):
        return PT2, "a .pt2 program: its bytes are the key"
    if model.startswith("zoo:"):
        return ZOO, "a zoo model: etforge's sources and the stack's versions are the key"
    if opt_in:
        return (
            OPT_IN,
            "opted in (--cache direct): the files, variables and imports the factory read are the key",
        )
    return None, (
        "direct mode is off for a factory (what its code reads cannot all be known; --cache direct opts in)"
    )


DIRECT_DIR = "direct"


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
            fp.add("calib", f"{calib}\0{Path(calib).resolve()}\0{sha256_file(calib)}")
        except OSError:
            return None
    fp.add("sys.path", json.dumps(sys.path))
    fp.add("python", f"{sys.version}\0{sys.executable}\0{sys.implementation.cache_tag}\0{sys.flags}")
    fp.add("etforge", cache.package_sources())
    fp.add("plugins", json.dumps(sorted(set(cache.plugin_fingerprints(reg)))))
    fp.add("stack", json.dumps(cache.stack_versions(), sort_keys=True))
    fp.add("npu_compiler", cache.npu_compiler_status(reg, target))
    how, _ = basis(model, True)
    if how in (PT2, ZOO):  # an opted-in factory's variables are those the recorder saw it read
        env = {
            k: v
            for k, v in os.environ.items()
            if k.startswith(_KEY_ENV) and k not in _NOT_KEY_ENV and not k.startswith("ETFORGE_TEST_")
        }
        fp.add("env", json.dumps(env, sort_keys=True))
    if how == PT2:
        try:
            fp.add("pt2", sha256_file(model))
        except OSError:
            return None  # the normal path names the problem
    elif how == ZOO:
        fp.add("zoo", json.dumps({d: _version(d) for d in _ZOO_DISTS}))
        # Where the stack's top-level packages are imported from: a module on PYTHONPATH
        # that shadows one is another build even at the same versions.
        tops = ("torch", "numpy", "sklearn", "scipy", "executorch", "torchao", "ai_edge_litert")
        fp.add("origins", json.dumps({t: lazy_imports.module_origin(t) for t in tops}))
    if how in (PT2, ZOO):
        # A module dropped into a directory searched before site-packages (the working
        # directory, PYTHONPATH) may shadow any the stack imports: another build.
        fp.add("shadowing", json.dumps([(d, _importable_names(d)) for d in _searched_first()]))
    return fp.hexdigest()


_MODULE_SUFFIXES = (".py", ".pyc", ".so", ".pyd", ".pth")


def _searched_first() -> list[str]:
    """The ``sys.path`` directories that are neither the interpreter's nor site directories."""
    from etforge.core.cache.record import _Excluded

    excluded = _Excluded(())
    out = []
    for entry in sys.path:
        d = os.path.abspath(entry or os.getcwd())
        if os.path.isdir(d) and not (d + os.sep).startswith(excluded.prefixes):
            out.append(d)
    return out


def _importable_names(directory: str) -> str:
    """A digest of the names in ``directory`` an import could find: modules and packages (a
    plain directory is a namespace package only when nothing else has the name: ignored, so an
    output directory written there is not another build)."""
    names = []
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except OSError:
        return "unreadable"
    for e in entries:
        if e.name.endswith(_MODULE_SUFFIXES):
            names.append(e.name)
        elif e.is_dir() and any(
            os.path.exists(os.path.join(e.path, f)) for f in ("__init__.py", "__init__.pyc")
        ):
            names.append(e.name + "/")
    return hashlib.sha256("\0".join(names).encode("utf-8", "surrogateescape")).hexdigest()


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


def _known_facts(facts: dict[str, Any]) -> bool:
    return (
        isinstance(facts.get("sha256"), str)
        or facts.get("absent") is True
        or isinstance(facts.get("probe"), str)
        or isinstance(facts.get("listing"), str)
    )


def _changed(path: str, facts: dict[str, Any]) -> str | None:
    """How ``path`` differs from what the build saw (None: the same)."""
    if facts.get("absent"):
        return None if not os.path.lexists(path) else "exists now (it was absent)"
    if "probe" in facts:
        return None if path_kind(path) == facts["probe"] else "is another kind or size now"
    if "listing" in facts:
        return None if listing_hash(path) == facts["listing"] else "lists other names now"
    try:
        st = os.stat(path)
    except OSError:
        return "is gone"
    if not stat.S_ISREG(st.st_mode) or st.st_size != facts.get("size"):
        return "changed"  # the fast negative: another size is another file
    if os.name == "posix" and _stat_facts(st) == {k: facts.get(k) for k in _stat_facts(st)}:
        # Untouched since it was hashed: every write changes ctime, which no one can set back,
        # and the file's ctime predates the recording build, so no write raced it.
        return None
    try:
        return None if sha256_file(path) == facts["sha256"] else "changed"
    except OSError:
        return "is unreadable"


def _checksum(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


class DirectCache:
    """Front key → manifest files in ``<cache>/v<format>/direct/``."""

    def __init__(self, build_cache: cache.BuildCache | None = None) -> None:
        self.build_cache = build_cache or cache.BuildCache()
        self.root = self.build_cache.root / DIRECT_DIR
        #: Why the last :meth:`lookup` answered as it did (for the report).
        self.why = ""
        #: The build key the last :meth:`restore` looked up.
        self.restored_key: str | None = None

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
            or not isinstance(body.get("env"), dict)
            or not isinstance(body.get("missing_modules"), list)
            or not all(isinstance(v, dict) and _known_facts(v) for v in files.values())
        ):
            return None
        return body

    def lookup(self, front: str) -> str | None:
        """The build key the manifest names, if every recorded input is unchanged; else None,
        with :attr:`why` saying what differed."""
        self.why = "no direct-mode manifest for this command line"
        body = self._read(front)
        if body is None:
            return None
        refreshed = False
        for path, facts in body["files"].items():
            changed = _changed(path, facts)
            if changed is not None:
                self.why = f"{path} {changed} since the cached build"
                return None
            if "sha256" in facts:
                st = os.stat(path)
                if _stat_facts(st) != {k: facts.get(k) for k in _stat_facts(st)} and not _too_new(
                    st, time.time_ns()
                ):
                    facts.update(_stat_facts(st))  # touched, same bytes: remember the new stat
                    refreshed = True
        for name, value in body["env"].items():
            if os.environ.get(name) != value:
                self.why = f"environment variable {name} changed since the cached build"
                return None
        for module in body["missing_modules"]:
            if lazy_imports.module_origin(str(module)) is not None:
                self.why = f"module {module} is importable now (it was not for the cached build)"
                return None
        for dist, version in body["dists"].items():
            if _version(dist) != version:
                self.why = (
                    f"{dist} is {_version(dist) or 'not installed'} now, {version} for the cached build"
                )
                return None
        if refreshed:
            with contextlib.suppress(OSError):
                self._write(front, body)
        self.why = "every input the model read is unchanged"
        return str(body["build_key"])

    def restore(self, front: str, dest: Path) -> bool:
        """Restore the build the manifest names into ``dest`` (empty); False on any miss."""
        key = self.lookup(front)
        self.restored_key = key
        if key is None:
            return False
        if not self.build_cache.restore(key, dest):
            self.why = f"the build the manifest names is gone or damaged ({self.build_cache.why})"
            return False
        return True

    def save(
        self,
        front: str,
        build_key: str,
        files: dict[str, dict[str, Any]],
        dists: dict[str, str],
        env: dict[str, str | None] | None = None,
        missing_modules: list[str] | None = None,
    ) -> None:
        body = {
            "format": DIRECT_FORMAT,
            "front_key": front,
            "build_key": build_key,
            "created": time.time(),
            "files": files,
            "dists": dists,
            "env": env or {},
            "missing_modules": missing_modules or [],
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

    def prune(self) -> list[str]:
        """Remove manifests whose build entry is gone (and leftovers of killed writes); returns
        one line per file that could not be removed."""
        errors: list[str] = []
        if not self.root.is_dir():
            return errors
        for path in self.root.glob("*/*"):
            body = self._read(path.stem) if path.suffix == ".json" else None
            gone = (
                body is None
                or not (self.build_cache.root / body["build_key"][:2] / body["build_key"]).is_dir()
            )
            if gone:
                try:
                    path.unlink()
                except OSError as exc:
                    errors.append(f"cannot remove {path} ({exc.strerror or type(exc).__name__})")
        return errors


class Session:
    """Direct mode for one compile: look up before anything heavy, record during the build,
    write the manifest after it."""

    def __init__(
        self, front: str, exclude: Iterable[Path | str], model: str, calib: str | None, how: str = OPT_IN
    ) -> None:
        self.front = front
        #: :data:`PT2` / :data:`ZOO` (inputs known by construction: nothing is recorded) or
        #: :data:`OPT_IN` (the recorder's observations are the inputs).
        self.how = how
        self.basis_why = basis(model, how == OPT_IN)[1]
        self.store = DirectCache()
        excluded = [*exclude, cache.default_dir()]
        if calib:
            excluded.append(Path(calib).resolve())  # in the front key by content
        self.recorder = Recorder(excluded)
        model_file = _model_file(model)
        self._extra = [model_file] if model_file else []
        #: Why direct mode answered, or did not (for the report): set by restore and save.
        self.why = ""

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
        how: str = OPT_IN,
    ) -> Session | None:
        try:
            front = front_key(model=model, target=target, options=options, flags=flags, calib=calib, reg=reg)
        except Exception:  # noqa: BLE001  (direct mode is an optimisation: off, never an error)
            return None
        return None if front is None else cls(front, exclude, model, calib, how)

    def recording(self) -> contextlib.AbstractContextManager[Any]:
        """What watches the build: the recorder for an opted-in factory, nothing otherwise."""
        return self.recorder.recording() if self.how == OPT_IN else contextlib.nullcontext()

    def restore(self, dest: Path) -> bool:
        """Restore the recorded build into ``dest``; on any failure ``dest`` is emptied again."""
        try:
            if self.store.restore(self.front, dest):
                self.why = self.store.why if self.how == OPT_IN else f"{self.basis_why}, unchanged"
                return True
            self.why = self.store.why
        except Exception as exc:  # noqa: BLE001  (direct mode only ever falls back)
            self.why = f"direct-mode lookup failed ({type(exc).__name__})"
        self.restore_failed(dest)
        return False

    def distrust(self, dest: Path) -> None:
        """The restored build is not the one asked for: its entry goes, ``dest`` is emptied."""
        if self.store.restored_key is not None:
            self.store.build_cache.discard(self.store.restored_key)
        self.restore_failed(dest)

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
        if self.how != OPT_IN:  # every input is in the front key
            try:
                self.store.save(self.front, build_key, {}, {})
                self.why = f"direct mode on for the next compile: {self.basis_why}"
            except Exception as exc:  # noqa: BLE001
                self.why = f"direct-mode manifest not written ({type(exc).__name__})"
            return
        if self.recorder.broken:
            self.why = "direct mode off for this build: recording its inputs failed"
            return
        try:
            files = self.recorder.dependencies(self._extra)
            if files is None:
                what = self.recorder.ineligible or "an input changed while the build ran"
                self.why = f"direct mode off for this model: {what}"
                return
            rec = self.recorder
            self.store.save(
                self.front,
                build_key,
                files,
                imported_distributions(),
                rec.environment(),
                rec.missing_modules(),
            )
            on = f"direct mode on for the next compile: {self.basis_why}"
            self.why = f"{self.why}; {on}" if self.why else on  # why this compile missed, first
        except Exception as exc:  # noqa: BLE001  (a manifest that cannot be written never fails a compile)
            self.why = f"direct-mode manifest not written ({type(exc).__name__})"
