"""The command's deferred import of Inductor's post-grad passes (core/common/lazy_imports.py)."""

from __future__ import annotations

import subprocess
import sys

CODE = r"""
import sys
import torch
from etforge.core.common.lazy_imports import POST_GRAD, defer_inductor_post_grad

assert defer_inductor_post_grad()
import executorch.exir  # noqa: F401
from torch.export._remove_auto_functionalized_pass import unsafe_remove_auto_functionalized_pass

assert "torch._inductor.lowering" not in sys.modules, "deferred module was imported"


class Plain(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1


plain = torch.export.export(Plain(), (torch.zeros(2),), strict=False)
unsafe_remove_auto_functionalized_pass(plain)  # nothing to decompose: stays deferred
assert "torch._inductor.lowering" not in sys.modules, "loaded for a program without mutating ops"


@torch.library.custom_op("etforge_lazy_test::add_one_", mutates_args=("x",))
def add_one_(x: torch.Tensor) -> None:
    x.add_(1)


class M(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        torch.ops.etforge_lazy_test.add_one_(y)
        return y


x = torch.arange(3.0)
ep = torch.export.export(M(), (x,), strict=False).run_decompositions({})
hops = lambda p: [n for n in p.graph.nodes if "auto_functionalized" in str(n.target)]  # noqa: E731
assert hops(ep), ep.graph
ep = unsafe_remove_auto_functionalized_pass(ep)  # the deferred function, through the stand-in
assert not hops(ep), ep.graph
assert torch.equal(ep.module()(x), M()(x))
assert type(sys.modules[POST_GRAD]).__name__ == "module"  # the real one, now
print("ok")
"""


def test_deferred_post_grad_loads_on_first_use_and_works() -> None:
    proc = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


def test_an_already_imported_module_is_left_alone() -> None:
    code = (
        "import sys, torch._inductor.fx_passes.post_grad as real\n"
        "from etforge.core.common.lazy_imports import POST_GRAD, defer_inductor_post_grad\n"
        "assert not defer_inductor_post_grad() and sys.modules[POST_GRAD] is real\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
