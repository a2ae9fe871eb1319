"""pytest plugin (entry point ``pytest11``): the ``etforge_check`` fixture for op-plugin authors."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


@pytest.fixture
def etforge_check() -> Callable[..., Any]:
    """``etforge_check(module, example_inputs, target=..., quantize=True)``: see ``etforge.testing.check_op``."""
    from etforge.testing import check_op

    return check_op
