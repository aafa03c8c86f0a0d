"""The clock of every lock decision, below every layer.

:func:`now` reads ``time.time()`` of this module, once per operation, and the operation passes
that ``now`` down (the ``.lock`` protocol reads no wall clock). The folder backend and the lock
layer read it here; the legacy face (:mod:`mahabharatha.commands._utils`) re-exports it and is
the contract's clock seam: a test that replaces ``_utils.time`` or ``_utils.now`` replaces them
here too (that module writes such a replacement through), so every layer keeps one clock.
"""

from __future__ import annotations

import time


def now() -> float:
    """Epoch seconds: ``time.time()`` of this module (tests replace ``time`` here)."""
    return float(time.time())
