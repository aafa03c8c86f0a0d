"""The clock of every lock decision: :func:`now`, read once per operation and passed down;
``commands/_utils.py`` writes a test's ``_utils.time`` or ``_utils.now`` through to here."""

from __future__ import annotations

import time


def now() -> float:
    """Epoch seconds: ``time.time()`` of this module (tests replace ``time`` here)."""
    return float(time.time())
