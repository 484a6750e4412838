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


@pytest.fixture
def run_on_cpu_mesh():
    """Runs a script in a subprocess with 8 CPU devices (jax fixes the device count when it starts) and asserts that
    it exits cleanly and prints "ok" last."""
    import os
    import subprocess
    import sys

    def run(script: str) -> None:
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu",
                   PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-4000:]
        assert out.stdout.strip().endswith("ok")

    return run


@pytest.fixture
def same_bytes_with_command_buffers():
    """Runs a script (which prints a digest of its results) in a subprocess twice on the GPU, without and with XLA
    command buffers recording custom calls, and asserts both printed the same digest."""
    import os
    import subprocess
    import sys

    def run(script: str) -> None:
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   XLA_PYTHON_CLIENT_PREALLOCATE="false")
        runs = {}
        for flags in ("--xla_gpu_enable_command_buffer=", "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL "
                      "--xla_gpu_graph_min_graph_size=1"):
            out = subprocess.run([sys.executable, "-c", script], env=dict(env, XLA_FLAGS=flags), capture_output=True,
                                 text=True, timeout=300)
            assert out.returncode == 0, out.stderr[-3000:]
            runs[flags] = out.stdout.strip()
        assert len(set(runs.values())) == 1, runs

    return run
