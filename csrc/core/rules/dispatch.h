// Runtime -> compile-time dispatch shared by the kernel families (activation / cast, the format casts): one
// switch per runtime choice, each naming the accepted values in its error.
#pragma once

#include <string>

#include "common.h"
#include "numerics.h"

// Runtime -> compile-time switches. The default cases name the accepted values.
#define TE_SWITCH_IN_DTYPE(dtype, T, ...)                                                              \
  switch (dtype) {                                                                                     \
    case ::te::DType::kFloat32: { using T = float; __VA_ARGS__; break; }                               \
    case ::te::DType::kFloat16: { using T = ::te::fp16_t; __VA_ARGS__; break; }                        \
    case ::te::DType::kBFloat16: { using T = ::te::bf16_t; __VA_ARGS__; break; }                       \
    default: ::te::core_fail("input dtype code " + std::to_string(int(dtype)) +                         \
                             " is not supported; accepted: float32 (4), float16 (5), bfloat16 (6)");   \
  }
