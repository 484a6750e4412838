"""The frontend-neutral planner (csrc/core/ops/plan.h) built without torch, as the JAX frontend will build it
(tests/cpp/ops_plan.cpp): output pieces, workspace layout and error kinds per quantizer. A few seconds to compile."""
import os
import subprocess

import pytest

from tests.cpp.test_e2m1_exhaustive import CORE, HERE, _compiler


def test_ops_plan_without_torch(tmp_path):
    cxx = _compiler()
    if cxx is None:
        pytest.skip("no C++ compiler on PATH")
    exe = str(tmp_path / "ops_plan")
    build = subprocess.run([cxx, "-O1", "-std=c++20", "-ffp-contract=off", "-I", CORE,
                            os.path.join(HERE, "ops_plan.cpp"), os.path.join(CORE, "ops", "plan.cpp"),
                            "-o", exe], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([exe], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["mxfp8", "ok", "fp8_current", "ok", "nvfp4", "ok", "dbias", "ok", "sharded", "ok",
                                  "once", "ok", "errors", "ok"]
