// One CUTLASS 3.x Hopper grouped GEMM (warp-specialized cooperative, TMA, persistent, pointer-array) per operand
// pairing, with its problem shapes read on the device: the setup kernel (grouped_gemm_cuda.cuh) writes, per group,
// the problem [rows, n, k], the operand and output pointers, their strides and (FP8) alpha = s_lhs·s_rhs[g] into
// the caller's workspace; the kernel's tile scheduler reads them there, so no size crosses to the host.
// CUTLASS's names: A = lhs [rows, k] (K-major), B = rhs[g] as (n, k) — K-major for [n, k], N-major for [k, n] —,
// D = out [rows, n] row-major; beta = 0 and no C operand. The wgrad form: problem (n, k, rows), A = dy rows as (n, rows)
// (M-major), B = x rows as (k, rows) (N-major), D = d[g] [n, k]; a group without rows is given no tiles (the setup
// kernel zeroes its d[g]).
#pragma once

#include <string>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/detail/blockwise_scale_layout.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"

#include "../grouped_gemm_cuda.cuh"
#include "../grouped_cutlass.h"

namespace te {
namespace grouped {

// bf16: 256x128x64 tiles. FP8 FastAccum: 256x128x128. FP8 with promotion keeps a second set of FP32 accumulators,
// so 128x128x128 tiles (larger ones spill registers).
template <class EA, class EB, class LayoutB, bool kFp8, bool kFast = false,
          class LayoutA_ = cutlass::layout::RowMajor>
struct CutlassConfig {
  using ElementA = EA;
  using ElementB = EB;
  using ElementD = cutlass::bfloat16_t;
  using LayoutA = LayoutA_;
  using LayoutD = cutlass::layout::RowMajor;
  using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;
  static constexpr int kAlignA = 16 / int(sizeof(EA));
  static constexpr int kAlignB = 16 / int(sizeof(EB));
  static constexpr int kAlignD = 8;
  using TileShape = cute::conditional_t<
      kFp8, cute::conditional_t<kFast, cute::Shape<cute::_256, cute::_128, cute::_128>,
                                cute::Shape<cute::_128, cute::_128, cute::_128>>,
      cute::Shape<cute::_256, cute::_128, cute::_64>>;
  using KernelSchedule = cute::conditional_t<kFast, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8FastAccum,
                                             cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>;
  using ClusterShape = cute::Shape<cute::_1, cute::_2, cute::_1>;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD*, kAlignD, ElementD, LayoutD*,
      kAlignD, cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
      cutlass::epilogue::fusion::LinearCombination<ElementD, float, void, float>>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, EA, LayoutA*, kAlignA, EB, LayoutB*, kAlignB, float,
      TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;
};

// FP8 blocks (lhs 1x128, rhs 128x128): CUTLASS's blockwise-scaled pointer-array kernel, which multiplies each
// 128-deep K step's FP32 partial sums by its two scales as it accumulates (promotion every block), 128x128x128
// tiles. Both scale operands are K-major in the kernel: lhs [rows, ceil(k/128)] from a group's first row on, rhs[g]
// [ceil(n/128), ceil(k/128)] — the prep kernel below lays them out so from the stored SPEC §4.8 shapes.
template <class EA, class EB> struct CutlassBlockConfig {
  using ElementA = EA;
  using ElementB = EB;
  using ElementD = cutlass::bfloat16_t;
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutB = cutlass::layout::ColumnMajor;
  using LayoutD = cutlass::layout::RowMajor;
  using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;
  static constexpr int kAlignA = 16, kAlignB = 16, kAlignD = 8;
  // Spelled as depending on EA: the host compiler then defers the builders to instantiation (a non-dependent
  // epilogue builder inside a class template fails to parse in gcc).
  using TileShape = cute::conditional_t<sizeof(EA) == 1, cute::Shape<cute::_128, cute::_128, cute::_128>, void>;
  using ClusterShape = cute::Shape<cute::_1, cute::_2, cute::_1>;
  using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, 128, 128, cute::GMMA::Major::K, cute::GMMA::Major::K>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD*, kAlignD, ElementD, LayoutD*,
      kAlignD, cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
      cutlass::epilogue::fusion::LinearCombination<ElementD, float, void, float>>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, EA, cute::tuple<LayoutA*, LayoutSFA*>, kAlignA, EB,
      cute::tuple<LayoutB*, LayoutSFB*>, kAlignB, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8BlockScaledAccum>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;
};

template <class C, class = void> struct IsBlock : cute::false_type {};
template <class C> struct IsBlock<C, cute::void_t<typename C::ScaleConfig>> : cute::true_type {};

// The per-group scale layouts of a block kind (K-major, see CutlassBlockConfig); void-free stand-ins otherwise.
template <class C, bool = IsBlock<C>::value> struct ScaleLayouts {
  using SFA = char;
  using SFB = char;
};
template <class C> struct ScaleLayouts<C, true> {
  using SFA = typename C::LayoutSFA;
  using SFB = typename C::LayoutSFB;
};

// FP8 blocks: the stored scales → the kernel's K-major operands in the workspace. lhs [ceil(k/128), ld_m]
// (rows contiguous) → sfa [m_total, kb]; rhs [groups, nb, ld_kb] → sfb [groups, nb, kb] (padding dropped).
// (A template, so that each kernel TU's copy merges at link time.)
template <int = 0> __global__ void block_scale_prep_kernel(GroupedGemmArgs a, float* sfa, float* sfb) {
  const int64_t kb = grouped_kb(a.k), nb = grouped_nb(a.n);
  const int64_t lhs_ld = grouped_lhs_scale_ld(a.m_total), rhs_ld = grouped_rhs_scale_ld(a.k);
  const int64_t n_a = a.m_total * kb, n_b = a.groups * nb * kb;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n_a + n_b;
       i += int64_t(gridDim.x) * blockDim.x) {
    if (i < n_a) {
      const int64_t r = i / kb, c = i % kb;
      sfa[i] = a.lhs_scale_inv[c * lhs_ld + r];
    } else {
      const int64_t j = i - n_a, row = j / kb, c = j % kb;  // row = g·nb + the n tile
      sfb[j] = a.rhs_scale_inv[row * rhs_ld + c];
    }
  }
}

// A packed rank-3 stride whose one dynamic mode among the first two is the leading dimension `ld`.
template <class Stride> __device__ Stride packed_stride(int64_t ld) {
  Stride s{};
  if constexpr (cute::is_static<cute::remove_cvref_t<decltype(cute::get<0>(s))>>::value) {
    cute::get<1>(s) = ld;
  } else {
    cute::get<0>(s) = ld;
  }
  return s;
}

// The per-group table in the workspace, each array 256-B aligned, then the kernel's own workspace.
template <class C> struct Table {
  typename C::ProblemShape::UnderlyingProblemShape* shapes;
  const typename C::ElementA** a;
  const typename C::ElementB** b;
  typename C::ElementD** d;
  typename C::StrideA* sa;
  typename C::StrideB* sb;
  typename C::StrideD* sd;
  float* alpha;
  const float** alpha_ptr;
  // FP8 blocks only (zero-length otherwise): per-group scale pointers and layouts, the K-major scales.
  const float** sfa_ptr;
  const float** sfb_ptr;
  typename ScaleLayouts<C>::SFA* sfa_layout;
  typename ScaleLayouts<C>::SFB* sfb_layout;
  float* sfa;
  float* sfb;
  void* kernel_ws;

  static size_t bytes(const GroupedGemmArgs& a) { return carve(nullptr, a).second; }
  static std::pair<Table, size_t> carve(void* base, const GroupedGemmArgs& a) {
    Table t{};
    size_t off = 0;
    const int64_t groups = a.groups;
    const auto take_n = [&](auto*& p, size_t elt, int64_t count) {
      p = reinterpret_cast<cute::remove_reference_t<decltype(p)>>(static_cast<char*>(base) + off);
      off += (size_t(count) * elt + 255) & ~size_t(255);
    };
    const auto take = [&](auto*& p, size_t elt) { take_n(p, elt, groups); };
    const int64_t block_groups = IsBlock<C>::value ? groups : 0;
    take_n(t.sfa_ptr, sizeof(*t.sfa_ptr), block_groups);
    take_n(t.sfb_ptr, sizeof(*t.sfb_ptr), block_groups);
    take_n(t.sfa_layout, sizeof(*t.sfa_layout), block_groups);
    take_n(t.sfb_layout, sizeof(*t.sfb_layout), block_groups);
    take_n(t.sfa, sizeof(float), IsBlock<C>::value ? a.m_total * grouped_kb(a.k) : 0);
    take_n(t.sfb, sizeof(float), IsBlock<C>::value ? groups * grouped_nb(a.n) * grouped_kb(a.k) : 0);
    take(t.shapes, sizeof(*t.shapes));
    take(t.a, sizeof(*t.a));
    take(t.b, sizeof(*t.b));
    take(t.d, sizeof(*t.d));
    take(t.sa, sizeof(*t.sa));
    take(t.sb, sizeof(*t.sb));
    take(t.sd, sizeof(*t.sd));
    take(t.alpha, sizeof(*t.alpha));
    take(t.alpha_ptr, sizeof(*t.alpha_ptr));
    t.kernel_ws = static_cast<char*>(base) + off;
    return {t, off};
  }
};

template <class C, bool kFp8> struct FillTable {
  Table<C> t;
  GroupedGemmArgs a;
  __device__ void operator()(int64_t g, int64_t first, int64_t rows) const {
    using EA = typename C::ElementA;
    using EB = typename C::ElementB;
    using ED = typename C::ElementD;
    if (a.wgrad) {
      t.shapes[g] = {rows > 0 ? int(a.n) : 0, int(a.k), int(rows)};
      t.a[g] = static_cast<const EA*>(a.lhs) + first * a.n;
      t.b[g] = static_cast<const EB*>(a.rhs) + first * a.k;
      t.d[g] = static_cast<ED*>(a.d) + g * a.n * a.k;
      t.sa[g] = packed_stride<typename C::StrideA>(a.n);
      t.sb[g] = packed_stride<typename C::StrideB>(a.k);
      t.sd[g] = packed_stride<typename C::StrideD>(a.k);
    } else {
      t.shapes[g] = {int(rows), int(a.n), int(a.k)};
      t.a[g] = static_cast<const EA*>(a.lhs) + first * a.k;
      t.b[g] = static_cast<const EB*>(a.rhs) + g * a.n * a.k;
      t.d[g] = static_cast<ED*>(a.d) + first * a.n;
      t.sa[g] = packed_stride<typename C::StrideA>(a.k);
      t.sb[g] = packed_stride<typename C::StrideB>(a.rhs_kn ? a.n : a.k);
      t.sd[g] = packed_stride<typename C::StrideD>(a.n);
    }
    if constexpr (IsBlock<C>::value) {  // the scales go in the main loop; the epilogue's alpha is 1
      t.alpha[g] = 1.0f;
      t.sfa_ptr[g] = t.sfa + first * grouped_kb(a.k);
      t.sfb_ptr[g] = t.sfb + g * grouped_nb(a.n) * grouped_kb(a.k);
      t.sfa_layout[g] = C::ScaleConfig::tile_atom_to_shape_SFA(cute::make_shape(int(rows), int(a.n), int(a.k), 1));
      t.sfb_layout[g] = C::ScaleConfig::tile_atom_to_shape_SFB(cute::make_shape(int(rows), int(a.n), int(a.k), 1));
    } else {
      t.alpha[g] = kFp8 ? a.lhs_scale_inv[0] * a.rhs_scale_inv[g] : 1.0f;
    }
    t.alpha_ptr[g] = t.alpha + g;
  }
};

template <class C> typename C::Gemm::Arguments cutlass_arguments(const Table<C>& t, const GroupedGemmArgs& a,
                                                                 int sms) {
  typename C::Gemm::Arguments args;
  args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
  args.problem_shape = {int(a.groups), t.shapes, nullptr};
  if constexpr (IsBlock<C>::value) {
    args.mainloop = {t.a, t.sa, t.b, t.sb, t.sfa_ptr, t.sfa_layout, t.sfb_ptr, t.sfb_layout};
  } else {
    args.mainloop = {t.a, t.sa, t.b, t.sb};
  }
  auto& f = args.epilogue.thread;
  f.alpha = 1.0f;
  f.beta = 0.0f;
  f.alpha_ptr = nullptr;
  f.beta_ptr = nullptr;
  f.alpha_ptr_array = t.alpha_ptr;
  f.beta_ptr_array = nullptr;
  f.dAlpha = {cute::_0{}, cute::_0{}, 1};
  f.dBeta = {cute::_0{}, cute::_0{}, 0};
  args.epilogue.ptr_C = nullptr;
  args.epilogue.ptr_D = t.d;
  args.epilogue.dD = t.sd;
  int dev = 0;
  cudaGetDevice(&dev);
  args.hw_info.device_id = dev;
  args.hw_info.sm_count = sms;
  return args;
}

[[noreturn]] inline void cutlass_fail(const char* name, const char* what, cutlass::Status st) {
  core_fail(std::string("grouped_gemm (") + name + "): CUTLASS " + what + " failed: " + cutlassGetStatusString(st));
}

template <class C, bool kFp8> size_t cutlass_workspace(const GroupedGemmArgs& a, int sms) {
  const Table<C> t = Table<C>::carve(nullptr, a).first;
  return Table<C>::bytes(a) + C::Gemm::get_workspace_size(cutlass_arguments<C>(t, a, sms));
}

template <class C, bool kFp8> void cutlass_run(const char* name, const GroupedGemmArgs& a, cudaStream_t stream,
                                               int sms) {
  const Table<C> t = Table<C>::carve(a.workspace, a).first;
  if constexpr (IsBlock<C>::value) {
    if (a.m_total > 0 && a.groups > 0) {
      block_scale_prep_kernel<><<<kSetupBlocks, kSetupThreads, 0, stream>>>(a, t.sfa, t.sfb);
    }
  }
  setup_kernel<<<kSetupBlocks, kSetupThreads, 0, stream>>>(a, FillTable<C, kFp8>{t, a});
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) core_fail(std::string("grouped_gemm: setup launch failed: ") + cudaGetErrorString(e));
  if (a.groups == 0 || a.n == 0 || (a.m_total == 0 && !a.wgrad) || (a.wgrad && (a.k == 0 || a.m_total == 0))) return;
  typename C::Gemm gemm;
  const auto args = cutlass_arguments<C>(t, a, sms);
  cutlass::Status st = gemm.can_implement(args);
  if (st != cutlass::Status::kSuccess) cutlass_fail(name, "can_implement", st);
  st = gemm.initialize(args, t.kernel_ws, stream);
  if (st != cutlass::Status::kSuccess) cutlass_fail(name, "initialize", st);
  st = gemm.run(stream);
  if (st != cutlass::Status::kSuccess) cutlass_fail(name, "run", st);
}

}  // namespace grouped
}  // namespace te

// The Cutlass<K> members of one kind, in the translation unit that instantiates it: the trailing arguments name its
// CutlassConfig or CutlassBlockConfig.
#define TE_GROUPED_CUTLASS_KIND_OF(K, FP8, NAME, ...)                                                            \
  namespace te {                                                                                                 \
  namespace grouped {                                                                                            \
  using Config##K = __VA_ARGS__;                                                                                 \
  template <> const char* Cutlass<CutlassKind::K>::name() { return NAME; }                                       \
  template <> size_t Cutlass<CutlassKind::K>::workspace(const GroupedGemmArgs& a, int sms) {                     \
    return cutlass_workspace<Config##K, FP8>(a, sms);                                                            \
  }                                                                                                              \
  template <> void Cutlass<CutlassKind::K>::run(const GroupedGemmArgs& a, cudaStream_t s, int sms) {             \
    cutlass_run<Config##K, FP8>(NAME, a, s, sms);                                                                \
  }                                                                                                              \
  }                                                                                                              \
  }
#define TE_GROUPED_CUTLASS_KIND(K, EA, EB, LAYOUT_B, FP8, FAST, NAME, ...) \
  TE_GROUPED_CUTLASS_KIND_OF(K, FP8, NAME, CutlassConfig<EA, EB, LAYOUT_B, FP8, FAST, ##__VA_ARGS__>)
