"""mahabharatha: feature commands and the advisory locks that keep two sessions off one feature."""

__version__ = "0.1.0"
