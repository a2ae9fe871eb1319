"""Lowering: cut NPU partitions (early, or ExecuTorch's classic path), hand them to the NPU
backend, and check that every op left on the CPU has a kernel."""
