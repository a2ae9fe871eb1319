"""Device figures of a Neutron target, read from the eIQ Neutron SDK when it is installed.

ExecuTorch's NXP backend asks the SDK (``neutron_converter.getNeutronTarget(name)``) for the
NPU's MACs, units, pipes and hardware version instead of assuming them. etforge does the
same through the targets' ``NpuSpec.probe``: the query runs in an isolated child process
(the SDK is a native library that may crash), once per process; without the SDK nothing
runs and the spec's own figures stay, marked as assumptions where they are not NXP data.
"""

from __future__ import annotations

import importlib.util
import json
from typing import Any

SDK_MODULE = "eiq_neutron_sdk"
#: SDK attribute -> figure name used on ``NpuSpec``.
FIGURES = {
    "numMacs": "num_macs",
    "numUnits": "num_units",
    "numPipes": "num_pipes",
    "hwVersion": "hw_version",
    "subsystem": "subsystem",
}


def query_in_child(_: bytes, device: str) -> bytes:
    """Runs in the isolated child: the SDK's figures for ``device`` as JSON."""
    from eiq_neutron_sdk import neutron_converter  # type: ignore[import-not-found]

    target = neutron_converter.getNeutronTarget(device)
    # Newer SDKs nest the NPU's figures under ``npu``; older ones keep them on the target.
    info = getattr(target, "npu", None) or target
    out: dict[str, Any] = {}
    for attr, name in FIGURES.items():
        value = getattr(info, attr, None)
        if value is not None:
            out[name] = bool(value) if name == "subsystem" else int(value)
    return json.dumps(out, sort_keys=True).encode()


def read_figures(device: str | None) -> dict[str, Any]:
    """The SDK's figures for ``device``; {} when the SDK is not installed (no child is started)."""
    if not device or importlib.util.find_spec(SDK_MODULE) is None:
        return {}
    from etforge.sdk import run_isolated

    raw, _, _ = run_isolated(
        f"{__name__}:query_in_child", b"", f"eIQ Neutron SDK query of target {device}", 120, device=device
    )
    figures = json.loads(raw.decode())
    if "num_macs" in figures and figures["num_macs"] <= 0:
        from etforge.sdk import EtforgeError

        raise EtforgeError(f"eIQ Neutron SDK reports {figures['num_macs']} MACs for {device}")
    return figures


def device_problem(npu: Any) -> str:
    """Why the SDK's figures rule the chip out for these converters ("" if they do not, or
    without the SDK): its hardware version must be one of ``choices["hw_versions"]`` and, with
    ``requires`` ``not_subsystem``, it must not be a Neutron-S subsystem (upstream's checks)."""
    figures = npu.vendor_figures()
    versions = npu.choices.get("hw_versions")
    if versions is not None and "hw_version" in figures and figures["hw_version"] not in versions:
        return (
            f"the eIQ Neutron SDK reports hardware version {figures['hw_version']} for {npu.device}; "
            f"the {npu.family} converters target {', '.join(map(str, versions))} (npu choices hw_versions)"
        )
    if npu.requirement("not_subsystem") and figures.get("subsystem"):
        return (
            f"the eIQ Neutron SDK reports {npu.device} as a Neutron-S subsystem; the {npu.family} "
            "converters target Neutron-C (npu not_subsystem)"
        )
    return ""
