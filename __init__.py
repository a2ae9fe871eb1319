"""etforge: compile PyTorch models for the NXP i.MX RT700 (eIQ Neutron NPU + Cortex-M33) via ExecuTorch.

The package root stays import-light: describing plugins must not pull in torch.
"""

from etforge.core.hookspecs import hookimpl

__version__ = "0.1.0"
__all__ = ["__version__", "hookimpl"]
