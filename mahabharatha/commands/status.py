"""The status command's home; it re-exports ``detect_feature`` for existing callers."""

from mahabharatha.commands._utils import detect_feature

__all__ = ["detect_feature"]
