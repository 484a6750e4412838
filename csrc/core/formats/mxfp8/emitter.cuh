// The MXFP8 emitter of the producer kernels: one 8-value chunk of a rowwise 1x32 block (its amax over the 4 lanes
// holding the block, the E8M0 code, the FP8 codes, the scale byte) and the zero padding of the rowwise scales. The
// kernel parameters are the producer's (Params: ActKernelParams), read only through out, blk_scale and e4m3.
#pragma once

#include "../../rules/cuda_utils.cuh"
#include "mxfp8.h"

namespace te {
namespace act_cuda {

// amax of their 1x32 block over the 4 lanes holding it, the E8M0 code, the codes at element offset `off`; the
// first lane of the block stores the scale at byte `soff` of the scale tensor.
template <bool kFull, class Params>
__device__ __forceinline__ void emit8_mx_row(const float (&v)[kVec], const Params& p, int64_t off,
                                             int64_t soff) {
  const float a = block_amax8<4, kFull>(v);
  const uint32_t e = mx_block_code_u32(a, p.e4m3);
  const float m = e8m0_multiplier_finite(e);
  const uint2 w = p.e4m3 ? encode8_t<float, false, true>(v, m) : encode8_t<float, false, false>(v, m);
  *reinterpret_cast<uint2*>(static_cast<uint8_t*>(p.out) + off) = w;
  if ((threadIdx.x & 3u) == 0u) p.blk_scale[soff] = uint8_t(e);
}

// Zero padding of the MXFP8 rowwise scales [roundup(rows, 128), roundup(out_cols / 32, 4)].
__device__ __forceinline__ void mx_row_scale_padding(uint8_t* scale, int64_t rows, int64_t out_cols, bool swizzled) {
  const int64_t blocks = out_cols / kMxBlock;
  zero_scale_padding(scale, rows, blocks, roundup(rows, 128), roundup(blocks, 4),
                     [=](int64_t r, int64_t j) { return mx_row_scale_offset(r, j, out_cols, swizzled); });
}

}  // namespace act_cuda
}  // namespace te
