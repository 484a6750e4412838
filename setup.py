"""Build of transformer_engine_torch._C.

CUDAExtension when a CUDA toolkit and a CUDA build of torch are present (TE_FORCE_CPU=1 turns it off),
otherwise a CPU-only CppExtension with every op on CPU. One arch by default: TORCH_CUDA_ARCH_LIST, or 9.0 when
it is unset (no GPU is queried). FMA contraction is off on host and device so CPU and CUDA round alike.
TE_DEBUG=1 builds with -O0 -g. MAX_JOBS defaults to the core count.
"""
import glob
import os

from setuptools import setup
from torch.utils import cpp_extension

HERE = os.path.dirname(os.path.abspath(__file__))


def sources(pattern):
    return sorted(os.path.relpath(p, HERE) for p in glob.glob(os.path.join(HERE, pattern)))


def with_cuda():
    if os.environ.get("TE_FORCE_CPU", "0") == "1":
        return False
    import torch

    return torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None


debug = os.environ.get("TE_DEBUG", "0") == "1"
opt = ["-O0", "-g"] if debug else ["-O3"]
cxx_flags = opt + ["-ffp-contract=off", "-fno-fast-math"]
srcs = sources("csrc/core/*.cpp") + sources("csrc/core/ops/*.cpp") + sources("csrc/torch/*.cpp")
os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 1))

if with_cuda():
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    nvcc_flags = opt + [
        "-fmad=false",
        "-Xcompiler=-ffp-contract=off",
        "-DTE_WITH_CUDA",
        "--expt-relaxed-constexpr",
        "-lineinfo",
    ]
    ext = cpp_extension.CUDAExtension(
        "transformer_engine_torch._C",
        srcs + sources("csrc/core/*.cu"),
        extra_compile_args={"cxx": cxx_flags + ["-DTE_WITH_CUDA"], "nvcc": nvcc_flags},
        libraries=["cublasLt"],  # the GEMM wrapper (csrc/core/cublaslt_gemm.cu); the CPU-only build needs none
    )
else:
    ext = cpp_extension.CppExtension(
        "transformer_engine_torch._C", srcs, extra_compile_args={"cxx": cxx_flags}
    )

setup(
    name="transformer_engine_torch",
    version="0.1.0",
    packages=["transformer_engine_torch"],
    ext_modules=[ext],
    cmdclass={"build_ext": cpp_extension.BuildExtension.with_options(use_ninja=True)},
)
