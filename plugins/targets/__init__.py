"""Built-in target plugins (i.MX RT700 variants) and NPU compiler adapters."""
