// The one parallel loop of the CPU kernels (activation / cast, the format casts, the GEMMs, the partial sums): the
// host supplies it (torch's thread pool, or a serial loop) and the kernel calls body(begin, end) over [0, n).
#pragma once

#include <cstdint>
#include <functional>

namespace te {

using ParallelFor = std::function<void(int64_t n, const std::function<void(int64_t, int64_t)>& body)>;

}  // namespace te
