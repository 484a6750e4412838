"""Tests of the torch frontend, transformer_engine_torch."""
