"""pytest configuration for the transformer_engine_torch suite.

Holds what would otherwise live in pytest.ini (markers, warning filters) so that the suite is
self-contained under tests/. GPU tests carry ``@pytest.mark.cuda`` and are skipped on machines
without CUDA; ``pytest -m cuda`` selects exactly them on a GPU machine.
"""
import logging
import os
import sys

import pytest
import torch

# reference.py and helpers.py are imported as plain modules by the test files.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from helpers import DEVICE_PARAMS, DEVICES, HAS_CUDA  # noqa: E402


def pytest_configure(config):
    # pytest.ini equivalent
    config.addinivalue_line("markers", "cuda: needs a CUDA device (skipped when torch.cuda.is_available() is False)")
    config.addinivalue_line("markers", "slow: slower tests (torch.compile)")
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning:torch.*")
    config.addinivalue_line("filterwarnings", "ignore::FutureWarning")
    # torch.compile's structured trace logger emits DEBUG records for tlparse; keep them out of
    # pytest's captured-log sections so failure reports stay readable.
    logging.getLogger("torch.__trace").propagate = False
    if getattr(config.option, "log_level", None) is None:
        config.option.log_level = "WARNING"


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="CUDA not available")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(params=DEVICE_PARAMS)
def device(request):
    """Each test using this fixture runs on cpu and (when present) cuda."""
    return request.param


@pytest.fixture
def devices():
    """The list of available devices, for tests that loop over them."""
    return list(DEVICES)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(1234)
    yield
