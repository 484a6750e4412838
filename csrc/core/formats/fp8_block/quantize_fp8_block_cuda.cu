// CUDA kernels of FP8 block quantization (SPEC §4.7, §4.8; layouts and invariants in quantize_fp8_block.h).
// Two kernels, each instantiated per input dtype only (activations reach them through the unfused path). Both write
// every data byte and scale entry from the same block amax, fp8_block_scale and FP8 encoder as the CPU kernel.
// The kernels are in tile_kernel.cuh (fb_cuda) and pipe_kernel.cuh (fb_pipe); this file chooses between them.
// Invariant: both write the same bytes for the shapes both accept, so the choice is only a matter of speed.
#include "pipe_kernel.cuh"

namespace te {

void quantize_fp8_block_cuda(DType in_dtype, const Fp8BlockParams& p, cudaStream_t stream) {
  auto aligned = [](const void* ptr, int bytes) { return (reinterpret_cast<uintptr_t>(ptr) % bytes) == 0; };
  const int64_t n_row_tiles = ceil_div(p.rows, kFp8BlockLen), n_col_tiles = ceil_div(p.cols, kFp8BlockLen);
  const int64_t n_tiles = n_row_tiles * n_col_tiles;
  if (n_tiles == 0) return;  // no data, and the padded scale tensors are empty too

  const bool pipe = aligned(p.x, 16) && p.cols % 8 == 0 && p.rows % 8 == 0 &&
                    (p.row_data == nullptr || aligned(p.row_data, 8)) &&
                    (p.col_data == nullptr || aligned(p.col_data, 8)) && n_tiles < (int64_t(1) << 30);
  if (pipe) {
    fb_pipe::PipeGeom geo;
    geo.n_row_tiles = int(n_row_tiles);
    geo.n_col_tiles = int(n_col_tiles);
    geo.n_tiles = int(n_tiles);
    geo.tile_row = act_cuda::FastDiv(uint32_t(n_col_tiles));
    bool launched = false;
    TE_SWITCH_IN_DTYPE(in_dtype, T, { launched = fb_pipe::launch<T>(p, geo, stream); });
    if (launched) {
      act_cuda::check_launch("FP8 block quantize kernel (pipelined tiles)");
      return;
    }
  }

  using namespace fb_cuda;
  FbGeom geo;
  geo.n_row_tiles = n_row_tiles;
  geo.n_col_tiles = n_col_tiles;
  geo.n_tiles = n_tiles;
  geo.vec_in = aligned(p.x, 16) && p.cols % kVec == 0;
  geo.vec_row_out = p.row_data != nullptr && aligned(p.row_data, 8) && p.cols % kVec == 0;
  geo.vec_col_out = p.col_data != nullptr && aligned(p.col_data, 16) && p.rows % 16 == 0;
  const unsigned grid = unsigned(geo.n_tiles < (int64_t(1) << 30) ? geo.n_tiles : (int64_t(1) << 30));
  TE_SWITCH_IN_DTYPE(in_dtype, T, { fp8_block_kernel<T><<<grid, kThreads, 0, stream>>>(p, geo); });
  act_cuda::check_launch("FP8 block quantize kernel (tiles)");
}

}  // namespace te
