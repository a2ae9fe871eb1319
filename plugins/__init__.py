"""Built-in plugins, registered through this package's own `etforge` entry points."""
