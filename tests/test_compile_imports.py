"""What a compile imports: package ``__init__``s deferred, torch's registration sources found
without reading source (core/common/lazy_imports.py, core/common/registration_source.py)."""

from __future__ import annotations

import subprocess
import sys

DEFERRED = r"""
import sys
import executorch.exir  # noqa: F401
from etforge.core.common.lazy_imports import DEFERRED_INITS, defer_package_inits

assert defer_package_inits() == list(DEFERRED_INITS)
from executorch.backends.cortex_m.passes.cortex_m_pass_manager import CortexMPassManager
from executorch.backends.cortex_m.quantizer.quantizer import CortexMQuantizer

# what the Cortex-M path needs, read from its modules; not the packages' every pass and partitioner
heavy = ("executorch.backends.arm._passes.arm_pass_manager", "executorch.backends.arm.quantizer.arm_quantizer",
         "executorch.backends.xnnpack.partition.xnnpack_partitioner", "executorch.backends.xnnpack._passes.fuse_batch_norm")
assert not [m for m in heavy if m in sys.modules], [m for m in heavy if m in sys.modules]
import executorch.backends.arm._passes as arm_passes
from executorch.backends.arm._passes import FoldAndAnnotateQParamsPass
from executorch.backends.arm._passes.fold_qdq_with_annotated_qparams_pass import FoldAndAnnotateQParamsPass as direct

assert FoldAndAnnotateQParamsPass is direct and "executorch.backends.arm._passes.arm_pass_manager" not in sys.modules
assert type(arm_passes).__name__ == "_DeferredInit"
assert CortexMQuantizer().transform_for_annotation is not None and CortexMPassManager.pass_list

# a name the __init__ binds otherwise (__all__) runs it in full, once: the package is itself from then on
import executorch.backends.xnnpack as xnnpack
assert "XnnpackPartitioner" in xnnpack.__all__
from executorch.backends.xnnpack import XnnpackPartitioner
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner as real
assert XnnpackPartitioner is real and type(xnnpack).__name__ == "module"
try:
    xnnpack.no_such_name
except AttributeError as exc:
    assert "no_such_name" in str(exc)
else:
    raise AssertionError("a missing name must raise AttributeError")
print("ok")
"""


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)


def test_deferred_package_inits_load_only_what_is_read() -> None:
    proc = _run(DEFERRED)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


def test_an_imported_package_is_not_deferred() -> None:
    code = (
        "import sys, executorch.backends.xnnpack as real\n"
        "from etforge.core.common.lazy_imports import defer_package_inits\n"
        "assert 'executorch.backends.xnnpack' not in defer_package_inits()\n"
        "assert sys.modules['executorch.backends.xnnpack'] is real and type(real).__name__ == 'module'\n"
    )
    proc = _run(code)
    assert proc.returncode == 0, proc.stderr[-3000:]


REGISTRATION = r"""
import inspect
import torch
from torch._library import utils
from etforge.core.common import registration_source

original = utils.get_source
assert registration_source.record_sources_cheaply() and utils.get_source is not original


def both():  # the caller of this function, as torch's own lookup and the cheap one give it
    return original(2), utils.get_source(2)


first, second = both()
a, b = (
    both()
)
assert first == second and a == b and first != a, (first, second, a, b)
assert first.endswith(f":{inspect.currentframe().f_lineno - 5}"), first

# a registration reads no source file: inspect.findsource is not called
def refuse(*args, **kwargs):
    raise AssertionError("findsource called")


inspect.findsource = refuse
lib = torch.library.Library("etforge_regsrc_test", "FRAGMENT")
lib.define("twice(Tensor x) -> Tensor")
lib.impl("twice", lambda x: x * 2, "CompositeExplicitAutograd")
line = inspect.currentframe().f_lineno + 1
torch.library.register_fake("etforge_regsrc_test::twice", lambda x: torch.empty_like(x), lib=lib)
try:
    torch.library.register_fake(
        "etforge_regsrc_test::twice", lambda x: torch.empty_like(x), lib=lib, allow_override=False
    )
except RuntimeError as exc:  # the second registration names the first one's file and line
    assert f"<string>:{line}" in str(exc), str(exc)
else:
    raise AssertionError("a second fake registration must be refused")
print("ok")
"""


def test_registration_source_is_torchs_string_without_reading_source() -> None:
    proc = _run(REGISTRATION)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
