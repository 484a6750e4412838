"""Build of transformer_engine_torch._C and, when jax is installed, transformer_engine_jax._ffi.

CUDAExtension when a CUDA toolkit and a CUDA build of torch are present (TE_FORCE_CPU=1 turns it off),
otherwise a CPU-only CppExtension with every op on CPU. One arch by default: TORCH_CUDA_ARCH_LIST, or 9.0 when
it is unset (no GPU is queried); an entry's "+PTX" adds that arch's portable PTX (gencode_flags; `make wheel` builds
"9.0+PTX"). FMA contraction is off on host and device so CPU and CUDA round alike.
TE_DEBUG=1 builds with -O0 -g. MAX_JOBS defaults to the core count.

The grouped GEMM's tensor-core kernels (csrc/core/gemm/cutlass) need the CUTLASS 3.x headers: TE_CUTLASS_INCLUDE, or
third_party/cutlass_include (`make install` fetches it: tools/fetch_cutlass.sh). They need sm_90a, so a 9.0 in the arch
list becomes 9.0a. Without the headers (or with TE_NO_CUTLASS=1: CI, which has no GPU, skips these slow-to-compile
units) the grouped GEMM runs its portable CUDA kernel instead (slow, same rules).

The collective GEMM's NCCL transport for JAX (csrc/core/comm/nccl_comm.cpp) needs only nccl.h at build time (the
toolkit's or the nvidia-nccl wheel's): NCCL is opened at run time, so nothing links it and a process without it
imports and runs everything else. Without the header the JAX FFI form of the collective GEMM is left out.

The kernel core (csrc/core) is compiled once: _C links it with the torch bridge (csrc/torch), _ffi links the same
objects with the XLA FFI handlers (csrc/jax; headers from the installed jaxlib's jax.ffi.include_dir(), pybind11
for the module) and links no torch library. TE_NO_JAX=1 skips _ffi.
"""
import glob
import os

from setuptools import find_packages, setup
from torch.utils import cpp_extension

HERE = os.path.dirname(os.path.abspath(__file__))


def sources(pattern):
    return sorted(os.path.relpath(p, HERE) for p in glob.glob(os.path.join(HERE, pattern), recursive=True))


def heavy_first(srcs):
    """The sources with the slowest translation units first. Ninja starts jobs in the order the build lists them, so
    in alphabetical order a 65 s unit (producers/instances/act_*_bwd.cu) started 54 s into a clean build and set its
    end (H200, 16 jobs: 119 s of compiling for 94 s of work; docs/building.md). Measured classes, slowest first: the
    activation instances without a block format (50-70 s), the CUTLASS grouped GEMMs (53-62 s) and the norm
    forward's units (one per output kind: together they were one unit of 80-90 s), the _mx / _nv instances (20-35 s),
    the torch bridge's units (LibTorch's headers: 9-23 s), the rest (under 10 s). The sort is stable, so each class
    stays sorted. Setuptools sorts an extension's sources by name before compiling them (build_ext), so
    BuildExtension below applies this order to what it hands the compiler."""
    def rank(path):
        if os.sep + "instances" + os.sep in path:
            return 2 if path.endswith(("_mx.cu", "_nv.cu")) else 0
        if os.sep + "cutlass" + os.sep in path or os.sep + "norm_fwd_" in path:
            return 1
        return 3 if os.path.join("csrc", "torch", "") in path else 4
    return sorted(srcs, key=rank)


def with_cuda():
    if os.environ.get("TE_FORCE_CPU", "0") == "1":
        return False
    import torch

    return torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None


debug = os.environ.get("TE_DEBUG", "0") == "1"
opt = ["-O0", "-g"] if debug else ["-O3"]
cxx_flags = opt + ["-ffp-contract=off", "-fno-fast-math"]
# Python's own CFLAGS carry -g, which made 34 of _C's 36 MB (CPU build) debug info: left out at link time unless
# TE_DEBUG, so a wheel ships code, not DWARF.
link_flags = [] if debug else ["-Wl,--strip-debug"]
core_srcs = sources("csrc/core/**/*.cpp")
torch_srcs = sources("csrc/torch/*.cpp")
os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 1))


def cutlass_include():
    if os.environ.get("TE_NO_CUTLASS", "0") == "1":
        return None
    for d in (os.environ.get("TE_CUTLASS_INCLUDE", ""), os.path.join(HERE, "third_party", "cutlass_include")):
        if d and os.path.isfile(os.path.join(d, "cutlass", "gemm", "group_array_problem_shape.hpp")):
            return d
    return None

def nccl_include():
    """The directory holding nccl.h (the CUDA toolkit's, or the nvidia-nccl wheel's that torch brings), or None: the
    collective GEMM's NCCL transport (csrc/core/comm/nccl_comm.cpp) opens NCCL at run time and needs only the header."""
    dirs = [os.path.join(cpp_extension.CUDA_HOME or "", "include"), "/usr/local/include", "/usr/include"]
    try:
        import nvidia.nccl

        dirs = [os.path.join(p, "include") for p in nvidia.nccl.__path__] + dirs
    except ImportError:
        pass
    return next((d for d in dirs if os.path.isfile(os.path.join(d, "nccl.h"))), None)


def gencode_flags(archs):
    """nvcc's -gencode flags for TORCH_CUDA_ARCH_LIST entries "X.Y", "X.Ya" and either with "+PTX": SASS for each
    entry as written, and for a "+PTX" entry also the PTX of X.Y without the "a", since an arch-specific target's PTX
    (compute_90a) loads on that arch only, while compute_90's is compiled by the driver for any newer GPU. Written out
    here rather than left to torch, whose "9.0a+PTX" would ship compute_90a PTX. Any flag containing "arch" makes
    torch add none of its own."""
    flags = []
    for entry in archs:
        arch, _, ptx = entry.partition("+")
        if ptx not in ("", "PTX") or not arch.replace("a", "").replace(".", "").isdigit():
            raise ValueError(f"TORCH_CUDA_ARCH_LIST: {entry!r} is not an arch (X.Y, X.Ya, optionally +PTX)")
        num = arch.replace(".", "")
        flags.append(f"-gencode=arch=compute_{num},code=sm_{num}")
        if ptx:
            base = num.rstrip("a")
            flags.append(f"-gencode=arch=compute_{base},code=compute_{base}")
    return flags


if with_cuda():
    cutlass = cutlass_include()
    nccl = nccl_include()
    if nccl is not None:
        cxx_flags += ["-DTE_WITH_NCCL", "-isystem", nccl]
    archs = os.environ.get("TORCH_CUDA_ARCH_LIST", "9.0").replace(";", " ").split()
    if cutlass is not None:  # wgmma: the Hopper-specific target
        archs = [a.replace("9.0", "9.0a", 1) if a.split("+")[0] == "9.0" else a for a in archs]
    nvcc_flags = gencode_flags(archs) + opt + [
        "-fmad=false",
        "-Xcompiler=-ffp-contract=off",
        "-DTE_WITH_CUDA",
        "--expt-relaxed-constexpr",
        "-lineinfo",
        "-DNDEBUG",  # device asserts are calls, which serialize CUTLASS's wgmma pipeline
    ]
    cu_srcs = sources("csrc/core/**/*.cu")
    if cutlass is not None:
        nvcc_flags += ["-DTE_WITH_CUTLASS", "-isystem", cutlass]
    else:
        print("transformer_engine_torch: no CUTLASS headers (tools/fetch_cutlass.sh); the grouped GEMM uses its "
              "portable CUDA kernel")
        cu_srcs = [f for f in cu_srcs if os.sep + "cutlass" + os.sep not in f]
    core_srcs += cu_srcs
    ext = cpp_extension.CUDAExtension(
        "transformer_engine_torch._C",
        core_srcs + torch_srcs,
        extra_compile_args={"cxx": cxx_flags + ["-DTE_WITH_CUDA"], "nvcc": nvcc_flags},
        libraries=["cublasLt"],  # the GEMM wrapper (csrc/core/gemm/cublaslt_gemm.cu); the CPU-only build needs none
        extra_link_args=link_flags,
    )
else:
    ext = cpp_extension.CppExtension(
        "transformer_engine_torch._C", core_srcs + torch_srcs, extra_compile_args={"cxx": cxx_flags},
        extra_link_args=link_flags,
    )

JAX_EXT = "transformer_engine_jax._ffi"


def jax_extension(cuda):
    """The XLA FFI module, or None when jax is not installed (or TE_NO_JAX=1)."""
    if os.environ.get("TE_NO_JAX", "0") == "1":
        return None
    try:
        import jax
        import pybind11
    except ImportError:
        return None
    from setuptools import Extension

    defines = ["-DTE_WITH_CUDA"] if cuda else []
    # _ffi loads without torch, so it finds cuBLASLt and the CUDA runtime itself: the toolkit's (a source build), or
    # in an installed wheel those of the nvidia-* wheels next to it (CUDA 13: nvidia/cu13/lib; CUDA 12: one folder
    # per library), which jax's and torch's CUDA wheels install.
    wheel_libs = ["$ORIGIN/../nvidia/cu13/lib", "$ORIGIN/../nvidia/cublas/lib", "$ORIGIN/../nvidia/cuda_runtime/lib"]
    cuda_lib = [os.path.join(cpp_extension.CUDA_HOME, "lib64")] if cuda else []
    return Extension(
        JAX_EXT,
        sources("csrc/jax/*.cpp"),
        include_dirs=[pybind11.get_include()] + ([os.path.join(cpp_extension.CUDA_HOME, "include")] if cuda else []),
        # -isystem: the FFI headers' own warnings (-Wreturn-type in api.h) are jaxlib's, not ours
        extra_compile_args={"cxx": cxx_flags + ["-isystem", jax.ffi.include_dir(), "-fvisibility=hidden"] + defines},
        libraries=["cublasLt", "cudart"] if cuda else [],
        library_dirs=cuda_lib,
        runtime_library_dirs=cuda_lib + (wheel_libs if cuda else []),
        extra_link_args=link_flags,
        language="c++",
    )


class BuildExtension(cpp_extension.BuildExtension):
    """Builds _C first, then links _ffi against the core objects _C compiled (one compile of the kernels). The
    sources reach the compiler (torch's ninja file, whose order ninja keeps for jobs of equal weight) slowest first
    (heavy_first), not in the name order setuptools sorts them into."""

    def build_extension(self, ext):
        if ext.name == JAX_EXT:
            ext.extra_objects = self.compiler.object_filenames(core_srcs, output_dir=self.build_temp)
        compile_sorted = self.compiler.compile
        self.compiler.compile = lambda sources, *a, **k: compile_sorted(heavy_first(list(sources)), *a, **k)
        try:
            super().build_extension(ext)
        finally:
            self.compiler.compile = compile_sorted


def torch_requirement():
    """The torch a wheel of this build runs under: _C links LibTorch's C++ ABI, which changes between torch
    releases, so the release it was built against (any local build of it: +cpu, +cu132)."""
    import torch

    return f"torch=={torch.__version__.split('+')[0]}"


jax_ext = jax_extension(with_cuda())
setup(
    name="transformer_engine_torch",
    version="0.1.0",
    packages=find_packages(include=["transformer_engine_torch", "transformer_engine_torch.*", "transformer_engine_jax",
                                    "transformer_engine_jax.*"]),
    install_requires=[torch_requirement()],
    ext_modules=[ext] + ([jax_ext] if jax_ext is not None else []),
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
