// What a producer kernel writes: one output mode per emitter (plain, per-tensor FP8 delayed / current, the amax pass,
// NVFP4); the producers' kernel parameters carry one (producers/activation.h's ActKernelParams::mode).
#pragma once

#include "../rules/common.h"

namespace te {

// What the kernel writes. kAmaxOnly is the first pass of current scaling: amax of the unrounded FP32 values,
// no output. kCurrent reads that amax from `amax`, derives the scale (SPEC §4.4) and rounds the value to the
// input dtype before scaling; kDelayed scales the unrounded value and max-accumulates into `amax`.
// kNvfp4 (CUDA only, aligned rows, no dbias; SPEC §5.1 FUSED_ACTIVATION_AMAX_NVFP4 without RHT, SR or 2-D tiles):
// the values rnd_in(act) as NVFP4 with the global amax of a previous kAmaxOnly pass; `out` holds the packed
// rowwise codes [rows, out_cols/2], `out_t` the packed transposed codes [out_cols, rows/2] (rows % 16 == 0).
enum class ScaleMode : int { kPlain = 0, kDelayed = 1, kCurrent = 2, kAmaxOnly = 3, kNvfp4 = 4 };

TE_HD bool mode_writes_fp8(ScaleMode m) { return m == ScaleMode::kDelayed || m == ScaleMode::kCurrent; }
TE_HD bool mode_tracks_amax(ScaleMode m) { return m == ScaleMode::kDelayed || m == ScaleMode::kAmaxOnly; }

}  // namespace te
