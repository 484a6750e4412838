"""pytest plugin of tools/wheel_check.sh: the session tests the installed wheel, or it does not start.

Before any test runs, both packages and their compiled modules are imported and each file must lie under the
virtual environment's site-packages (TE_WHEEL_SITE); the files are printed, so the log shows what was tested. A
source tree on sys.path ahead of the wheel (the repository's packages, an editable install's finder) fails the
session here with the path that was picked up instead.
"""
import importlib
import os

import pytest

MODULES = ("transformer_engine_torch", "transformer_engine_torch._C", "transformer_engine_jax",
           "transformer_engine_jax._ffi")


def pytest_sessionstart(session):
    site = os.path.realpath(os.environ["TE_WHEEL_SITE"])
    report = session.config.pluginmanager.get_plugin("terminalreporter")
    for name in MODULES:
        path = importlib.import_module(name).__file__
        report.write_line(f"wheel_guard: {name} from {path}")
        if os.path.commonpath([site, os.path.realpath(path)]) != site:
            raise pytest.UsageError(f"wheel_guard: {name} was imported from {path}, not from the installed wheel "
                                    f"under {site}: the test would not test the wheel")
