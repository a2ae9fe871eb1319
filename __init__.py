"""etforge: compile PyTorch models for the NXP i.MX RT700 (eIQ Neutron NPU + Cortex-M33) via ExecuTorch.

The package root stays import-light: describing plugins must not pull in torch.
"""

from typing import TYPE_CHECKING, Any

from etforge.core.contracts.hookspecs import hookimpl

__version__ = "0.1.0"
__all__ = ["Compiled", "Target", "__version__", "compile", "hookimpl", "target"]

if TYPE_CHECKING:
    from etforge.api import Compiled, Target, compile, target


def __getattr__(name: str) -> Any:
    # The API imports torch; load it on first use so `etforge plugins` stays instant.
    if name in {"compile", "target", "Compiled", "Target"}:
        from etforge import api

        return getattr(api, name)
    raise AttributeError(f"module 'etforge' has no attribute {name!r}")
