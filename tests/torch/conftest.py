"""Fixtures of the torch frontend's tests."""
import pytest

from tests.torch.helpers import DEVICE_PARAMS, DEVICES


@pytest.fixture(params=DEVICE_PARAMS)
def device(request):
    """Each test using this fixture runs on cpu and (when present) cuda."""
    return request.param


@pytest.fixture
def devices():
    """The list of available devices, for tests that loop over them."""
    return list(DEVICES)
