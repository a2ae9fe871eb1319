"""Firmware images of compiled programs: ExecuTorch's C++ runtime, CMSIS-NN and etforge's
generated registration, built for Cortex-M33 and run on QEMU (``etforge run``,
``etforge verify --runtime qemu-m33``; docs/firmware.md)."""
