// Standalone timing probe of the norm kernels (no torch): nvcc -O3 -fmad=false -std=c++17 -gencode
// arch=compute_90a,code=sm_90a -DTE_WITH_CUDA --expt-relaxed-constexpr -I csrc/core tools/norm_probe.cu -o probe
//   csrc/core/producers/norm/norm_cpu.cpp
// Prints us and % of a device copy's bandwidth for the forward (plain, FP8 delayed, current, MXFP8) and backward at
// 16384 x H, and checks the plain forward, the FP8 delayed codes and the backward byte for byte against the CPU path
// (the test suite checks every mode); for quick kernel experiments on the GPU machine.
#include <cstdio>
#include <cstring>
#include <thread>
#include <algorithm>
#include <vector>

#include "producers/norm/norm_cuda.cu"
#include "producers/norm/norm_fwd_amax.cu"
#include "producers/norm/norm_fwd_fp8.cu"
#include "producers/norm/norm_fwd_mx.cu"
#include "producers/norm/norm_fwd_plain.cu"

using namespace te;

__global__ void fill(uint16_t* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
    const float v = (float(h & 0xFFFF) / 65536.0f - 0.5f) * 4.0f;
    p[i] = uint16_t(__float_as_uint(v) >> 16);
  }
}
__global__ void fillf(float* p, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = 1.0f + 0.001f * float(i % 97);
}
__global__ void copy_kernel(const uint4* a, uint4* b, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    b[i] = a[i];
}

template <typename F> float time_us(F&& f, int reps = 30) {
  cudaEvent_t a, b;
  cudaEventCreate(&a); cudaEventCreate(&b);
  for (int i = 0; i < 3; ++i) f();
  cudaEventRecord(a);
  for (int i = 0; i < reps; ++i) f();
  cudaEventRecord(b);
  cudaEventSynchronize(b);
  float ms = 0; cudaEventElapsedTime(&ms, a, b);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) { printf("CUDA error %s\n", cudaGetErrorString(e)); exit(1); }
  return 1000.0f * ms / reps;
}

ParallelFor serial() {  // 16 host threads, despite the name: the CPU reference of 16384 x 8192 is slow serially
  return [](int64_t n, const std::function<void(int64_t, int64_t)>& body) {
    std::vector<std::thread> t;
    const int64_t k = 16, per = (n + k - 1) / k;
    for (int64_t i = 0; i < k; ++i)
      if (i * per < n) t.emplace_back(body, i * per, std::min(n, (i + 1) * per));
    for (auto& th : t) th.join();
  };
}

template <typename T> std::vector<T> host(const void* d, int64_t n) {
  std::vector<T> v(n);
  cudaMemcpy(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost);
  return v;
}

// Bytes of `n` elements of device buffer d equal to host buffer h; prints the first difference.
template <typename T> bool same(const char* what, const void* d, const std::vector<T>& h, int64_t n) {
  const std::vector<T> g = host<T>(d, n);
  for (int64_t i = 0; i < n; ++i) {
    if (std::memcmp(&g[i], &h[i], sizeof(T)) != 0) {
      printf("  MISMATCH %s at %ld\n", what, long(i));
      return false;
    }
  }
  return true;
}

int main(int argc, char** argv) {
  const int64_t rows = 16384;
  const int64_t hs[] = {4096, 8192};
  const int64_t maxn = rows * 8192;
  uint16_t *x, *dz, *y, *dx; float *gamma, *beta, *mu, *rs, *amax, *scale, *sinv, *part, *dg, *db; uint8_t* mxs;
  cudaMalloc(&x, maxn * 2); cudaMalloc(&dz, maxn * 2); cudaMalloc(&y, maxn * 2); cudaMalloc(&dx, maxn * 2);
  cudaMalloc(&gamma, 8192 * 4); cudaMalloc(&beta, 8192 * 4); cudaMalloc(&mu, rows * 4); cudaMalloc(&rs, rows * 4);
  cudaMalloc(&amax, 4); cudaMalloc(&scale, 4); cudaMalloc(&sinv, 4); cudaMalloc(&mxs, maxn / 32 + 4096);
  cudaMalloc(&part, 2048 * 8192 * 4 * 2); cudaMalloc(&dg, 8192 * 4); cudaMalloc(&db, 8192 * 4);
  fill<<<1024, 256>>>(x, maxn, 1); fill<<<1024, 256>>>(dz, maxn, 2); fillf<<<32, 256>>>(gamma, 8192);
  fillf<<<32, 256>>>(beta, 8192); fillf<<<1, 1>>>(scale, 1);
  const float copy_us = time_us([&] { copy_kernel<<<132 * 8, 512>>>((const uint4*)x, (uint4*)y, rows * 4096 * 2 / 16); });
  const double bw = 2.0 * rows * 4096 * 2 / copy_us / 1e3;  // GB/s
  printf("copy 16384x4096 bf16: %.1f us, %.0f GB/s\n", copy_us, bw);
  for (int64_t h : hs) {
    const double n = double(rows) * h;
    for (int kind = 0; kind < 2; ++kind) {
      NormFwdParams p;
      p.kind = kind ? NormKind::kRmsNorm : NormKind::kLayerNorm;
      p.x = x; p.gamma = gamma; p.beta = kind ? nullptr : beta; p.y = y; p.mu = mu; p.rsigma = rs;
      p.rows = rows; p.hidden = h; p.x_dtype = DType::kBFloat16; p.out_dtype = DType::kBFloat16;
      const char* kn = kind ? "rms" : "ln ";
      struct M { const char* name; int mode; double bytes; } modes[] = {{"plain  ", 0, 4}, {"delayed", 1, 3},
                                                                        {"current", 2, 5}, {"mxfp8  ", 3, 3 + 1.0 / 32}};
      for (auto m : modes) {
        NormFwdParams q = p;
        q.fp8_mode = m.mode; q.scale = scale; q.amax = amax; q.scale_inv = sinv; q.mx_scale = mxs;
        const float us = time_us([&] { norm_fwd_cuda(q, 0); });
        const double floor_us = m.bytes * n / bw / 1e3;
        if ((m.mode == 0 || m.mode == 1) && !(argc > 1 && std::strcmp(argv[1], "fast") == 0)) {  // bytes against the CPU's y (and its FP8 codes of y * scale)
          NormFwdParams c = p;
          std::vector<uint16_t> hx = host<uint16_t>(x, rows * h);
          std::vector<float> hg = host<float>(gamma, h), hb = host<float>(beta, h), hy(rows * h), hmu(rows), hrs(rows);
          c.x = hx.data(); c.gamma = hg.data(); c.beta = kind ? nullptr : hb.data(); c.y = hy.data();
          c.mu = hmu.data(); c.rsigma = hrs.data(); c.out_dtype = DType::kFloat32;
          norm_fwd_cpu(c, serial());
          bool ok = same("rsigma", rs, hrs, rows) && (kind || same("mu", mu, hmu, rows));
          if (m.mode == 0) {
            std::vector<uint16_t> yb(rows * h);
            for (int64_t i = 0; i < rows * h; ++i) yb[i] = from_float<bf16_t>(hy[i]).bits;
            ok = ok && same("y", y, yb, rows * h);
          } else {
            const float sc = host<float>(scale, 1)[0];
            std::vector<uint8_t> yc(rows * h);
            for (int64_t i = 0; i < rows * h; ++i) yc[i] = float_to_fp8(hy[i] * sc, true);
            ok = ok && same("fp8 codes", y, yc, rows * h);
          }
          printf("  bytes %s\n", ok ? "EQUAL to the CPU" : "DIFFER from the CPU");
        }
        printf("%s fwd %s H=%5ld %8.1f us  %5.1f %%copy  %.2fx floor\n", kn, m.name, long(h), us, 100 * floor_us / us,
               us / floor_us);
      }
      NormBwdParams b;
      b.kind = p.kind; b.dz = dz; b.x = x; b.mu = mu; b.rsigma = rs; b.gamma = gamma; b.dx = dx;
      b.dgamma_part = part; b.dbeta_part = kind ? nullptr : part + 2048 * 8192; b.dgamma = dg;
      b.dbeta = kind ? nullptr : db; b.rows = rows; b.hidden = h; b.x_dtype = DType::kBFloat16;
      b.gamma_dtype = DType::kFloat32;
      const float us = time_us([&] { norm_bwd_cuda(b, 0); });
      const double floor_us = 6 * n / bw / 1e3;
      if (!(argc > 1 && std::strcmp(argv[1], "fast") == 0)) {
        NormBwdParams c = b;
        std::vector<uint16_t> hx = host<uint16_t>(x, rows * h), hdz = host<uint16_t>(dz, rows * h), hdx(rows * h);
        std::vector<float> hg = host<float>(gamma, h), hmu = host<float>(mu, rows), hrs = host<float>(rs, rows);
        std::vector<float> hpart(norm_bwd_blocks(rows, h) * h * 2), hdg(h), hdb(h);
        c.x = hx.data(); c.dz = hdz.data(); c.gamma = hg.data(); c.mu = hmu.data(); c.rsigma = hrs.data();
        c.dx = hdx.data(); c.dgamma_part = hpart.data();
        c.dbeta_part = kind ? nullptr : hpart.data() + norm_bwd_blocks(rows, h) * h;
        c.dgamma = hdg.data(); c.dbeta = kind ? nullptr : hdb.data();
        norm_bwd_cpu(c, serial());
        const bool ok = same("dx", dx, hdx, rows * h) && same("dgamma", dg, hdg, h) && (kind || same("dbeta", db, hdb, h));
        printf("  bytes %s\n", ok ? "EQUAL to the CPU" : "DIFFER from the CPU");
      }
      printf("%s bwd         H=%5ld %8.1f us  %5.1f %%copy  %.2fx floor\n", kn, long(h), us, 100 * floor_us / us,
             us / floor_us);
    }
  }
  return 0;
}
