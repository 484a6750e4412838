"""The JAX initialize stage's purpose, measured (issue 23): a jitted program that runs tej's activation and GEMM FFI
calls next to NCCL collectives (psums over every visible GPU, one of them independent of our calls so XLA may run it
while our kernels launch), in fresh processes with CUDA_MODULE_LOADING=LAZY, each under a timeout. With the initialize
stages (the default) every kernel module our calls launch is loaded before any thunk runs; TEJ_NO_INITIALIZE=1
registers the execute stages alone, so a module may load lazily while an NCCL kernel spins — the hazard the stage
exists for. Prints, per mode, how many runs passed, failed and hung, and writes a JSON report.

Usage: python tools/initialize_hang_check.py [--runs 50] [--gpus-per-run 2] [--per-set 2] [--timeout 90] [--json PATH]
Runs go in parallel, --per-set processes on each disjoint set of GPUs, NVLink multicast off in every process.
"""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROGRAM = r"""
import numpy as np
import jax, jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec as P
import transformer_engine_jax as tej

mesh = Mesh(np.array(jax.devices()), ("x",))
n = len(jax.devices())
sm = getattr(jax, "shard_map", None) or __import__("jax.experimental.shard_map", fromlist=["shard_map"]).shard_map

def body(x, w, other):
    h = tej.activation(x[:, None, :], ("gelu",))            # te_act_lu (JAX layout [..., 1, K] -> [..., K])
    y = tej.gemm(h, w, ((1,), (1,)))                        # te_gemm
    return jax.lax.psum(y, "x"), jax.lax.psum(other, "x")   # NCCL all-reduces, one independent of our calls

try:
    f = sm(body, mesh=mesh, in_specs=(P("x"), P(), P("x")), out_specs=(P(), P()), check_vma=False)
except TypeError:
    f = sm(body, mesh=mesh, in_specs=(P("x"), P(), P("x")), out_specs=(P(), P()))
key = jax.random.PRNGKey(0)
x = jax.random.normal(key, (256 * n, 1024), jnp.bfloat16)
w = jax.random.normal(key, (512, 1024), jnp.bfloat16)
other = jax.random.normal(key, (4096 * n, 4096), jnp.float32)
y, o = jax.jit(f)(x, w, other)
want = sum(np.asarray(tej.gemm(tej.activation(x[d * 256:(d + 1) * 256, None], ("gelu",)), w, ((1,), (1,))),
                      np.float32) for d in range(n))
got = np.asarray(y, np.float32)
assert np.abs(got - want).max() <= 2 ** -6 * np.abs(want).max(), "wrong psum"
print("ok")
"""


def gpu_count() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
        return sum(1 for line in out.splitlines() if line.startswith("GPU "))
    except (OSError, subprocess.SubprocessError):
        return 0


def run_mode(name, extra_env, runs, slots, timeout):
    """(passed, failed, hung, seconds) of `runs` fresh processes, len(slots) at a time."""
    base = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
                CUDA_MODULE_LOADING="LAZY", XLA_PYTHON_CLIENT_PREALLOCATE="false", NCCL_NVLS_ENABLE="0",
                TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1", **extra_env)
    result = {"passed": 0, "failed": 0, "hung": 0, "errors": []}
    t0 = time.time()
    todo = list(range(runs))
    while todo:
        batch, todo = todo[:len(slots)], todo[len(slots):]
        procs = [(subprocess.Popen([sys.executable, "-c", PROGRAM], env=dict(base, CUDA_VISIBLE_DEVICES=slot),
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), slot)
                 for _, slot in zip(batch, slots)]
        for p, slot in procs:
            try:
                out, err = p.communicate(timeout=timeout)
                if p.returncode == 0 and out.strip().endswith("ok"):
                    result["passed"] += 1
                else:
                    result["failed"] += 1
                    result["errors"].append(err.strip().splitlines()[-1:] if err.strip() else [f"rc {p.returncode}"])
            except subprocess.TimeoutExpired:
                p.kill()
                p.communicate()
                result["hung"] += 1
    result["seconds"] = round(time.time() - t0, 1)
    print(f"{name}: {result['passed']} passed, {result['failed']} failed, {result['hung']} hung (timeout {timeout} s) "
          f"of {runs} runs in {result['seconds']} s" + (f"; first error: {result['errors'][0]}" if result["errors"]
                                                         else ""), flush=True)
    return result


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--gpus-per-run", type=int, default=2)
    p.add_argument("--timeout", type=int, default=90)
    p.add_argument("--per-set", type=int, default=2, help="processes sharing one set of GPUs at a time")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args()
    n = gpu_count()
    if n < args.gpus_per_run:
        print(f"initialize_hang_check: needs {args.gpus_per_run} GPUs, {n} visible", file=sys.stderr)
        return 2
    k = args.gpus_per_run
    slots = [",".join(str(i) for i in range(s, s + k)) for s in range(0, n - k + 1, k)] * args.per_set
    report = {"gpus": n, "gpus_per_run": k, "per_set": args.per_set, "runs": args.runs, "timeout_s": args.timeout,
              "env": "CUDA_MODULE_LOADING=LAZY, NCCL_NVLS_ENABLE=0"}
    report["with_initialize"] = run_mode("with the initialize stages", {}, args.runs, slots, args.timeout)
    report["without_initialize"] = run_mode("without (TEJ_NO_INITIALIZE=1)", {"TEJ_NO_INITIALIZE": "1"}, args.runs,
                                            slots, args.timeout)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    ok = report["with_initialize"]["hung"] == 0 and report["with_initialize"]["failed"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
