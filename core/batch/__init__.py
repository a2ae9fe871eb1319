"""Many compiles at once: a manifest of models x targets x options, run in worker processes."""
