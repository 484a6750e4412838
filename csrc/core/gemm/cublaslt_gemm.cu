// The one cuBLASLt wrapper (SPEC §6): GemmArgs -> matmul descriptor, layouts and preference, a heuristic query
// and one cublasLtMatmul on the caller's stream. The handle is cached per device and the heuristic's choice per
// request key (everything the query sees: device, types, shapes, leading dims, ops, scaling, epilogue, pointer
// alignments, workspace size), so a repeated call skips the query — the same algorithm, hence the same bits, at a
// fraction of the host time; nothing here synchronises the host or allocates while the stream is capturing a CUDA
// graph.
// Invariant: every cuBLASLt status is checked and turned into a message with the shapes, formats and arch.
#include <cublasLt.h>

#include <array>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "gemm.h"

namespace te {
namespace {


std::string arch_of_current_device() {
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
    return "cuda";
  }
  return "sm_" + std::to_string(major) + std::to_string(minor);
}

std::string operand_str(const char* name, const GemmOperand& x) {
  return std::string(name) + " [" + std::to_string(x.rows) + ", " + std::to_string(x.cols) + "] " +
         dtype_short_name(x.dtype) + (x.trans ? " (T)" : " (N)");
}

// "A [..] E4M3 (T), B [..] E4M3 (N), D [n, m] bf16, epilogue gelu_aux_bias, sm_90": what every error carries.
std::string describe(const GemmArgs& g) {
  const GemmDims d = gemm_dims(g);
  return operand_str("A", g.a) + ", " + operand_str("B", g.b) + ", D [" + std::to_string(d.n) + ", " +
         std::to_string(d.m) + "] " + dtype_short_name(g.d_dtype) + ", epilogue " + gemm_epilogue_name(g.epilogue) +
         ", " + arch_of_current_device();
}

void check_lt(cublasStatus_t st, const char* what, const GemmArgs& g) {
  if (st == CUBLAS_STATUS_SUCCESS) return;
  core_fail(std::string("generic_gemm: cuBLASLt ") + what + " failed with " + cublasLtGetStatusName(st) + " (" +
            describe(g) + ", cuBLASLt " + std::to_string(cublasLtGetVersion()) + ")");
}

void check_cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  core_fail(std::string("generic_gemm: ") + what + " failed: " + cudaGetErrorString(e));
}

cudaDataType_t cuda_type(DType d) {
  switch (d) {
    case DType::kFloat32: return CUDA_R_32F;
    case DType::kFloat16: return CUDA_R_16F;
    case DType::kBFloat16: return CUDA_R_16BF;
    case DType::kFloat8E4M3: return CUDA_R_8F_E4M3;
    case DType::kFloat8E5M2: return CUDA_R_8F_E5M2;
#if CUBLAS_VERSION >= 120800
    case DType::kFloat4E2M1: return CUDA_R_4F_E2M1;
#endif
    default: break;
  }
  core_fail(std::string("generic_gemm: dtype ") + dtype_short_name(d) +
            " has no cuBLASLt type here; accepted: fp32, fp16, bf16, E4M3, E5M2, E2M1");
}

bool is_fp8(DType d) { return d == DType::kFloat8E4M3 || d == DType::kFloat8E5M2; }

// Largest power of two (<= 256) dividing the address: the heuristics otherwise assume 256-byte alignment and may
// pick a kernel that faults on a row slice of a larger buffer (grouped single_output, views).
uint32_t alignment_of(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && (a % al) != 0) al /= 2;
  return al;
}

// ---- per-device handle ----------------------------------------------------------------------------------------
struct Caches {
  std::mutex mu;
  std::map<int, cublasLtHandle_t> handles;
};
Caches& caches() {
  static Caches* c = new Caches();  // leaked on purpose: destroying handles at exit races the CUDA runtime teardown
  return *c;
}

cublasLtHandle_t handle_for(int dev, const GemmArgs& g) {
  Caches& c = caches();
  std::lock_guard<std::mutex> lock(c.mu);
  auto it = c.handles.find(dev);
  if (it != c.handles.end()) return it->second;
  cublasLtHandle_t h = nullptr;
  check_lt(cublasLtCreate(&h), "handle creation", g);
  c.handles[dev] = h;
  return h;
}

// ---- the heuristic's choice per request ------------------------------------------------------------------------
constexpr int kKeyFields = 32;
using AlgoKey = std::array<int64_t, kKeyFields>;
struct AlgoKeyHash {
  size_t operator()(const AlgoKey& k) const {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the fields
    for (int64_t v : k) {
      h ^= uint64_t(v);
      h *= 1099511628211ull;
    }
    return size_t(h);
  }
};
struct AlgoCache {
  std::mutex mu;
  std::unordered_map<AlgoKey, cublasLtMatmulAlgo_t, AlgoKeyHash> algos;
};
AlgoCache& algo_cache() {
  static AlgoCache* c = new AlgoCache();  // leaked on purpose, as the handles
  return *c;
}

// RAII holders so that an early error never leaks a descriptor.
struct Desc {
  cublasLtMatmulDesc_t d = nullptr;
  ~Desc() { if (d) cublasLtMatmulDescDestroy(d); }
};
struct Layout {
  cublasLtMatrixLayout_t l = nullptr;
  ~Layout() { if (l) cublasLtMatrixLayoutDestroy(l); }
};
struct Pref {
  cublasLtMatmulPreference_t p = nullptr;
  ~Pref() { if (p) cublasLtMatmulPreferenceDestroy(p); }
};

template <typename T>
void set_attr(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const T& v, const char* name,
              const GemmArgs& g) {
  check_lt(cublasLtMatmulDescSetAttribute(d, a, &v, sizeof(T)), name, g);
}

bool is_fp8_block(GemmScaling s) { return s == GemmScaling::kFp8Block1d || s == GemmScaling::kFp8Block2d; }

// The one switch over scale modes (SPEC §6.6): per-tensor FP8 passes its scale_inv pointer, FP8 blocks their
// float32 scale matrices (the stored layouts of SPEC §4.8 are cuBLASLt's: 1x128 rows-contiguous per K block,
// 128x128 K-blocks contiguous per row tile), MXFP8 / NVFP4 their GEMM-swizzled E8M0 / E4M3 block scales.
void set_operand_scaling(cublasLtMatmulDesc_t desc, const GemmOperand& x, bool is_a, const GemmArgs& g) {
  int32_t mode = 0;
  switch (x.scaling) {
    case GemmScaling::kNone: return;
    case GemmScaling::kFp8PerTensor: mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F; break;
#if CUBLAS_VERSION >= 120900
    case GemmScaling::kFp8Block1d: mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F; break;
    case GemmScaling::kFp8Block2d: mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F; break;
    case GemmScaling::kMxfp8: mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0; break;
    case GemmScaling::kNvfp4: mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3; break;
#else
    default:
      core_fail(std::string("generic_gemm: not yet supported: ") + gemm_scaling_name(x.scaling) + " operand " +
                (is_a ? "A" : "B") + " needs cuBLASLt 12.9 headers at build time (" + describe(g) + ")");
#endif
  }
  set_attr(desc, is_a ? CUBLASLT_MATMUL_DESC_A_SCALE_MODE : CUBLASLT_MATMUL_DESC_B_SCALE_MODE, mode, "scale mode", g);
  set_attr(desc, is_a ? CUBLASLT_MATMUL_DESC_A_SCALE_POINTER : CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, x.scale_inv,
           "scale pointer", g);
}

cublasLtEpilogue_t lt_epilogue(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::kNone: return CUBLASLT_EPILOGUE_DEFAULT;
    case GemmEpilogue::kBias: return CUBLASLT_EPILOGUE_BIAS;
    case GemmEpilogue::kGeluAux: return CUBLASLT_EPILOGUE_GELU_AUX;
    case GemmEpilogue::kGeluAuxBias: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case GemmEpilogue::kDGelu: return CUBLASLT_EPILOGUE_DGELU;
    case GemmEpilogue::kDGeluBGrad: return CUBLASLT_EPILOGUE_DGELU_BGRAD;
    case GemmEpilogue::kBGradB: return CUBLASLT_EPILOGUE_BGRADB;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

// The row-major request as cuBLAS's column-major problem (see gemm.h): operand X [rows, cols] row-major is the
// column-major [cols, rows] matrix with ld = cols, and its flag passes through as the cuBLAS op.
struct Canonical {
  GemmDims dims;
  cublasOperation_t op_a, op_b;
  uint64_t a_rows, a_cols, b_rows, b_cols;  // column-major layout sizes
  int64_t lda, ldb, ldd;
};
Canonical canonicalize(const GemmArgs& g) {
  Canonical c;
  c.dims = gemm_dims(g);
  c.op_a = g.a.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  c.op_b = g.b.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  c.a_rows = uint64_t(g.a.cols);
  c.a_cols = uint64_t(g.a.rows);
  c.b_rows = uint64_t(g.b.cols);
  c.b_cols = uint64_t(g.b.rows);
  c.lda = g.a.cols;
  c.ldb = g.b.cols;
  c.ldd = c.dims.m;
  // FP8 kernels (per-tensor and block on Hopper/Ada) and NVFP4 ones exist for TN only; the bridge picks the stored
  // copies so that this holds. MXFP8 copies keep the tensor's shape and run in any layout.
  if (g.a.scaling != GemmScaling::kNone && g.a.scaling != GemmScaling::kMxfp8 && !(g.a.trans && !g.b.trans)) {
    core_fail("generic_gemm: FP8 operands must reach cuBLASLt as TN (A transposed, B not); pass the copy whose "
              "scaling runs along the contraction dim (" + describe(g) + ")");
  }
  // FP8 block scaling on sm_90 has kernels for these epilogues only (SPEC §6.2); the caller runs the rest apart.
  if (is_fp8_block(g.a.scaling) && g.epilogue != GemmEpilogue::kNone && g.epilogue != GemmEpilogue::kBias &&
      g.epilogue != GemmEpilogue::kDGelu) {
    throw GemmNoKernel(std::string("generic_gemm: FP8 block scaling has no fused ") +
                       gemm_epilogue_name(g.epilogue) + " epilogue (" + describe(g) + ")");
  }
  return c;
}

// The matmul descriptor of a request: compute type, ops, operand scaling, FP8 output fields and the epilogue.
void make_desc(Desc& desc, const GemmArgs& g, const Canonical& c) {
  const bool fp8_in = is_fp8(g.a.dtype) || is_fp8(g.b.dtype);
  const bool fp32_in = g.a.dtype == DType::kFloat32;
  const cublasComputeType_t compute =
      (fp32_in && g.allow_tf32) ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  check_lt(cublasLtMatmulDescCreate(&desc.d, compute, CUDA_R_32F), "descriptor creation", g);
  set_attr(desc.d, CUBLASLT_MATMUL_DESC_TRANSA, c.op_a, "TRANSA", g);
  set_attr(desc.d, CUBLASLT_MATMUL_DESC_TRANSB, c.op_b, "TRANSB", g);
  set_operand_scaling(desc.d, g.a, true, g);
  set_operand_scaling(desc.d, g.b, false, g);
  if (fp8_in) {
    // Only per-tensor FP8 has the fast-accumulation choice (SPEC §6.3); block scaling always splits.
    const int8_t fast = (g.fast_accum && g.a.scaling == GemmScaling::kFp8PerTensor) ? 1 : 0;
    set_attr(desc.d, CUBLASLT_MATMUL_DESC_FAST_ACCUM, fast, "FAST_ACCUM", g);
  }
  if (g.sm_count > 0) {
    const int32_t sms = g.sm_count;
    set_attr(desc.d, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, sms, "SM_COUNT_TARGET", g);
  }
  if (g.alpha_beta != nullptr) {
    const int32_t mode = CUBLASLT_POINTER_MODE_DEVICE;
    set_attr(desc.d, CUBLASLT_MATMUL_DESC_POINTER_MODE, mode, "POINTER_MODE", g);
  }
  if (is_fp8(g.d_dtype)) {
    set_attr(desc.d, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, static_cast<const void*>(g.d_scale), "D_SCALE_POINTER", g);
    set_attr(desc.d, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, static_cast<void*>(g.d_amax), "AMAX_D_POINTER", g);
  }
  const cublasLtEpilogue_t epi = lt_epilogue(g.epilogue);
  set_attr(desc.d, CUBLASLT_MATMUL_DESC_EPILOGUE, epi, "EPILOGUE", g);
  switch (g.epilogue) {
    case GemmEpilogue::kBias:
    case GemmEpilogue::kGeluAuxBias:
      set_attr(desc.d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias, "BIAS_POINTER", g);
      break;
    case GemmEpilogue::kDGeluBGrad:
    case GemmEpilogue::kBGradB:
      set_attr(desc.d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(g.bias_grad), "BIAS_POINTER", g);
      break;
    default: break;
  }
  if (g.epilogue != GemmEpilogue::kNone && g.epilogue != GemmEpilogue::kGeluAux && g.epilogue != GemmEpilogue::kDGelu) {
    const int32_t bt = cuda_type(g.bias_dtype);
    set_attr(desc.d, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bt, "BIAS_DATA_TYPE", g);
  }
  const bool has_aux = g.epilogue == GemmEpilogue::kGeluAux || g.epilogue == GemmEpilogue::kGeluAuxBias ||
                       g.epilogue == GemmEpilogue::kDGelu || g.epilogue == GemmEpilogue::kDGeluBGrad;
  if (has_aux) {
    set_attr(desc.d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<const void*>(g.aux), "AUX_POINTER", g);
    const int64_t ld = c.ldd;
    set_attr(desc.d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, ld, "AUX_LD", g);
    if (g.aux_dtype != g.d_dtype) {
      const int32_t at = cuda_type(g.aux_dtype);
      set_attr(desc.d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, at, "AUX_DATA_TYPE", g);
    }
  }
}

}  // namespace

size_t cublaslt_version() { return cublasLtGetVersion(); }

void cublaslt_prepare() {
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  handle_for(dev, GemmArgs{});
}

void gemm_cublaslt(const GemmArgs& g, cudaStream_t stream) {
  const Canonical c = canonicalize(g);
  if (c.dims.m == 0 || c.dims.n == 0 || c.dims.k == 0) {
    core_fail("generic_gemm: the cuBLASLt path needs m, n, k > 0; the bridge handles empty GEMMs (" + describe(g) +
              ")");
  }
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  cublasLtHandle_t handle = handle_for(dev, g);

  Desc desc;
  make_desc(desc, g, c);
  const bool fp8_out = is_fp8(g.d_dtype);

  // C is D (read only when beta != 0). With an FP8 D, C must be 16-bit; beta is 0 there (the bridge refuses
  // accumulation into FP8), so C is described as bias-typed and never read.
  const DType c_dtype = fp8_out ? (g.bias_dtype == DType::kFloat16 ? DType::kFloat16 : DType::kBFloat16) : g.d_dtype;
  // C == D is in-place to cuBLASLt, which then wants identical layouts; with an FP8 D, C points elsewhere: A's data
  // (device memory, 16-byte aligned), never read.
  const void* const c_ptr = fp8_out ? g.a.data : g.d;
  Layout la, lb, lc, ld;
  check_lt(cublasLtMatrixLayoutCreate(&la.l, cuda_type(g.a.dtype), c.a_rows, c.a_cols, c.lda), "layout A", g);
  check_lt(cublasLtMatrixLayoutCreate(&lb.l, cuda_type(g.b.dtype), c.b_rows, c.b_cols, c.ldb), "layout B", g);
  check_lt(cublasLtMatrixLayoutCreate(&lc.l, cuda_type(c_dtype), uint64_t(c.dims.m), uint64_t(c.dims.n), c.ldd),
           "layout C", g);
  check_lt(cublasLtMatrixLayoutCreate(&ld.l, cuda_type(g.d_dtype), uint64_t(c.dims.m), uint64_t(c.dims.n), c.ldd),
           "layout D", g);

  // Workspace (always the caller's: the bridge passes torch's cuBLASLt workspace of the stream when the user gave
  // none), aligned to 256 B.
  if (g.workspace == nullptr && g.workspace_bytes > 0) core_fail("generic_gemm: workspace_bytes without a workspace");
  void* const ws = gemm_align_workspace(g.workspace);
  const size_t lost = size_t(static_cast<char*>(ws) - static_cast<char*>(g.workspace));
  const size_t ws_bytes = g.workspace_bytes > lost ? g.workspace_bytes - lost : 0;

  // Everything the heuristic query sees (make_desc's attributes follow from these fields).
  const bool has_aux = g.epilogue == GemmEpilogue::kGeluAux || g.epilogue == GemmEpilogue::kGeluAuxBias ||
                       g.epilogue == GemmEpilogue::kDGelu || g.epilogue == GemmEpilogue::kDGeluBGrad;
  const AlgoKey key = {dev, int64_t(g.a.dtype), int64_t(g.b.dtype), int64_t(c_dtype), int64_t(g.d_dtype),
                       int64_t(g.a.dtype == DType::kFloat32 && g.allow_tf32), int64_t(c.op_a), int64_t(c.op_b),
                       int64_t(c.a_rows), int64_t(c.a_cols), c.lda, int64_t(c.b_rows), int64_t(c.b_cols), c.ldb,
                       c.dims.m, c.dims.n, c.ldd, int64_t(g.a.scaling), int64_t(g.b.scaling),
                       int64_t(g.fast_accum), int64_t(g.alpha_beta != nullptr), int64_t(g.epilogue),
                       int64_t(g.bias_dtype), has_aux ? int64_t(g.aux_dtype) : -1, int64_t(alignment_of(g.a.data)),
                       int64_t(alignment_of(g.b.data)), int64_t(alignment_of(c_ptr)), int64_t(alignment_of(g.d)),
                       int64_t(ws_bytes), int64_t(g.sm_count), 0, 0};
  AlgoCache& cache = algo_cache();
  {
    std::lock_guard<std::mutex> lock(cache.mu);
    const auto it = cache.algos.find(key);
    if (it != cache.algos.end()) {
      const cublasLtMatmulAlgo_t algo = it->second;
      const float alpha = g.alpha, beta = g.beta;
      const float* const pa = g.alpha_beta ? g.alpha_beta : &alpha;
      const float* const pb = g.alpha_beta ? g.alpha_beta + 1 : &beta;
      check_lt(cublasLtMatmul(handle, desc.d, pa, g.a.data, la.l, g.b.data, lb.l, pb, c_ptr, lc.l, g.d, ld.l, &algo,
                              ws, ws_bytes, stream),
               "matmul", g);
      return;
    }
  }

  Pref pref;
  check_lt(cublasLtMatmulPreferenceCreate(&pref.p), "preference creation", g);
  const uint64_t ws_pref = ws_bytes;
  check_lt(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_pref,
                                                sizeof(ws_pref)),
           "workspace preference", g);
  const std::pair<cublasLtMatmulPreferenceAttributes_t, const void*> aligned_ptrs[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, g.a.data}, {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, g.b.data},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, c_ptr}, {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, g.d}};
  for (const auto& ap : aligned_ptrs) {
    const uint32_t al = alignment_of(ap.second);
    check_lt(cublasLtMatmulPreferenceSetAttribute(pref.p, ap.first, &al, sizeof(al)), "alignment preference", g);
  }

  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(handle, desc.d, la.l, lb.l, lc.l, ld.l, pref.p, 1, &heur,
                                                           &found);
  if (hs != CUBLAS_STATUS_SUCCESS || found == 0) {
    throw GemmNoKernel(std::string("generic_gemm: cuBLASLt has no kernel for this GEMM (") + describe(g) + ", m=" +
              std::to_string(c.dims.m) + " n=" + std::to_string(c.dims.n) + " k=" + std::to_string(c.dims.k) +
              ", workspace " + std::to_string(ws_bytes) + " B, status " + cublasLtGetStatusName(hs) +
              "). Try another output dtype or epilogue, or keep this layer in bf16");
  }
  {
    std::lock_guard<std::mutex> lock(cache.mu);
    cache.algos.emplace(key, heur.algo);
  }
  const float alpha = g.alpha, beta = g.beta;
  const float* const pa = g.alpha_beta ? g.alpha_beta : &alpha;  // device scalars replace the host ones
  const float* const pb = g.alpha_beta ? g.alpha_beta + 1 : &beta;
  check_lt(cublasLtMatmul(handle, desc.d, pa, g.a.data, la.l, g.b.data, lb.l, pb, c_ptr, lc.l, g.d, ld.l, &heur.algo,
                          ws, ws_bytes, stream),
           "matmul", g);
}

}  // namespace te
