"""Built-in graph rewrites (``etforge_rewrites``): one module per rewrite family."""
