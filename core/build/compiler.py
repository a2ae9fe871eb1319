"""The compile's old module name: :mod:`etforge.core.build.session` is the compile now.

Kept until the command line's compile imports the session directly (cli.py is being split
into a package on another branch)."""

from etforge.core.build.session import CompileResult, compile_model
from etforge.core.front.export import NchwAtEdges, adapt_layout

__all__ = ["CompileResult", "NchwAtEdges", "adapt_layout", "compile_model"]
