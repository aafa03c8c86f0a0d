"""Folder names shared by every mahabharatha command."""

from typing import Final

GSD_DIR: Final = ".gsd"
"""Where feature specs, their locks and the current-feature marker live."""

STATE_DIR: Final = ".mahabharatha/state"
"""Per-feature state files; the newest one names the feature being worked on."""
