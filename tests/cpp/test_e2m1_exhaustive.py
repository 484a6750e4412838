"""The E2M1 encoders checked over every FP32 input on the host (tests/cpp/e2m1_exhaustive.cpp): e2m1_encode against
SPEC §2's thresholds, and the table kernels' branch-free encoder (capped and uncapped) against e2m1_encode. The
device copies of these encoders are the same source; the CUDA parity tests cover them through the kernels. Compiled
here with the host compiler that builds the package (about 40 s on two cores)."""
import os
import shutil
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
CORE = os.path.join(os.path.dirname(os.path.dirname(HERE)), "csrc", "core")


def _compiler():
    for name in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def test_e2m1_encoders_exhaustive(tmp_path):
    cxx = _compiler()
    if cxx is None:
        pytest.skip("no C++ compiler on PATH")
    exe = str(tmp_path / "e2m1_exhaustive")
    # -ffp-contract=off as in the package's host build: no FMA contraction the encoders do not spell out.
    build = subprocess.run([cxx, "-O2", "-march=native", "-std=c++17", "-pthread", "-ffp-contract=off", "-I", CORE,
                            os.path.join(HERE, "e2m1_exhaustive.cpp"), "-o", exe],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([exe], capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr
    got = {}
    for line in run.stdout.splitlines():
        name, _, checked, _, mismatches = line.split()
        got[name] = (int(checked), int(mismatches))
    nan_patterns = 2 * (2**23 - 1)  # exponent all ones, mantissa non-zero, either sign
    below_7 = 2 * 0x40E00000  # non-negative patterns below 7.0 = 0x40E00000, either sign
    assert got == {
        "e2m1_encode_vs_spec": (2**32, 0),
        "pack8_nonan_capped": (2**32 - nan_patterns, 0),
        "pack8_nonan_uncapped": (below_7, 0),
    }
