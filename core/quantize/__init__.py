"""Quantization: one torchao PT2E quantizer composed from rule plugins, and the quantized program."""
