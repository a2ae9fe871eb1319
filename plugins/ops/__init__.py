"""Built-in op plugins: one module per op family, each with its converters and quantizer rules."""
