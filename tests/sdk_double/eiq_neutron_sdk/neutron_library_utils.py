"""Target queries of the eIQ Neutron SDK test double."""

from __future__ import annotations

from eiq_neutron_sdk.neutron_converter import TARGETS, NeutronTarget


def isNeutronTarget(name: str) -> bool:  # noqa: N802  (the SDK's spelling)
    return isinstance(name, str) and name in TARGETS


def getNeutronTargets() -> list[NeutronTarget]:  # noqa: N802
    return [TARGETS[n]() for n in sorted(TARGETS)]
