"""pytest configuration for the whole suite.

The layout: tests/ref/ the oracle (pure-PyTorch references, one module per SPEC section, and their self-tests),
tests/torch/ the torch frontend's tests (helpers.py: devices, inputs, quantizer builders), tests/cpp/ checks of
csrc/core compiled on the host, tests/jax/ the JAX frontend's tests (they reach the same oracle through
`ref.as_torch`, DLPack). tests/ is a package: files import `from tests import ref` and
`from tests.torch.helpers import ...`, and pytest puts the repository root on sys.path.

Holds what would otherwise live in pytest.ini (markers, warning filters) so that the suite is
self-contained under tests/. GPU tests carry ``@pytest.mark.cuda`` and are skipped on machines
without CUDA; ``pytest -m cuda`` selects exactly them on a GPU machine.
"""
import logging
import os

import pytest
import torch

# torch and jax share one GPU in this process: without this, jax takes 75 % of its memory when it starts.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


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
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="CUDA not available")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(1234)
    yield
