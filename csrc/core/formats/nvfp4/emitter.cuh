// The NVFP4 emitter of the producer kernels (ScaleMode::kNvfp4): the global scales of a launch, one 8-value chunk of
// a rowwise 1x16 block (E4M3 block scale, packed E2M1 codes) and the zero padding of both scale tensors. The kernel
// parameters are the producer's (Params: ActKernelParams), read only through their output, scale and amax fields.
#pragma once

#include "../../rules/cuda_utils.cuh"
#include "quantize_nvfp4.h"

namespace te {
namespace act_cuda {

// The global scales of one launch, from the amax of the previous kAmaxOnly pass (SPEC §4.6).
struct NvGlobal {
  float s_enc, s_dec;
};
template <class Params> __device__ __forceinline__ NvGlobal nv_global(const Params& p) {
  const float amax = *p.amax;
  if (blockIdx.x == 0 && threadIdx.x == 0) {  // the tensor's amax fields (rowwise / columnwise copies)
    if (p.nv_amax_out[0] != nullptr) *p.nv_amax_out[0] = amax;
    if (p.nv_amax_out[1] != nullptr) *p.nv_amax_out[1] = amax;
  }
  const float s_enc = nvfp4_global_scale(amax);
  return {s_enc, 1.0f / s_enc};
}

// NVFP4 rowwise output of one chunk: v = the values rounded to the input dtype; the amax of their 1x16 block over
// the 2 lanes holding it, the E4M3 block scale, 4 bytes of packed codes at element offset `off`; the even lane
// stores the scale at byte `soff` of the scale tensor.
template <bool kFull, class Params>
__device__ __forceinline__ void emit8_nv_row(const float (&v)[kVec], const Params& p, const NvGlobal& gs,
                                             int64_t off, int64_t soff) {
  const float a = block_amax8<2, kFull>(v);
  const uint8_t sf = nvfp4_block_scale(a, gs.s_enc);
  *reinterpret_cast<uint32_t*>(static_cast<uint8_t*>(p.out) + off / 2) =
      nvfp4_pack8(v, nvfp4_block_multiplier(sf, gs.s_dec));
  if ((threadIdx.x & 1u) == 0u) p.blk_scale[soff] = sf;
}

// Zero padding of the NVFP4 scale tensors of a launch (rowwise when `out` is set, columnwise when `out_t` is).
template <class Params> __device__ __forceinline__ void nv_scale_padding(const Params& p, int64_t out_cols) {
  const int64_t rows = p.rows;
  const bool swz = p.blk_swizzled;
  if (p.out != nullptr) {
    const int64_t nb = out_cols / kNvBlock;
    zero_scale_padding(p.blk_scale, rows, nb, roundup(rows, 128), roundup(nb, 4),
                       [=](int64_t r, int64_t j) { return nv_row_scale_offset(r, j, out_cols, swz); });
  }
  if (p.out_t != nullptr) {
    const int64_t nb = rows / kNvBlock;
    zero_scale_padding(p.blk_scale_t, out_cols, nb, roundup(out_cols, 128), roundup(nb, 4),
                       [=](int64_t k, int64_t i) { return nv_col_scale_offset(k, i, rows, swz); });
  }
}

}  // namespace act_cuda
}  // namespace te
