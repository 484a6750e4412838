"""Checks of csrc/core compiled on the host."""
