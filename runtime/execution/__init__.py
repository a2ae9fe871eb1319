"""Running a compiled program on the host.

``pte_interpreter`` runs ``model.pte`` instruction by instruction, ``pte_ops`` gives each
operator it names a host kernel (a CPU library's ops from its CPU backend plugin), ``host``
runs an Edge program (delegate calls through LiteRT), ``litert_run`` runs a LiteRT
partition with a chosen kernel set. Imports only ``runtime.arithmetic``.
"""
