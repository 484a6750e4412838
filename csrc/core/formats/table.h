// The format table (SPEC §4.3-§4.9): one row per storage format of a quantized tensor, the single source both
// frontends read (torch through `_C.format_table`, JAX through `_ffi.format_table`) and the core's kernels, planner
// and GEMM checks evaluate. A row holds the name, element types, block shape, scale type, the scale-shape rule and
// the data-shape rule of each copy (rowwise / columnwise) and the decode rule.
//
// The shape rules are data, evaluated by one function each (format_scale_shapes, format_data_shapes): a scale
// matrix dimension is roundup(div(src, block), pad) with src the rows M or the cols K of the tensor flattened to
// [M, K] (SPEC conventions: 1-D is [1, K]) and div a ceiling division, or an exact one where the format requires a
// multiple (NVFP4's 16). A transposed copy is stored as [K, M]; a packed one holds `elems_per_byte` codes a byte.
// Scale entry [i, j] of a copy covers element (r, c) of the [M, K] tensor with i = src0(r, c) / block0 and
// j = src1(r, c) / block1 (the compact layout; SPEC §4.8's swizzled layout is a permutation of it).
// Delayed and current per-tensor scaling share the per-tensor FP8 row: they differ in how the scale is chosen,
// not in what is stored.
#pragma once

#include "../rules/common.h"
#include "../rules/scaling.h"

#include <string>
#include <vector>

namespace te {

// Storage formats; the numbering is the GEMM's scaling code (gemm.h GemmScaling), so a format id is what a GEMM
// operand declares.
enum class Format : int { kPlain = 0, kFp8PerTensor = 1, kMxfp8 = 2, kNvfp4 = 3, kFp8Block1d = 4, kFp8Block2d = 5 };
constexpr int kFormatCount = 6;

// How codes and scales decode to FP32 values (SPEC §4.9): every rule is x = fl(value(code) * factor).
enum class DecodeRule : int {
  kNone = 0,         // plain values, nothing to decode
  kTensorScale = 1,  // FP8 code * the tensor's float32 scale_inv (SPEC §4.3, §4.4)
  kE8m0Block = 2,    // FP8 code * 2^(e - 127) of the block's E8M0 scale byte (SPEC §4.5)
  kNvfp4 = 3,        // E2M1 code * D(E4M3 block scale, the copy's global amax) (SPEC §4.6)
  kF32Block = 4,     // FP8 code * the block's float32 scale_inv (SPEC §4.7)
};

// One dimension of a scale matrix: roundup(div(src, block), pad). src 0: rows M, 1: cols K.
struct ScaleDim {
  int src, block, pad;
  bool exact;  // src / block (the format requires a multiple) rather than ceil(src / block)
};
// One copy of a format: absent, or stored as [M, K/epb] (transposed: [K, M/epb]) with a scale matrix of
// `scale_rank` dims (0: no scale; 1: the per-tensor float32 [1]; 2: dims scale[0], scale[1]).
struct CopyRule {
  bool present;
  bool transposed;  // data stored as the transpose [K, M]
  bool flat2d;      // a transposed copy is 2-D [K, M/epb]; else (K,) + shape[:-1] (frontends' N-d shapes)
  int block_rows, block_cols;  // the block one scale covers, in the [M, K] tensor's coordinates (0: whole tensor)
  int scale_rank;
  ScaleDim scale[2];
};
struct FormatRule {
  int elems_per_byte;
  CopyRule row, col;
};

// The numeric rules of each format, callable on host and device (the kernels size their scale padding with them).
TE_HD constexpr FormatRule format_rule(Format f) {
  switch (f) {
    case Format::kFp8PerTensor:
      return {1, {true, false, false, 0, 0, 1, {{0, 1, 1, false}, {0, 1, 1, false}}},
                 {true, true, false, 0, 0, 1, {{0, 1, 1, false}, {0, 1, 1, false}}}};
    case Format::kMxfp8:  // E8M0 [roundup(M, 128), roundup(ceil(K/32), 4)] and [roundup(ceil(M/32), 4), roundup(K, 128)]
      return {1, {true, false, false, 1, 32, 2, {{0, 1, 128, false}, {1, 32, 4, false}}},
                 {true, false, false, 32, 1, 2, {{0, 32, 4, false}, {1, 1, 128, false}}}};
    case Format::kNvfp4:  // E4M3 [roundup(M, 128), roundup(K/16, 4)] and [roundup(K, 128), roundup(M/16, 4)]
      return {2, {true, false, false, 1, 16, 2, {{0, 1, 128, false}, {1, 16, 4, true}}},
                 {true, true, true, 16, 1, 2, {{1, 1, 128, false}, {0, 16, 4, true}}}};
    case Format::kFp8Block1d:  // f32 [ceil(K/128), roundup(M, 4)] and [ceil(M/128), roundup(K, 4)]
      return {1, {true, false, false, 1, 128, 2, {{1, 128, 1, false}, {0, 1, 4, false}}},
                 {true, true, false, 128, 1, 2, {{0, 128, 1, false}, {1, 1, 4, false}}}};
    case Format::kFp8Block2d:  // f32 [ceil(M/128), roundup(ceil(K/128), 4)] and [ceil(K/128), roundup(ceil(M/128), 4)]
      return {1, {true, false, false, 128, 128, 2, {{0, 128, 1, false}, {1, 128, 4, false}}},
                 {true, true, false, 128, 128, 2, {{1, 128, 1, false}, {0, 128, 4, false}}}};
    default:  // kPlain
      return {1, {true, false, false, 0, 0, 0, {{0, 1, 1, false}, {0, 1, 1, false}}},
                 {false, false, false, 0, 0, 0, {{0, 1, 1, false}, {0, 1, 1, false}}}};
  }
}

// The block length along K of the rowwise copy (MXFP8 32, NVFP4 16, FP8 block 128).
TE_HD constexpr int64_t format_block_len(Format f) { return format_rule(f).row.block_cols; }

struct Dims2 { int64_t r, c; };
struct CopyShapes { Dims2 row, col; };

TE_HD int64_t scale_dim(const ScaleDim& d, int64_t rows, int64_t cols) {
  const int64_t src = d.src == 0 ? rows : cols;
  return roundup(d.exact ? src / d.block : ceil_div(src, d.block), d.pad);
}
TE_HD Dims2 copy_scale_shape(const CopyRule& c, int64_t rows, int64_t cols) {
  if (c.scale_rank == 0) return {0, 0};
  if (c.scale_rank == 1) return {1, 1};
  return {scale_dim(c.scale[0], rows, cols), scale_dim(c.scale[1], rows, cols)};
}
// The padded scale matrices of SPEC §4.8 of an [rows, cols] tensor (a per-tensor scale reads [1, 1]: it is [1]).
TE_HD CopyShapes format_scale_shapes(Format f, int64_t rows, int64_t cols) {
  const FormatRule r = format_rule(f);
  return {copy_scale_shape(r.row, rows, cols), copy_scale_shape(r.col, rows, cols)};
}
// The stored 2-D data matrices (bytes) of an [rows, cols] tensor: [M, K/epb], a transposed copy [K, M/epb].
TE_HD CopyShapes format_data_shapes(Format f, int64_t rows, int64_t cols) {
  const FormatRule r = format_rule(f);
  const int64_t e = r.elems_per_byte;
  const Dims2 row{rows, cols / e};
  return {row, r.col.transposed ? Dims2{cols, rows / e} : row};
}

// ---- host: the whole row, and the decode ------------------------------------------------------------------------
struct FormatInfo {
  Format id;
  const char* name;
  std::vector<DType> elem_types;  // the code types a copy may hold
  DType scale_type;               // kFloat32, kFloat8E8M0 (uint8 bytes) or kFloat8E4M3 (uint8 bytes)
  DecodeRule decode;
  bool global_amax;               // each copy carries a float32 global amax (NVFP4)
  std::vector<QuantKind> kinds;   // the quantizer kinds (SPEC §1.4) that emit it
  int block_dim;                  // the FP8 block quantizer's block_dim (1 or 2); 0 elsewhere
  FormatRule rule;
};
const FormatInfo& format_info(Format f);  // f in [0, kFormatCount)
Format format_of(int id);                 // checked conversion: core_fail names the valid ids

// Decodes one copy as stored (compact scales) to FP32, SPEC §4.9: `codes` the stored data matrix (bytes, packed for
// NVFP4), `scales` the stored scale matrix (bytes of its scale type), `global_amax` the copy's amax (NVFP4). The
// result is the stored matrix's values, [M, K] or for a transposed copy [K, M], row-major.
std::vector<float> format_decode(Format f, bool columnwise, DType code_type, const uint8_t* codes, size_t n_codes,
                                 const uint8_t* scales, size_t n_scale_bytes, float global_amax, int64_t rows,
                                 int64_t cols);

}  // namespace te
