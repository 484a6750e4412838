"""The test suite as a package (layout: tests/conftest.py)."""
