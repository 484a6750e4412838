// CUDA kernel of the activation / cast family (included by the act_*.cu translation units, which instantiate
// it for a few activations each so the build parallelises).
//
// Four kernels: a rowwise one for the common case (aligned rows of 8-element chunks, no transposed copy, no
// dbias), a flat list of chunks with several 16-byte loads in flight per thread; a strip kernel for dbias; a
// pipelined tile kernel for FP8 with a transposed copy on aligned rows; and the tile kernel for the rest (ragged
// shapes, dbias with a transposed copy). The first three are instantiated per output kind (the rowwise one also for
// MXFP8 rowwise codes and scales) and, for bf16 inputs of exp-based functors, look the functor up in exact
// shared-memory tables. Large bf16 tensors of such a unary forward op going to NVFP4 take kernels of their own
// (act_nv_row_kernel: a thread owns whole 1x16 blocks; act_nv_rowcol_kernel: both copies of 128 x 128 tiles staged
// in shared memory).
// This header holds the launchers (host side: kernel choice by shape, dtype and output kind, grid sizing, dynamic
// shared memory) and the instantiation macros; the kernels are in rowwise_kernels.cuh, tile_strip_kernels.cuh,
// pipe_kernel.cuh, nvfp4_kernels.cuh and amax_shape.cuh, their parts in eval.cuh and emit.cuh.
// Invariant: every value is computed by act_forward/act_backward and encoded by fp8_scaled_value +
// float2_to_fp8x2, exactly as on the CPU.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <type_traits>

#include "amax_shape.cuh"
#include "nvfp4_kernels.cuh"
#include "pipe_kernel.cuh"
#include "rowwise_kernels.cuh"
#include "tile_strip_kernels.cuh"

namespace te {
namespace act_cuda {

// ---- Launchers -------------------------------------------------------------------------------------------------
// TE_FORCE_TABLES=1 makes every bf16 launch of a tabulated functor use the tables, whatever its size (tests use it
// to cover all 65536 inputs with small tensors).
inline bool force_tables() {
  const char* v = std::getenv("TE_FORCE_TABLES");
  return v != nullptr && v[0] == '1';
}

template <class Op, typename T>
void launch_gated_rows(const ActKernelParams& p, uint32_t cpr, cudaStream_t stream) {
  const int64_t row_groups = std::max<int64_t>(1, (p.rows + kGatedRows - 1) / kGatedRows);
  const dim3 grid(unsigned((cpr + kGatedCols - 1) / kGatedCols), unsigned(std::min<int64_t>(row_groups, 65535)));
  act_gated_rows_kernel<Op, T><<<grid, kGatedCols * kGatedRows, 0, stream>>>(p);
}

template <class Op, bool kBwd, typename T, OutKind kOut>
void launch_rowwise(const ActKernelParams& p, uint32_t cpr, uint32_t n_chunks, cudaStream_t stream) {
  constexpr int kU = RowwiseUnroll<Op, kBwd, T>::value;
  // Gated forward ops to plain outputs whose rows hold at least one block's width of chunks: the 2-D grid.
  if constexpr (Op::kGated && !kBwd && kOut == OutKind::kPlain) {
    if (cpr >= uint32_t(kGatedCols)) return launch_gated_rows<Op, T>(p, cpr, stream);
  }
  const int sms = device_sm_count_or_default();
  if constexpr (kOut == OutKind::kAmax && !Op::kGated && !kBwd && std::is_same<T, bf16_t>::value) {
    const AmaxShape& shape = amax_shape<typename Op::Fn>();
    const ActArgs dflt{};
    const bool default_args = p.act.limit == dflt.limit && p.act.alpha == dflt.alpha &&
                              p.act.glu_linear_offset == dflt.glu_linear_offset;
    if (shape.peaks >= 0 && default_args) {
      const int64_t per_block = int64_t(kAmaxShapeThreads) * kAmaxShapeUnroll;
      const int64_t blocks = std::min<int64_t>((int64_t(n_chunks) + per_block - 1) / per_block, 4 * int64_t(sms));
      act_amax_shape_kernel<typename Op::Fn>
          <<<unsigned(std::max<int64_t>(blocks, 1)), kAmaxShapeThreads, 0, stream>>>(p, n_chunks, shape);
      return;
    }
  }
  RowwiseGeom geo;
  geo.n_chunks = n_chunks;
  geo.cpr = cpr;
  geo.row_of = FastDiv(cpr);
  // A tensor too small to give every SM two full steps gets one chunk per thread.
  const bool small = int64_t(n_chunks) < int64_t(kRowThreads) * kU * 2 * sms;
  geo.units = small ? 1 : kU;
  if constexpr (kOut == OutKind::kMxRow || kOut == OutKind::kNvRow) {
    const int64_t blk = kOut == OutKind::kMxRow ? kMxBlock : kNvBlock;
    geo.scale_linear = !(kBwd && Op::kGated) && !p.blk_swizzled && (p.cols / blk) % 4 == 0;
  }
  const int64_t per_block = int64_t(kRowThreads) * geo.units;
  // An empty tensor still launches one block so that scale_inv is written (SPEC §4.10).
  const int64_t blocks = n_chunks < 1 ? 1 : (int64_t(n_chunks) + per_block - 1) / per_block;
  if constexpr (Op::Fn::kTabulate && std::is_same<T, bf16_t>::value) {
    // Tables pay off when each resident block walks several steps after filling them.
    constexpr auto kernel = act_rowwise_kernel<Op, kBwd, T, kOut, true>;
    constexpr size_t kSmem = LutPlan<Op, kBwd>::kBytes;
    const int64_t resident = int64_t(resident_per_sm<kernel>(kRowThreads, kSmem)) * sms;
    if (resident > 0 && (force_tables() || (!small && blocks >= 4 * resident))) {
      kernel<<<unsigned(std::min(blocks, resident)), kRowThreads, kSmem, stream>>>(p, geo);
      return;
    }
  }
  act_rowwise_kernel<Op, kBwd, T, kOut, false><<<unsigned(blocks), kRowThreads, 0, stream>>>(p, geo);
}

template <class Op, bool kBwd, typename T, OutKind kOut>
void launch_strip(const ActKernelParams& p, int64_t dbias_rows, cudaStream_t stream) {
  const int sms = device_sm_count_or_default();
  const int64_t strips = std::max<int64_t>(1, (p.cols + kActStripCols - 1) / kActStripCols);
  const int64_t items = strips * act_dbias_blocks(p.rows, p.cols);
  if constexpr (Op::Fn::kTabulate && std::is_same<T, bf16_t>::value) {
    constexpr auto kernel = act_strip_kernel<Op, kBwd, T, kOut, true>;
    constexpr size_t kSmem = LutPlan<Op, kBwd>::kBytes;
    const int per_sm = resident_per_sm<kernel>(kThreads, kSmem);
    // Tables pay off when each block walks enough rows after filling them.
    if (per_sm > 0 && (force_tables() || items * dbias_rows >= 64 * int64_t(per_sm) * sms)) {
      kernel<<<unsigned(std::min<int64_t>(items, int64_t(per_sm) * sms)), kThreads, kSmem, stream>>>(
          p, dbias_rows, strips, items);
      return;
    }
  }
  constexpr auto kernel = act_strip_kernel<Op, kBwd, T, kOut, false>;
  const int per_sm = std::max(1, resident_per_sm<kernel>(kThreads, 0));
  kernel<<<unsigned(std::min<int64_t>(items, int64_t(per_sm) * sms)), kThreads, 0, stream>>>(p, dbias_rows, strips,
                                                                                             items);
}

// A persistent grid: as many blocks as are resident, at most one per tile.
template <auto kernel>
void launch_pipe_grid(const ActKernelParams& p, const PipeGeom& geo, size_t smem, cudaStream_t stream) {
  const int per_sm = std::max(1, resident_per_sm<kernel>(kThreads, smem));
  const int64_t grid = std::min<int64_t>(geo.tiles, int64_t(per_sm) * device_sm_count_or_default());
  kernel<<<unsigned(grid), kThreads, smem, stream>>>(p, geo);
}

template <class Op, bool kBwd, typename T, OutKind kOut>
void launch_pipe(const ActKernelParams& p, cudaStream_t stream) {
  using L = PipeLayout<Op, kBwd, T>;
  PipeGeom geo;
  geo.col_tiles = std::max<int64_t>(1, (p.cols + kTileCols - 1) / kTileCols);
  geo.tiles = geo.col_tiles * std::max<int64_t>(1, (p.rows + kActBlockRows - 1) / kActBlockRows);
  geo.dbias_rows = act_dbias_rows(p.rows, p.cols);
  if constexpr (Op::Fn::kTabulate && std::is_same<T, bf16_t>::value) {
    // Tables pay off when each resident block walks several tiles after filling them.
    if (force_tables() || geo.tiles >= 8 * int64_t(device_sm_count_or_default())) {
      launch_pipe_grid<act_pipe_kernel<Op, kBwd, T, kOut, true>>(p, geo, L::template smem_bytes<true>(), stream);
      return;
    }
  }
  launch_pipe_grid<act_pipe_kernel<Op, kBwd, T, kOut, false>>(p, geo, L::template smem_bytes<false>(), stream);
}

// NVFP4 (ScaleMode::kNvfp4): the streaming rowwise kernel without a transposed copy, else the pipelined tiles.
template <class Op, bool kBwd>
void launch_nvfp4_act(DType in_dtype, const ActKernelParams& p, cudaStream_t stream) {
  auto aligned = [](const void* ptr, int bytes) { return (reinterpret_cast<uintptr_t>(ptr) % bytes) == 0; };
  const int64_t n_chunks = p.rows * (p.cols / kVec);
  constexpr bool kHasDbias = act_has_dbias<Op, kBwd>();
  const bool dbias_ok = p.dbias_partial == nullptr ||
                        (kHasDbias && p.out_t != nullptr && act_pipe_takes_dbias(p.rows, p.cols));
  const bool ok = p.cols % kNvBlock == 0 && aligned(p.x, 16) && (p.grad == nullptr || aligned(p.grad, 16)) &&
                  (p.out == nullptr || aligned(p.out, 4)) && dbias_ok &&
                  (p.out_t == nullptr || p.rows % kNvBlock == 0) && n_chunks < (int64_t(1) << 31);
  if (!ok) {
    core_fail("activation kernel: the fused NVFP4 path needs positions per row % 16 == 0 (got " +
              std::to_string(p.cols) + "), rows % 16 == 0 with a transposed copy (got " + std::to_string(p.rows) +
              "), 16-byte aligned inputs, a 4-byte aligned output, and dbias only with the transposed copy of a "
              "unary op on shapes whose dbias row blocks hold 16 rows");
  }
  if constexpr (!kBwd && !Op::kGated && Op::Fn::kTabulate) {
    // Rowwise only, bf16, a tabulated unary forward op: the table kernel when every resident block walks at least
    // 4 whole steps after filling its tables (or TE_FORCE_TABLES=1).
    if (in_dtype == DType::kBFloat16 && p.out_t == nullptr && p.out != nullptr && aligned(p.out, 8)) {
      constexpr auto kernel = act_nv_row_kernel<Op>;
      const int64_t n_blocks = n_chunks / 2;
      const int64_t resident = int64_t(resident_per_sm<kernel>(kNvRowThreads, kNvRowSmem)) * device_sm_count_or_default();
      const int64_t per_step = int64_t(kNvRowThreads) * kNvRowUnits;
      if (resident > 0 && n_blocks > 0 && (force_tables() || n_blocks >= 4 * resident * per_step)) {
        NvRowGeom geo;
        geo.n_blocks = uint32_t(n_blocks);
        geo.bpr = uint32_t(p.cols / kNvBlock);
        geo.row_of = FastDiv(geo.bpr);
        geo.scale_linear = !p.blk_swizzled && geo.bpr % 4 == 0;
        const int64_t grid = std::min(resident, (n_blocks + kNvRowThreads - 1) / kNvRowThreads);
        kernel<<<unsigned(grid), kNvRowThreads, kNvRowSmem, stream>>>(p, geo);
        check_launch("activation kernel (NVFP4 rowwise tables)");
        return;
      }
    }
  }
  if constexpr (!kBwd && !Op::kGated && Op::Fn::kTabulate) {
    // Both copies, bf16, a tabulated unary forward op, whole 128 x 128 tiles: the table kernel when every resident
    // block walks at least 8 tiles after filling its tables (or TE_FORCE_TABLES=1).
    if (in_dtype == DType::kBFloat16 && p.out_t != nullptr && p.rows % kNvColTile == 0 && p.cols % kNvColTile == 0 &&
        aligned(p.out_t, 16) && (p.out == nullptr || aligned(p.out, 8)) && p.rows > 0 && p.cols > 0) {
      constexpr auto kernel = act_nv_rowcol_kernel<Op>;
      NvColGeom geo;
      geo.col_tiles = p.cols / kNvColTile;
      geo.tiles = geo.col_tiles * (p.rows / kNvColTile);
      const int64_t resident = int64_t(resident_per_sm<kernel>(kNvColThreads, kNvColSmem)) * device_sm_count_or_default();
      if (resident > 0 && (force_tables() || geo.tiles >= 8 * resident)) {
        kernel<<<unsigned(std::min(resident, geo.tiles)), kNvColThreads, kNvColSmem, stream>>>(p, geo);
        check_launch("activation kernel (NVFP4 both copies, tables)");
        return;
      }
    }
  }
  TE_SWITCH_IN_DTYPE(in_dtype, T, {
    if (p.out_t == nullptr) {
      launch_rowwise<Op, kBwd, T, OutKind::kNvRow>(p, uint32_t(p.cols / kVec), uint32_t(n_chunks), stream);
    } else {
      launch_pipe<Op, kBwd, T, OutKind::kNvRowCol>(p, stream);
    }
  });
  check_launch("activation kernel (NVFP4)");
}

// TE_ONE_LAUNCH=0 turns the one-launch current scaling off (tests use it to cover the amax pass on small tensors).
inline bool one_launch_disabled() {
  const char* v = std::getenv("TE_ONE_LAUNCH");
  return v != nullptr && v[0] == '0';
}

// One cooperative launch of act_current_coop_kernel when the tensor fits a resident grid within the partial slots;
// false (nothing launched) otherwise.
template <class Op, bool kBwd, typename T>
bool launch_current_coop(const ActKernelParams& p, uint32_t cpr, uint32_t n_chunks, cudaStream_t stream) {
  constexpr auto kernel = act_current_coop_kernel<Op, kBwd, T>;
  const int64_t resident = int64_t(resident_per_sm<kernel>(kRowThreads, 0)) * device_sm_count();
  const int64_t blocks = std::max<int64_t>(1, (int64_t(n_chunks) + kRowThreads - 1) / kRowThreads);
  const int64_t grid = std::min<int64_t>({blocks, resident, int64_t(p.amax_slots)});
  if (grid < 1 || int64_t(n_chunks) > grid * kRowThreads * coop_units<Op, kBwd>()) return false;
  RowwiseGeom geo;
  geo.n_chunks = n_chunks;
  geo.cpr = cpr;
  geo.row_of = FastDiv(cpr);
  ActKernelParams pk = p;
  void* args[] = {&pk, &geo};
  const cudaError_t e = cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(kernel), dim3(unsigned(grid)),
                                                    dim3(kRowThreads), args, 0, stream);
  if (e != cudaSuccess) core_fail(std::string("activation kernel (current scaling, one launch): ") + cudaGetErrorString(e));
  return true;
}

template <class Op, bool kBwd>
void launch_act(DType in_dtype, const ActKernelParams& p, cudaStream_t stream) {
  if (p.mode == ScaleMode::kNvfp4) return launch_nvfp4_act<Op, kBwd>(in_dtype, p, stream);
  auto aligned = [](const void* ptr, int bytes) { return (reinterpret_cast<uintptr_t>(ptr) % bytes) == 0; };
  const bool vec = p.cols % kVec == 0 && aligned(p.x, 16) && (p.grad == nullptr || aligned(p.grad, 16)) &&
                   (p.out == nullptr || aligned(p.out, p.mode == ScaleMode::kPlain ? 16 : 8));
  const int64_t chunks_per_row = p.cols / kVec;
  const int64_t n_chunks = p.rows * chunks_per_row;
  if (p.mode == ScaleMode::kCurrent && p.amax_in_call) {
    // Current scaling in one call: one cooperative launch where it fits, else zero amax, amax pass, cast.
    if (vec && p.out != nullptr && p.out_t == nullptr && p.dbias_partial == nullptr && p.amax_partials != nullptr &&
        p.amax_slots > 0 && n_chunks < (int64_t(1) << 31) && !one_launch_disabled()) {
      bool done = false;
      TE_SWITCH_IN_DTYPE(in_dtype, T, {
        done = launch_current_coop<Op, kBwd, T>(p, uint32_t(chunks_per_row), uint32_t(n_chunks), stream);
      });
      if (done) return check_launch("activation kernel (current scaling, one launch)");
    }
    const cudaError_t e = cudaMemsetAsync(p.amax, 0, sizeof(float), stream);
    if (e != cudaSuccess) core_fail(std::string("activation: zeroing the amax failed: ") + cudaGetErrorString(e));
    launch_act<Op, kBwd>(in_dtype, amax_pass_params(p), stream);
    ActKernelParams pc = p;
    pc.amax_in_call = false;
    return launch_act<Op, kBwd>(in_dtype, pc, stream);
  }
  const bool has_out = p.out != nullptr || p.mode == ScaleMode::kAmaxOnly || n_chunks == 0;
  if (vec && has_out && p.out_t == nullptr && p.dbias_partial == nullptr && n_chunks < (int64_t(1) << 31)) {
    TE_SWITCH_IN_DTYPE(in_dtype, T, {
      TE_SWITCH_OUT_KIND(p.mode, K, {
        launch_rowwise<Op, kBwd, T, K>(p, uint32_t(chunks_per_row), uint32_t(n_chunks), stream);
      });
    });
    check_launch("activation kernel (rowwise)");
    return;
  }
  const int64_t dbias_rows = act_dbias_rows(p.rows, p.cols);
  constexpr bool kHasDbias = act_has_dbias<Op, kBwd>();
  if constexpr (kHasDbias) {
    if (vec && has_out && p.out_t == nullptr && p.dbias_partial != nullptr && aligned(p.dbias_partial, 16)) {
      TE_SWITCH_IN_DTYPE(in_dtype, T, {
        TE_SWITCH_OUT_KIND(p.mode, K, { launch_strip<Op, kBwd, T, K>(p, dbias_rows, stream); });
      });
      check_launch("activation kernel (dbias strips)");
      return;
    }
  }
  // FP8 with a transposed copy: the pipelined tiles, with dbias too where a warp's 16 rows fall in one partial row.
  const bool pipe_dbias = p.dbias_partial == nullptr || (kHasDbias && act_pipe_takes_dbias(p.rows, p.cols));
  if (vec && p.out_t != nullptr && pipe_dbias && (p.mode == ScaleMode::kDelayed || p.mode == ScaleMode::kCurrent)) {
    TE_SWITCH_IN_DTYPE(in_dtype, T, {
      if (p.mode == ScaleMode::kDelayed) {
        launch_pipe<Op, kBwd, T, OutKind::kDelayed>(p, stream);
      } else {
        launch_pipe<Op, kBwd, T, OutKind::kCurrent>(p, stream);
      }
    });
    check_launch("activation kernel (pipelined tiles)");
    return;
  }
  const int64_t col_blocks = (p.cols + kTileCols - 1) / kTileCols;
  if (col_blocks > 2147483647LL) core_fail("activation: too many columns");
  const dim3 grid(unsigned(col_blocks < 1 ? 1 : col_blocks), unsigned(act_row_blocks(p.rows, p.cols)));
  TE_SWITCH_IN_DTYPE(in_dtype, T, {
    if (vec) {
      act_kernel<Op, kBwd, T, true><<<grid, kThreads, 0, stream>>>(p, dbias_rows);
    } else {
      act_kernel<Op, kBwd, T, false><<<grid, kThreads, 0, stream>>>(p, dbias_rows);
    }
  });
  check_launch("activation kernel");
}

}  // namespace act_cuda
}  // namespace te


// Explicit instantiation of the launcher of one activation table row in one direction (kBwd = false / true); each
// act_<family>_*.cu translation unit instantiates the rows of one family (TE_FOR_EACH_ACTIVATION_OF) in one
// direction so the build parallelises.
// The NVFP4 kernels of the same op are instantiated in their own translation unit (TE_INSTANTIATE_NVFP4_CUDA), so
// the build stays parallel.
#define TE_INSTANTIATE_ACT_CUDA(code, value, name, F, gated, family, bwd)                                              \
  extern template void te::act_cuda::launch_nvfp4_act<te::ActOp<te::F, gated>, bwd>(                            \
      te::DType, const te::ActKernelParams&, cudaStream_t);                                                      \
  template void te::act_cuda::launch_act<te::ActOp<te::F, gated>, bwd>(te::DType, const te::ActKernelParams&, cudaStream_t);
#define TE_INSTANTIATE_NVFP4_CUDA(code, value, name, F, gated, family, bwd)                                            \
  template void te::act_cuda::launch_nvfp4_act<te::ActOp<te::F, gated>, bwd>(te::DType, const te::ActKernelParams&, \
                                                                            cudaStream_t);
