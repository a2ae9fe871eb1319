"""Errors that name their culprit; the CLI maps them to exit code 1 without a traceback."""


class EtforgeError(Exception):
    """A user-facing failure (bad model, bad option, plugin failure, ...)."""


class PluginError(EtforgeError):
    """A plugin failed to load or broke the hook contract."""


class ConversionError(EtforgeError):
    """A converter met something it cannot convert; names the node and op."""

    def __init__(self, node: object, op: str, message: str) -> None:
        super().__init__(f"cannot convert node {getattr(node, 'name', node)!s} ({op}): {message}")
        self.node_name = str(getattr(node, "name", node))
        self.op = op
