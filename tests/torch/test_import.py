"""The package imports as the first import of a fresh interpreter, with no GPU needed (SPEC §1.1 item 3)."""
import subprocess
import sys


def test_import_first_in_fresh_process():
    code = "import transformer_engine_torch as tex; import torch; print(int(tex.DType.kFloat8E4M3), torch.__version__)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[0] == "7"
