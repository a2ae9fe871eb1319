"""What a build reads, for direct mode (:mod:`etforge.core.cache.direct`): the recorder.

An audit hook sees every ``open`` (builtin, ``os.open``, ``io.open_code``), directory
listing, memory map, process, socket and ctypes call; wrappers installed for the recording
see what raises no audit event: ``os.stat``-style probes, ``os.environ`` reads,
``torch.from_file`` and ``numpy.fromfile``. The result is the build's inputs as facts a later
lookup can check (a file's hash under the path as opened, a probe's answer, a listing, an
environment variable, an import that failed), or the reason the build is not eligible for
direct mode (it read something nothing observes).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import site
import stat
import sys
import sysconfig
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from etforge.core.cache import store as cache
from etforge.core.common.digest import sha256_file

#: Directories whose files are never dependencies: they are not files (``/proc``) or they
#: are covered otherwise (the interpreter and site-packages by the distributions' versions).
_SYSTEM_DIRS = ("/proc", "/sys", "/dev")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


# --- recording what a build reads ------------------------------------------------------------

#: The recorder the audit hook feeds, or None. Audit hooks cannot be removed, so the hook
#: stays installed for the process and does nothing while this is None.
_RECORDER: Recorder | None = None
_HOOK_LOCK = threading.Lock()
_HOOK_INSTALLED = False
#: Audit events after which the build's inputs are not all known: a child process, the
#: network, native code called through ctypes. The entry is not eligible for direct mode.
_OPAQUE_EVENTS = {
    "subprocess.Popen": "started a process",
    "os.system": "started a process",
    "os.exec": "started a process",
    "os.posix_spawn": "started a process",
    "os.spawn": "started a process",
    "os.fork": "forked",
    "os.forkpty": "forked",
    "pty.spawn": "started a process",
    "socket.connect": "used the network",
    "socket.bind": "used the network",
    "socket.sendto": "used the network",
    "socket.getaddrinfo": "used the network",
    "urllib.Request": "used the network",
    "ctypes.dlopen": "loaded a native library through ctypes",
    "ctypes.dlsym": "called native code through ctypes",
    "ctypes.call_function": "called native code through ctypes",
    "ctypes.addressof": "read memory through ctypes",
    "ctypes.string_at": "read memory through ctypes",
    "os.getxattr": "read extended attributes",
}
#: Distributions whose compiled modules read files only through Python's ``open`` or the
#: entry points wrapped while recording (``torch.from_file``, ``numpy.fromfile``, mmap).
#: A compiled module of any other distribution, imported by the model, may read files from
#: native code, which nothing observes: the entry is not eligible for direct mode.
_OBSERVED_NATIVE = (
    "torch",
    "numpy",
    "PIL",
    "executorch",
    "torchao",
    "ai_edge_litert",
    "flatbuffers",
    "yaml",
    "_yaml",
    "markupsafe",
    "sympy",
    "mpmath",
    "jinja2",
    "rich",
    "click",
)
_NATIVE_SUFFIXES = (".so", ".pyd", ".dylib")
#: Environment variables of the stack (torch, ExecuTorch, etforge ...): recorded whoever reads them.
_STACK_ENV = ("TORCH", "PYTORCH", "AOT", "INDUCTOR", "FX_", "EXECUTORCH", "ETFORGE", "LITERT", "OMP_", "MKL_")
#: The environment this process started with (imported before torch, which sets variables of
#: its own): a variable the build reads is recorded with the value a later lookup will see,
#: the value its run derived it from.
_INITIAL_ENV = dict(os.environ)
_INHERITED = object()


def _audit(event: str, args: tuple[Any, ...]) -> None:
    rec = _RECORDER
    if rec is None:
        return
    try:
        if event == "open":
            rec.saw(*args[:3])
        elif event in ("os.listdir", "os.scandir"):
            rec.listed_dir(args[0] if args else ".")
        elif event == "os.remove" or event == "os.rename" or event == "os.rmdir":
            rec.removed.add(_abs(args[0]))
        elif event == "import":
            rec.imports.add(str(args[0]))
        elif event == "mmap.__new__":
            rec.mapped(int(args[0]))
        elif event in _OPAQUE_EVENTS:
            rec.opaque(f"the model {_OPAQUE_EVENTS[event]} ({event})")
    except Exception:  # noqa: BLE001  (an audit hook must never break the call it watches)
        rec.broken = True


def _install_hook() -> None:
    global _HOOK_INSTALLED
    with _HOOK_LOCK:
        if not _HOOK_INSTALLED:
            sys.addaudithook(_audit)
            _HOOK_INSTALLED = True


def _abs(path: Any) -> str:
    """The path as the build named it, made absolute — never resolved: a symlink re-pointed
    later is another input, so the path opened is what is recorded and checked."""
    if isinstance(path, int):
        return os.path.realpath(f"/proc/self/fd/{path}")
    return os.path.abspath(os.fsdecode(os.fspath(path)))


class Recorder:
    """What a build reads between :meth:`start` and :meth:`stop`: files opened (as named),
    paths probed (existing or not), directories listed, environment variables, modules
    imported and imports that failed; and whether it did something nothing observes
    (:attr:`ineligible` says what)."""

    def __init__(self, exclude: Iterable[Path | str] = ()) -> None:
        self.read: set[str] = set()
        self.written: set[str] = set()
        self.removed: set[str] = set()
        self.absent_at_open: set[str] = set()
        self.probed: set[str] = set()
        self.listed: set[str] = set()
        self.imports: set[str] = set()
        self.env: dict[str, str | None] = {}
        self.ineligible: str | None = None
        self.broken = False
        self._exclude = list(exclude)
        self._excluded: _Excluded | None = None
        self._modules: set[str] = set()
        self._new_modules: list[Any] = []
        self._undo: list[tuple[Any, str, Any]] = []
        self.start_ns = 0

    def opaque(self, why: str) -> None:
        if self.ineligible is None:
            self.ineligible = why

    def _mine(self, name: str) -> bool:
        """Whether ``name`` may be an input (the prefix test only: cheap enough for every open)."""
        ex = self._excluded
        return ex is None or not name.startswith(ex.prefixes)

    def saw(self, path: Any, mode: Any = None, flags: Any = None) -> None:
        if isinstance(path, int) or path is None:  # an already open descriptor
            return
        name = _abs(path)
        if isinstance(mode, str):
            writes = any(c in mode for c in "wax+")
        else:
            writes = isinstance(flags, int) and bool(flags & _WRITE_FLAGS)
        if writes:
            if name in self.read and name not in self.written and self._mine(name) and os.path.exists(name):
                # It read the file, then rewrote it: the next run would start from other bytes.
                self.opaque(f"the model rewrote {name}, which it had read")
            self.written.add(name)
            return
        self.read.add(name)
        if self._mine(name) and not os.path.exists(name):
            self.absent_at_open.add(name)  # a failed open: the build saw "no such file"

    def probe(self, path: Any) -> None:
        if isinstance(path, int):
            return
        name = _abs(path)
        if self._mine(name):
            self.probed.add(name)

    def listed_dir(self, path: Any) -> None:
        if isinstance(path, int) or path is None:
            return
        name = _abs(path)
        if self._mine(name):
            self.listed.add(name)

    def mapped(self, fileno: int) -> None:
        """A memory map of a file: covered when that file was opened (and so recorded) here."""
        if fileno < 0:
            return  # anonymous memory
        target = os.path.realpath(f"/proc/self/fd/{fileno}")
        if not any(os.path.realpath(p) == target for p in self.read):
            self.opaque(f"the model memory-mapped {target}, which it did not open through Python")

    def start(self) -> None:
        global _RECORDER
        _install_hook()
        self._excluded = _Excluded(self._exclude)
        self._modules = set(sys.modules)
        self.start_ns = time.time_ns()
        self._wrap()
        _RECORDER = self

    def stop(self) -> None:
        global _RECORDER
        if _RECORDER is self:
            _RECORDER = None
        self._unwrap()
        self._new_modules = [m for name, m in list(sys.modules.items()) if name not in self._modules]

    @contextlib.contextmanager
    def recording(self) -> Any:
        self.start()
        try:
            yield self
        finally:
            self.stop()

    # Reads no audit event reports: stat probes, the environment, native file readers.
    def _wrap(self) -> None:
        rec = self

        def patch(owner: Any, attr: str, make: Any) -> None:
            real = getattr(owner, attr, None)
            if real is None:
                return
            own = attr in vars(owner)  # inherited (a classmethod of a base): removed, not set, after
            self._undo.append((owner, attr, vars(owner)[attr] if own else _INHERITED))
            setattr(owner, attr, make(real))

        def probing(real: Any) -> Any:
            def wrapper(path: Any, *args: Any, **kwargs: Any) -> Any:
                if _RECORDER is rec:
                    rec.probe(path)
                return real(path, *args, **kwargs)

            return wrapper

        def reading(real: Any) -> Any:
            def wrapper(file: Any, *args: Any, **kwargs: Any) -> Any:
                if _RECORDER is rec and isinstance(file, (str, bytes, os.PathLike)):
                    rec.saw(file, "rb")
                return real(file, *args, **kwargs)

            return wrapper

        for attr in ("stat", "lstat", "access", "readlink"):
            patch(os, attr, probing)
        env_cls = type(os.environ)

        def getitem(real: Any) -> Any:
            def wrapper(mapping: Any, key: Any) -> Any:
                try:
                    value = real(mapping, key)
                except KeyError:
                    if _RECORDER is rec:
                        rec.read_env(os.fsdecode(key))
                    raise
                if _RECORDER is rec:
                    rec.read_env(os.fsdecode(key))
                return value

            return wrapper

        def iterating(real: Any) -> Any:
            def wrapper(mapping: Any) -> Any:
                if _RECORDER is rec and not rec.library_caller(depth=2):
                    rec.opaque("the model read the whole environment (iterated os.environ)")
                return real(mapping)

            return wrapper

        patch(env_cls, "__getitem__", getitem)
        patch(env_cls, "__iter__", iterating)
        torch_mod = sys.modules.get("torch")
        if torch_mod is not None:
            patch(torch_mod, "from_file", reading)
            jit = sys.modules.get("torch.jit")
            if jit is not None:  # TorchScript archives are read by C++, from the path
                patch(jit, "load", reading)
            patch(torch_mod.UntypedStorage, "from_file", lambda real: staticmethod(reading(real)))
        numpy_mod = sys.modules.get("numpy")
        if numpy_mod is not None:
            patch(numpy_mod, "fromfile", reading)

    def read_env(self, name: str) -> None:
        """An environment variable read: recorded when the model's code reads it, or when a
        library reads one of the stack's (a library iterating the environment to configure
        itself reads ``PWD`` and ``_`` too, which would make every shell another build)."""
        caller = sys._getframe(2).f_code
        if caller.co_name == "__iter__" and caller.co_filename.startswith("<frozen"):
            return  # a value read while iterating os.environ (items(), values()): see iterating()
        if name not in self.env and (name.startswith(_STACK_ENV) or not self.library_caller(depth=4)):
            self.env[name] = _INITIAL_ENV.get(name)

    def library_caller(self, depth: int = 3) -> bool:
        """Whether the code calling into ``os.environ`` is an installed library's (a package
        configuring itself at import, as networkx does), not the model's own."""
        frame: Any = sys._getframe(depth)
        while frame is not None and (
            frame.f_code.co_filename.startswith("<frozen") or frame.f_code.co_filename == os.__file__
        ):
            frame = frame.f_back
        if frame is None or self._excluded is None:
            return False
        name = os.path.abspath(frame.f_code.co_filename)
        return name.startswith(self._excluded.prefixes) or cache.is_etforge_source(name)

    def _unwrap(self) -> None:
        while self._undo:
            owner, attr, real = self._undo.pop()
            if real is _INHERITED:
                delattr(owner, attr)
            else:
                setattr(owner, attr, real)

    def dependencies(self, extra: Iterable[str] = ()) -> dict[str, dict[str, Any]] | None:
        """Each input (path as opened → its facts), or None when the build's inputs are not all
        known: a file changed while the build ran (its recorded hash might not be what the build
        read), one it read vanished, or it read something nothing observes (:attr:`ineligible`)."""
        if self.ineligible is not None:
            return None
        if (native := self._unobserved_native()) is not None:
            self.opaque(f"the model imported {native}, compiled code whose file reads are not observed")
            return None
        extra = [os.path.abspath(p) for p in extra]
        candidates = (self.read - self.written) | set(extra)
        for module in self._new_modules:
            origin = getattr(module, "__file__", None)
            if isinstance(origin, str):
                candidates.add(os.path.abspath(origin))
        excluded = _Excluded(self._exclude)
        written = {os.path.realpath(p) for p in self.written}
        removed = self.removed | {os.path.realpath(p) for p in self.removed}
        deps: dict[str, dict[str, Any]] = {}
        extra_paths = set(extra)
        for name in sorted(candidates):
            if name.startswith(excluded.prefixes) and name not in extra_paths:
                continue  # the common case, without resolving links
            real = os.path.realpath(name)
            if name not in extra_paths and (real in written or excluded(real)):
                continue
            try:
                st = os.stat(name)
            except OSError:
                if name in self.absent_at_open:
                    deps[name] = {"absent": True}
                    continue
                if name in removed or real in removed:
                    continue  # the build's own temporary
                self.opaque(f"{name}, which the model read, vanished during the build")
                return None
            if not stat.S_ISREG(st.st_mode):
                continue
            if _too_new(st, self.start_ns):
                return None  # changed while the build ran (ccache: "file too new")
            deps[name] = file_facts(name, st)
        for name in sorted(self.probed - set(deps) - self.written - removed):
            if excluded(name) or excluded(os.path.realpath(name)):
                continue
            deps[name] = {"probe": path_kind(name)}
        for name in sorted(self.listed):
            if not excluded(os.path.realpath(name)):
                deps[name] = {"listing": listing_hash(name)}
        return deps

    def environment(self) -> dict[str, str | None]:
        return dict(sorted(self.env.items()))

    def missing_modules(self) -> list[str]:
        """Imports tried and not found: installing one later is another build."""
        return sorted(m for m in self.imports if m not in sys.modules and "." not in m)

    def _unobserved_native(self) -> str | None:
        """A compiled module imported during the build that is neither the interpreter's own
        (its standard library) nor one of :data:`_OBSERVED_NATIVE`."""
        paths = sysconfig.get_paths()
        stdlib = {paths[k] for k in ("stdlib", "platstdlib") if k in paths}
        prefixes = tuple(
            {os.path.realpath(d).rstrip(os.sep) + os.sep for d in stdlib}
            | {os.path.abspath(d).rstrip(os.sep) + os.sep for d in stdlib}
        )
        allowed = {n.lstrip("_") for n in _OBSERVED_NATIVE}
        for module in self._new_modules:
            origin = getattr(module, "__file__", None)
            name = getattr(module, "__name__", "") or ""
            if (
                isinstance(origin, str)
                and origin.endswith(_NATIVE_SUFFIXES)
                and not os.path.realpath(origin).startswith(prefixes)
                and not os.path.abspath(origin).startswith(prefixes)
                and name.split(".", 1)[0].lstrip("_") not in allowed
            ):
                return name
        return None


def path_kind(path: str) -> str:
    """What a probe of ``path`` finds: absent, a directory, a file (with its size), other."""
    try:
        st = os.stat(path)
    except OSError:
        return "absent"
    if stat.S_ISDIR(st.st_mode):
        return "dir"
    return f"file {st.st_size}" if stat.S_ISREG(st.st_mode) else "other"


def listing_hash(path: str) -> str:
    """The names in a directory the build listed (a file added there may change the build)."""
    try:
        names = sorted(os.listdir(path))
    except OSError:
        return "unreadable"
    return hashlib.sha256("\0".join(names).encode("utf-8", "surrogateescape")).hexdigest()


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
    return {**_stat_facts(st or os.stat(path)), "sha256": sha256_file(path)}


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
        if real.startswith(self.prefixes) or cache.is_etforge_source(real) or _etforge_metadata(real):
            return True
        parts = Path(real).parts
        return real.endswith(".pyc") and "__pycache__" in parts


def _etforge_metadata(path: str) -> bool:
    """Whether ``path`` is etforge's own distribution metadata in a checkout (``etforge.egg-info``
    of an editable install): what it says (the plugins' entry points) is in the front key
    (``plugin_fingerprints``), and a reinstall rewrites it, same bytes, while a build reads it."""
    try:
        rel = Path(path).relative_to(cache.ROOT)
    except ValueError:
        return False
    return len(rel.parts) > 1 and rel.parts[0].endswith((".egg-info", ".dist-info"))


def _site_dirs() -> set[str]:
    """Where installed distributions live (their files are covered by their versions)."""
    dirs = set(site.getsitepackages()) if hasattr(site, "getsitepackages") else set()
    with contextlib.suppress(Exception):
        dirs.add(site.getusersitepackages())
    paths = sysconfig.get_paths()
    dirs.update(paths[k] for k in ("purelib", "platlib") if k in paths)
    return dirs
