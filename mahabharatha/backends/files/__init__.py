"""The folder backend: the ``.lock`` protocol and its release watch."""
