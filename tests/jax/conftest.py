"""Fixtures of the JAX tests."""
import pytest


@pytest.fixture
def jax_on_cpu(request):
    """Pins a test to jax's CPU device, also on a machine whose default jax device is a GPU: the tests that compare
    tej's CPU handler (or its jnp code) with tex's CPU kernels. Tests marked cuda place their arrays themselves."""
    if request.node.get_closest_marker("cuda"):
        yield
        return
    import jax

    with jax.default_device(jax.devices("cpu")[0]):
        yield
