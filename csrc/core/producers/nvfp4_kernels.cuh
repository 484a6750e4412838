// The NVFP4 activation kernels for large bf16 tensors of a unary forward op: act_nv_row_kernel (rowwise only, a
// thread owns whole 1x16 blocks) and act_nv_rowcol_kernel (both copies of 128 x 128 tiles staged in shared memory),
// with their tables (rnd_in of the functor at every in-range bf16, and the block multipliers of scale codes 0..127).
// Invariant: scale codes and packed E2M1 codes are those of quantize_nvfp4.h's encoders on rnd_in(act(x)), the
// computed path's bits (blocks with any input outside the tables take that path).
#pragma once

#include "emit.cuh"
#include "eval.cuh"

namespace te {
namespace act_cuda {

// The split bf16 table with the block multipliers of NVFP4 scale codes 0..127 in the gap after its positive half
// (the NVFP4 both-copies table kernel).
__device__ __forceinline__ const float* nv_enc_tab(const float* lut) {
  return reinterpret_cast<const float*>(reinterpret_cast<const unsigned char*>(lut) + kHalfLutHalfBytes);
}
constexpr size_t kNvTabBytes = kHalfLutNegOffset + kHalfLutHalfBytes;
static_assert(kHalfLutHalfBytes + 128 * 4 <= kHalfLutNegOffset, "the multipliers fit between the table halves");

// ---- NVFP4 rowwise, table kernel --------------------------------------------------------------------------------
// Unary forward op on bf16 to NVFP4 rowwise (no transposed copy), the large-tensor case: one thread owns whole 1x16
// blocks (two 16-byte loads), so a block's amax, scale code and multiplier take no shuffle and are paid once per 16
// values, and its 8 code bytes leave in one store. A resident grid of kNvRowThreads-thread blocks, one per SM; each
// fills its tables once (while its first loads are in flight) and walks steps of kNvRowUnits blocks per thread in
// whole rounds, double-buffered in registers, then the leftover blocks one per thread.
// Tables (FP32 entries of rnd_in(fwd), the exact values the computed path gives): the bf16 magnitudes m in
// [0x3300, 0x4300) of kLutLo.. at byte 4 * (m - 0x3300), negatives kNvRowNegOffset further, so that the offset of
// both halves of a 32-bit word of inputs is one shift-add and one mask (nv_row_offsets); the 128 block multipliers
// of the possible scale codes sit in the gap. Blocks with any input outside the table (zeros, tiny, huge, Inf/NaN)
// take the computed path and the NaN-safe encoder.
constexpr int kNvRowThreads = 1024;
constexpr int kNvRowUnits = 2;                                // 16-element blocks per thread and step
constexpr uint32_t kNvRowNegOffset = 0x20000u;                // bit 15 of a half, shifted left by 2
constexpr uint32_t kNvRowEncOffset = 4u * kLutPerSign;        // 16 KB: the multipliers, after the positive half
constexpr size_t kNvRowSmem = kNvRowNegOffset + 4u * kLutPerSign;
static_assert(kNvRowEncOffset + 128 * 4 <= kNvRowNegOffset, "the multipliers fit between the table halves");

// Byte offsets of the 16 bf16 of a block into the tables; false when any lies outside them. For the low half h of a
// word w, 4w - 4 * kLutLo holds h - kLutLo (mod 2^16) in bits 2..17 (a borrow only reaches bit 18 and up); for the
// high half, (w >> 14) - 4 * kLutLo likewise (bits 0-1 hold bits 14-15 of w and take no borrow). An in-range half
// is sign * 0x8000 + index with index < 0x1000, so bits 12-14 of h - kLutLo are clear exactly for in-range halves
// (lut_offsets' test, two bits higher); the mask keeps the index and moves the sign to kNvRowNegOffset.
__device__ __forceinline__ bool nv_row_offsets(const Vec8<bf16_t> (&v)[2], uint32_t (&off)[16]) {
  constexpr uint32_t kMask = 0x3FFCu | kNvRowNegOffset;
  uint32_t any = 0u;
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    const uint32_t* w = reinterpret_cast<const uint32_t*>(&v[c]);
#pragma unroll
    for (int j = 0; j < kVec / 2; ++j) {
      const uint32_t lo = (w[j] << 2) - 4u * kLutLo, hi = (w[j] >> 14) - 4u * kLutLo;
      any |= lo | hi;
      off[8 * c + 2 * j] = lo & kMask;
      off[8 * c + 2 * j + 1] = hi & kMask;
    }
  }
  return (any & (0x7000u << 2)) == 0u;
}

template <class Op>
__device__ __forceinline__ void nv_row_tables(unsigned char* smem, const ActArgs& args, float s_dec) {
  float* enc = reinterpret_cast<float*>(smem + kNvRowEncOffset);
  if (threadIdx.x < 128) enc[threadIdx.x] = nvfp4_block_multiplier(uint8_t(threadIdx.x), s_dec);
  for (uint32_t i = threadIdx.x; i < kLutEntries; i += kNvRowThreads) {
    const uint32_t neg = i / kLutPerSign, m = i % kLutPerSign;
    const float a = to_float(bf16_t{uint16_t((neg << 15) | (m + kLutLo))});
    *reinterpret_cast<float*>(smem + neg * kNvRowNegOffset + 4u * m) = round_to<bf16_t>(Op::Fn::fwd(a, args));
  }
  __syncthreads();
}

// Geometry of the table kernel: blocks = rows * cols / 16 (< 2^31), blocks per row, and whether the scale of block b
// is byte b (compact scales whose rows hold exactly the data's blocks).
struct NvRowGeom {
  uint32_t n_blocks = 0;
  uint32_t bpr = 0;
  FastDiv row_of;
  bool scale_linear = false;
};

// Eight codes of the 16 values `v` of one block (two words) with multiplier `enc` (nvfp4_pack16).
__device__ __forceinline__ uint2 nv_encode16(const float (&v)[16], float amax, float enc, bool finite) {
  uint32_t w[2];
  nvfp4_pack16(v, amax, enc, finite, w);
  return make_uint2(w[0], w[1]);
}

// One 1x16 block of the table kernels from its 16 values (rnd_in): the E4M3 scale code of amax * S_enc / 6 and the
// 8 code bytes with the block multiplier enc_tab[sf] (sf <= 0x7E: the amax is >= 0 and NaN-free).
struct NvBlockCodes {
  uint2 codes;
  uint32_t sf;
};
__device__ __forceinline__ NvBlockCodes nv_block16(const float (&v)[16], float s_enc6, const float* enc_tab,
                                                   bool finite) {
  float a = 0.0f;
#pragma unroll
  for (int k = 0; k < 16; ++k) a = amax_update(a, v[k]);
  const uint32_t sf = float2_to_fp8x2<true>(a * s_enc6, 0.0f);  // high byte: the code of 0
  return {nv_encode16(v, a, enc_tab[sf], finite), sf};
}

template <class Op>
__global__ void __launch_bounds__(kNvRowThreads, 1)
act_nv_row_kernel(const ActKernelParams p, const NvRowGeom geo) {
  static_assert(!Op::kGated, "the table kernel takes unary forward ops");
  extern __shared__ __align__(16) unsigned char smem[];
  if (p.noop != nullptr && *p.noop == 1.0f) return;
  const NvGlobal nv = nv_global(p);
  const float s_enc6 = nv.s_enc * kInv6;
  const int64_t cols = p.cols;
  const uint32_t n = geo.n_blocks;
  const Vec8<bf16_t>* x = static_cast<const Vec8<bf16_t>*>(p.x);  // two chunks per block
  uint2* out = static_cast<uint2*>(p.out);                        // 8 code bytes per block
  const float* enc_tab = reinterpret_cast<const float*>(smem + kNvRowEncOffset);

  struct Regs {
    Vec8<bf16_t> a[kNvRowUnits][2];
  };
  auto load_step = [&](Regs& r, uint32_t step, int units) {
#pragma unroll
    for (int u = 0; u < kNvRowUnits; ++u) {
      const uint32_t b = step + threadIdx.x + uint32_t(u) * kNvRowThreads;
      if (u < units && b < n) {
        r.a[u][0] = x[2 * int64_t(b)];
        r.a[u][1] = x[2 * int64_t(b) + 1];
      }
    }
  };
  auto emit_block = [&](const Vec8<bf16_t> (&raw)[2], uint32_t b) {
    float v[16];
    uint32_t off[16];
    const bool finite = nv_row_offsets(raw, off);
    if (finite) {
#pragma unroll
      for (int k = 0; k < 16; ++k) v[k] = *reinterpret_cast<const float*>(smem + off[k]);
    } else {
      // Rare (an input outside the tables): one chunk at a time through local memory, so that this code beside the
      // hot loop stays small (H200: fully unrolled, the loop outgrew the instruction cache, 108 instead of 95 us).
      float w[2][kVec];
#pragma unroll 1
      for (int c = 0; c < 2; ++c) {
        const Vec8<bf16_t> rc = c == 0 ? raw[0] : raw[1];
        float o[2][kVec];
        eval8<Op, false, false, true>(rc, rc, rc, p.act, nullptr, o);
#pragma unroll
        for (int k = 0; k < kVec; ++k) w[c][k] = o[0][k];
      }
#pragma unroll
      for (int k = 0; k < 16; ++k) v[k] = w[k / 8][k % 8];
    }
    const NvBlockCodes nb = nv_block16(v, s_enc6, enc_tab, finite);
    out[b] = nb.codes;
    int64_t soff = b;
    if (!geo.scale_linear) {
      const uint32_t r = geo.row_of.div(b);
      soff = nv_row_scale_offset(r, b - r * geo.bpr, cols, p.blk_swizzled);
    }
    p.blk_scale[soff] = uint8_t(nb.sf);
  };
  auto compute_step = [&](const Regs& r, uint32_t step, int units, bool checked) {
#pragma unroll
    for (int u = 0; u < kNvRowUnits; ++u) {
      const uint32_t b = step + threadIdx.x + uint32_t(u) * kNvRowThreads;
      if (checked && (u >= units || b >= n)) break;
      emit_block(r.a[u], b);
    }
  };

  constexpr uint32_t kPerStep = uint32_t(kNvRowThreads) * kNvRowUnits;
  const uint32_t first = blockIdx.x * kPerStep;
  const uint32_t stride = gridDim.x * kPerStep;
  const uint32_t full_end = (n / stride) * stride;
  Regs r0, r1;
  if (first < full_end) load_step(r0, first, kNvRowUnits);
  nv_row_tables<Op>(smem, p.act, nv.s_dec);  // overlaps the first loads
  walk_double_buffered(
      first, full_end, stride, r0, r1, [&](Regs& r, uint32_t step) { load_step(r, step, kNvRowUnits); },
      [&](const Regs& r, uint32_t step) { compute_step(r, step, kNvRowUnits, false); });
  for (uint32_t step = full_end + blockIdx.x * kNvRowThreads; step < n; step += gridDim.x * kNvRowThreads) {
    load_step(r0, step, 1);
    compute_step(r0, step, 1, true);
  }
  nv_scale_padding(p, cols);
}

// ---- NVFP4 both copies, table kernel ----------------------------------------------------------------------------
// Unary forward op on bf16 to both NVFP4 copies, on 128 x 128 tiles (rows and positions multiples of 128), the
// large-tensor case. Row pass: a thread owns four whole 1x16 row blocks of the tile (rnd_in values from the split bf16
// table, the row copy as in act_nv_row_kernel) and stages their bf16 bits in shared memory. Column pass: a thread
// owns two adjacent columns x 32 rows (two 16x1 blocks per column): 32-bit reads give both columns at once, and each
// column's 32 rows of codes leave as one 16-byte store along the transposed copy's rows (adjacent lanes hold adjacent
// 32-row runs: whole 32-byte sectors). The next tile's loads are in flight during the column pass. Two 256-thread
// blocks per SM (up to 128 registers; at three blocks, 80 registers spill).
// Shared memory: the split bf16 table (halves at 0 and kHalfLutNegOffset), the block multipliers after its positive
// half, the staged 128 x 128 bf16 tile (nv_stage_word) in the gap. Measured slower on H200 (16384 x 8192, this kernel
// 220.6 us): a second staged tile after the table, one barrier per tile instead of two, 244.2 us (likely the L1 left
// beside 2 x 104 KB of shared memory, which the row pass's paired 16-byte loads lean on); one 1024-thread block per
// SM on the FP32 tables with two staged tiles in their gap, a 16x1 column block per thread (16-bit reads), 245.0 us;
// warps walking 16 x 64 tiles with no block barrier, 8-byte column stores completing sectors across warps, 522 us.
constexpr int kNvColThreads = 256;
constexpr int kNvColTile = 128;
constexpr int kNvColUnits = kNvColTile * kNvColTile / 16 / kNvColThreads;  // row blocks per thread and tile (4)
constexpr uint32_t kNvColStageOffset = 0x4000u;
constexpr size_t kNvColSmem = kNvTabBytes;
static_assert(kNvColStageOffset >= kHalfLutHalfBytes + 128 * 4 &&
                  kNvColStageOffset + kNvColTile * kNvColTile * 2 <= kHalfLutNegOffset,
              "the staged tile fits between the table halves, after the multipliers");

// Staged word (row r, word w = positions 2w, 2w + 1): 64 words per row, w ^ 4 for w >= 32 (the 16-byte stores of
// a quarter warp, 8 row blocks of one row, then hit 8 different bank quads), ^ 16 in odd 32-row runs (the column
// pass reads 16 words of one run and 16 of the next per warp).
__device__ __forceinline__ int nv_stage_word(int r, int w) { return r * 64 + (w ^ (4 * ((w >> 5) & 1)) ^ (16 * ((r >> 5) & 1))); }

struct NvColGeom {
  int64_t col_tiles = 1;
  int64_t tiles = 1;
};

template <class Op>
__global__ void __launch_bounds__(kNvColThreads, 2)
act_nv_rowcol_kernel(const ActKernelParams p, const NvColGeom geo) {
  static_assert(!Op::kGated, "the table kernel takes unary forward ops");
  extern __shared__ __align__(16) unsigned char smem[];
  if (p.noop != nullptr && *p.noop == 1.0f) return;
  const NvGlobal nv = nv_global(p);
  const float s_enc6 = nv.s_enc * kInv6;
  const int64_t rows = p.rows, cols = p.cols;
  const bool swz = p.blk_swizzled;
  const int tid = threadIdx.x;
  const bf16_t* x = static_cast<const bf16_t*>(p.x);
  const float* enc_tab = nv_enc_tab(reinterpret_cast<const float*>(smem));
  uint32_t* stage = reinterpret_cast<uint32_t*>(smem + kNvColStageOffset);

  // Row pass unit i of this thread: tile row (tid + 256 i) / 8, row block (tid + 256 i) % 8.
  Vec8<bf16_t> raw[kNvColUnits][2];
  auto issue = [&](int64_t t) {
    if (t >= geo.tiles) return;
    const int64_t rt = t / geo.col_tiles;
    const int64_t m0 = rt * kNvColTile, c0 = (t - rt * geo.col_tiles) * kNvColTile;
#pragma unroll
    for (int i = 0; i < kNvColUnits; ++i) {
      const int u = tid + kNvColThreads * i;
      const Vec8<bf16_t>* src = reinterpret_cast<const Vec8<bf16_t>*>(x + (m0 + u / 8) * cols + c0 + 16 * (u % 8));
      raw[i][0] = src[0];
      raw[i][1] = src[1];
    }
  };
  issue(blockIdx.x);
  if (tid < 128) const_cast<float*>(enc_tab)[tid] = nvfp4_block_multiplier(uint8_t(tid), nv.s_dec);
  half_lut_fill<Op, kNvColThreads>(smem, p.act);  // overlaps the first loads; ends with a barrier

  for (int64_t t = blockIdx.x; t < geo.tiles; t += gridDim.x) {
    const int64_t rt = t / geo.col_tiles;
    const int64_t m0 = rt * kNvColTile, c0 = (t - rt * geo.col_tiles) * kNvColTile;
    bool finite = true;
#pragma unroll
    for (int i = 0; i < kNvColUnits; ++i) {
      const int u = tid + kNvColThreads * i, r = u / 8, j = u % 8;
      uint32_t h[16];  // bf16 bits of the rnd_in values
      uint32_t off[2][kVec];
      const bool fin = lut_offsets<true>(raw[i][0], off[0]) & lut_offsets<true>(raw[i][1], off[1]);
      if (fin) {
#pragma unroll
        for (int k = 0; k < 16; ++k) h[k] = *reinterpret_cast<const uint16_t*>(smem + off[k / 8][k % 8]);
      } else {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          float o[2][kVec];
          eval8<Op, false, false, true>(raw[i][c], raw[i][c], raw[i][c], p.act, nullptr, o);
#pragma unroll
          for (int k = 0; k < kVec; ++k) h[8 * c + k] = float_bits(o[0][k]) >> 16;
        }
      }
      finite = finite && fin;
      if (p.out != nullptr) {
        float v[16];
#pragma unroll
        for (int k = 0; k < 16; ++k) v[k] = bits_float(h[k] << 16);
        const NvBlockCodes nb = nv_block16(v, s_enc6, enc_tab, fin);
        const int64_t jb = c0 / kNvBlock + j;  // the block's index along its row
        static_cast<uint2*>(p.out)[(m0 + r) * (cols / kNvBlock) + jb] = nb.codes;
        p.blk_scale[nv_row_scale_offset(m0 + r, jb, cols, swz)] = uint8_t(nb.sf);
      }
      // Stage the 16 values as 8 words of bf16 pairs: two 16-byte stores.
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        uint32_t wd[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) wd[k] = h[8 * hh + 2 * k] | (h[8 * hh + 2 * k + 1] << 16);
        *reinterpret_cast<uint4*>(stage + nv_stage_word(r, 8 * j + 4 * hh)) = make_uint4(wd[0], wd[1], wd[2], wd[3]);
      }
    }
    issue(t + gridDim.x);  // the next tile's loads fly during the column pass
    const bool tile_finite = __syncthreads_and(finite) != 0;

    // Column pass: column pair cp (columns 2cp, 2cp + 1 of the tile), 32-row run q.
    const int lane = tid & 31, warp = tid >> 5;
    const int cp = (lane >> 1) + 16 * (warp & 3), q = (lane & 1) + 2 * (warp >> 2);
    uint32_t res[2][4];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      uint32_t wd[16];
#pragma unroll
      for (int rr = 0; rr < 16; ++rr) wd[rr] = stage[nv_stage_word(32 * q + 16 * half + rr, cp)];
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        float v[16];
#pragma unroll
        for (int rr = 0; rr < 16; ++rr) v[rr] = bits_float(c == 0 ? wd[rr] << 16 : wd[rr] & 0xFFFF0000u);
        const NvBlockCodes nb = nv_block16(v, s_enc6, enc_tab, tile_finite);
        res[c][2 * half] = nb.codes.x;
        res[c][2 * half + 1] = nb.codes.y;
        const int64_t k = c0 + 2 * cp + c;
        p.blk_scale_t[nv_col_scale_offset(k, (m0 + 32 * q + 16 * half) / kNvBlock, rows, swz)] = uint8_t(nb.sf);
      }
    }
#pragma unroll
    for (int c = 0; c < 2; ++c)
      *reinterpret_cast<uint4*>(p.out_t + (c0 + 2 * cp + c) * (rows / 2) + (m0 + 32 * q) / 2) =
          make_uint4(res[c][0], res[c][1], res[c][2], res[c][3]);
    __syncthreads();  // the staged tile has been read
  }
  nv_scale_padding(p, cols);
}

}  // namespace act_cuda
}  // namespace te
