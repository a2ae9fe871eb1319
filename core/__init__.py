"""The plugin-agnostic core: it names no op and no chip."""
