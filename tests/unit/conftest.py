"""Fixtures shared by the unit specification of the legacy module."""

from typing import Any

import pytest

UTILS = "mahabharatha.commands._utils"
NOW = 1_700_000_000.5
"""The fixed clock of ``clock``: what the mocked ``time.time()`` of the module returns."""


@pytest.fixture
def clock(mocker: Any) -> Any:
    """Replace the module's ``time`` with a mock whose ``time()`` returns ``NOW``."""
    fake = mocker.Mock(spec=["time"])
    fake.time.return_value = NOW
    mocker.patch(f"{UTILS}.time", fake)
    return fake
