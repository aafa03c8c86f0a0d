"""Names shared by every mahabharatha layer: folders and the files a feature folder holds."""

from typing import Final

GSD_DIR: Final = ".gsd"
"""Where feature specs, their locks and the current-feature marker live."""

STATE_DIR: Final = ".mahabharatha/state"
"""Per-feature state files; the newest one names the feature being worked on."""

AUDIT_LOG_NAME: Final = "lock-audit.jsonl"
"""One JSON line per reclaim, forced release and clean, in the gsd folder."""

COMPLETED_MARKER_NAME: Final = ".completed"
"""A finished feature's marker in its folder (an ISO-8601 time, like the repository's other
sentinels ``.started`` and ``.plan-complete``): ``claim`` never hands such a feature out. Both
backends mean the same by done: on PostgreSQL a local marker counts too."""
