"""What a compiled program computes, in four rooms by role, each importing only the rooms
before it (``ROOMS``; ``tests/test_layers.py`` holds the order):

- ``arithmetic``: the device's integer arithmetic in numpy (LiteRT's and TFLM's kernels,
  gemmlowp's fixed point): the references an NPU op is held to. Imports no other room.
- ``execution``: running a program on the host: a ``.pte`` instruction by instruction, an
  Edge program, a LiteRT partition.
- ``verification``: ``etforge verify``: the gates that judge a compile, and their order.
- ``firmware``: the device: firmware images, QEMU runs, the conformance suite, device profiles.

A CPU library's own host arithmetic (CMSIS-NN's for ``cortex_m::`` ops) lives with its CPU
backend plugin, reached through ``CpuBackend``; runtime asks the plugin, never names it.
"""

#: The rooms in import order: each imports only from the ones before it.
ROOMS = ("arithmetic", "execution", "verification", "firmware")
