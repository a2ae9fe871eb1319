"""A test double of NXP's proprietary eIQ Neutron SDK (``eiq_neutron_sdk``) -- tests only, never shipped.

It has the API surface etforge's adapter and ExecuTorch's NXP backend call
(``neutron_converter.CompilationContext``/``getNeutronTarget``/``convertModel`` and
``neutron_library_utils.isNeutronTarget``/``getNeutronTargets``), so the SDK path runs end to
end without the SDK. The environment variable ``ETFORGE_SDK_DOUBLE`` selects its behaviour:

``v1`` (default)  a converted model whose NeutronGraph node has the profile and debug outputs
                  besides the scratch buffer (upstream derives payload version 1 from them);
``v0``            the same without them (payload version 0);
``raise``         ``convertModel`` raises :data:`ERROR_MESSAGE`;
``abort``         ``convertModel`` aborts the process (SIGABRT), as a crashing native library does;
``hang``          ``convertModel`` never returns (after writing its pid to ``$ETFORGE_SDK_DOUBLE_PIDFILE``).

The "microcode", "weights" and "kernels" it emits are labelled filler bytes derived from
the input model: structurally what the SDK returns, not code any NPU could run.
"""

MODE_ENV = "ETFORGE_SDK_DOUBLE"
NUM_MACS_ENV = "ETFORGE_SDK_DOUBLE_NUM_MACS"
PIDFILE_ENV = "ETFORGE_SDK_DOUBLE_PIDFILE"  # mode hang: where to write its process id
MODES = ("v1", "v0", "raise", "abort", "hang")
ERROR_MESSAGE = "NeutronConverter: cannot legalize graph (eIQ Neutron SDK test double, mode 'raise')"
