"""What plugins implement: the hookspecs and the contracts they return (op converters, quantizer
rules, rewrites, targets, CPU backends, NPU compilers, partition checks, verify gates). Plugins reach them
through :mod:`etforge.sdk`."""
