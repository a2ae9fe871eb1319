"""Silence third-party noise in the CLI: what torch, torchao and ExecuTorch print is not the user's concern.

Installed once at CLI start, before torch is imported, because some of the noise comes from
import-time code (torchao's "Failed to load ..._C_mxfp8.so", pytree deprecations). ``-v``
skips it and shows everything. Errors are never silenced here: etforge reports them itself
as :class:`~etforge.core.common.errors.EtforgeError` lines. Only the libraries' own logs
are dropped (:func:`is_noise`): a plugin's or a model file's logger still reaches the user.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
import os
import re
import sys
import threading
import warnings
from collections.abc import Iterator

#: Modules whose ``UserWarning``s are library chatter (the user's own modules keep theirs).
THIRD_PARTY = r"(torch|torchao|executorch|ai_edge_litert|flatbuffers|tosa|numpy|copyreg|typing)(\.|$)"
#: Packages whose log records are library chatter: the compile stack and what it drives
#: (torch's graph library, lock files and progress bars; Ray for ``--ray``).
NOISY_LIBRARIES = (
    "torch", "torchao", "executorch", "ai_edge_litert", "flatbuffers", "tosa", "numpy",
    "networkx", "filelock", "tqdm", "ray",
)  # fmt: skip
_NOISY_NAME = re.compile(rf"({'|'.join(NOISY_LIBRARIES)})(\.|$)")


_STATE = {"quiet": False}
#: The start of torch's warning for an op ``torch.vmap`` runs one sample at a time.
VMAP_FALLBACK = "There is a performance drop because we have not yet implemented the batching rule"


@functools.cache
def _library_dirs() -> tuple[str, ...]:
    """The directories of :data:`NOISY_LIBRARIES` (found, not imported)."""
    dirs: list[str] = []
    for name in NOISY_LIBRARIES:
        with contextlib.suppress(ImportError, ValueError):
            spec = importlib.util.find_spec(name)
            if spec is not None and spec.submodule_search_locations:
                dirs += [os.path.join(d, "") for d in spec.submodule_search_locations]
    return tuple(dirs)


def is_noise(record: logging.LogRecord) -> bool:
    """A record a library logged: by its logger's name (``torch.fx``), or by the file that
    logged it (ExecuTorch logs on the root logger, and on loggers named after its files)."""
    return bool(_NOISY_NAME.match(record.name)) or str(record.pathname).startswith(_library_dirs())


_HANDLE = logging.Logger.handle


def _quiet_handle(self: logging.Logger, record: logging.LogRecord) -> None:
    """``Logger.handle`` that drops the libraries' records while quiet.

    No documented hook sees every record: torch gives its loggers their own handlers (and
    re-sets their levels when imported), ExecuTorch calls ``basicConfig`` and logs on the
    root logger. Every record passes through the ``handle`` of the logger it was logged on.
    """
    if _STATE["quiet"] and is_noise(record):
        return
    _HANDLE(self, record)


def install(verbose: bool = False) -> None:
    """Quiet mode for this process (a no-op with ``verbose``)."""
    if verbose:
        return
    _STATE["quiet"] = True
    # Library loggers (torchao's .so loader, torch's "W1123 ... _pytree.py" and its
    # fake-tensor tracebacks logged before an export error, ExecuTorch's "PassManager is
    # deprecated"); the user's and the plugins' loggers are left alone.
    logging.Logger.handle = _quiet_handle  # type: ignore[method-assign]
    # C++ glog/c10 warnings from torch's native code.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    # API deprecations inside libraries are for their developers.
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    # "No complete tensor found in the group!" (torch.export.save) and friends.
    warnings.filterwarnings("ignore", category=UserWarning, module=THIRD_PARTY)
    # torch.vmap on an op without a batching rule loops over the batch (the same values): raised
    # from the frame that called the op, an etforge module (verify's batched references).
    warnings.filterwarnings("ignore", message=VMAP_FALLBACK, category=UserWarning)


@contextlib.contextmanager
def native_stderr() -> Iterator[None]:
    """In quiet mode, what native code writes to stderr inside the block is dropped (LiteRT's
    "INFO: Created TensorFlow Lite XNNPACK delegate for CPU."); Python exceptions still
    propagate, so no error is hidden.

    File descriptor 2 is the process's, and ``verify`` opens LiteRT interpreters on more than
    one thread: the first block in redirects it and the last one out restores it, so blocks
    that overlap on two threads never restore each other's ``/dev/null``."""
    if not _STATE["quiet"]:
        yield
        return
    with _REDIRECT_LOCK:
        if not _REDIRECT["depth"]:
            sys.stderr.flush()
            devnull = os.open(os.devnull, os.O_WRONLY)
            _REDIRECT["saved"] = os.dup(2)
            os.dup2(devnull, 2)
            os.close(devnull)
        _REDIRECT["depth"] += 1
    try:
        yield
    finally:
        with _REDIRECT_LOCK:
            _REDIRECT["depth"] -= 1
            if not _REDIRECT["depth"]:
                os.dup2(_REDIRECT["saved"], 2)
                os.close(_REDIRECT["saved"])


_REDIRECT = {"depth": 0, "saved": -1}
_REDIRECT_LOCK = threading.Lock()


@contextlib.contextmanager
def scope() -> Iterator[None]:
    """The CLI's quiet mode for one call of the Python API, then the caller's settings back.

    ``etforge.compile`` and the ``etforge.target`` methods import and drive torch, torchao,
    ExecuTorch and LiteRT, whose chatter (the same as the CLI hides) would land in the
    user's notebook or script. The warning filters, ``Logger.handle`` and the native
    stderr mode are restored on exit; ``ETFORGE_VERBOSE=1`` keeps everything visible.
    Nested calls (``compile`` inside a method) leave the outer scope in charge.
    """
    if _STATE["quiet"] or os.environ.get("ETFORGE_VERBOSE", "") not in ("", "0"):
        yield
        return
    handle = logging.Logger.handle
    cpp_level = os.environ.get("TORCH_CPP_LOG_LEVEL")
    with warnings.catch_warnings():
        install()
        try:
            yield
        finally:
            _STATE["quiet"] = False
            logging.Logger.handle = handle  # type: ignore[method-assign]
            if cpp_level is None:
                os.environ.pop("TORCH_CPP_LOG_LEVEL", None)
            else:
                os.environ["TORCH_CPP_LOG_LEVEL"] = cpp_level
