// Counter-based hash shared by the CPU and CUDA kernels, so both select the same indices.
// The pure-torch twin is exogym/ops/sparse.py: change one, change the other.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define EXOGYM_HD __host__ __device__ __forceinline__
#else
#define EXOGYM_HD inline
#endif

namespace exogym {

// "lowbias32" integer finaliser (C. Wellons, hash-prospector): a bijection on uint32 with
// low avalanche bias.
EXOGYM_HD uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}

// One 32-bit key per (seed, step, tensor id); every index of that tensor derives from it.
EXOGYM_HD uint32_t stream_key(uint64_t seed, uint64_t step, uint64_t tensor_id) {
  uint32_t h = mix32(static_cast<uint32_t>(seed) ^ 0x9e3779b9U);
  h = mix32(h ^ static_cast<uint32_t>(seed >> 32));
  h = mix32(h ^ static_cast<uint32_t>(step));
  h = mix32(h ^ static_cast<uint32_t>(step >> 32));
  h = mix32(h ^ static_cast<uint32_t>(tensor_id));
  return h;
}

// Stratified selection: stratum j = [j*n/k, (j+1)*n/k) contributes exactly one index, drawn by
// a 62-bit hash of (key, j). Each element is chosen with probability 1/|stratum| ~= k/n.
EXOGYM_HD int64_t stratified_index(uint32_t key, int64_t j, int64_t n, int64_t k) {
  const int64_t start = (j * n) / k;
  const int64_t stop = ((j + 1) * n) / k;
  const uint64_t uj = static_cast<uint64_t>(j);
  uint32_t a = mix32(key ^ static_cast<uint32_t>(uj));
  a = mix32(a ^ static_cast<uint32_t>(uj >> 32));
  const uint32_t b = mix32(a ^ 0x85ebca6bU);
  const uint64_t r = ((static_cast<uint64_t>(a) & 0x7fffffffULL) << 31) |
                     (static_cast<uint64_t>(b) & 0x7fffffffULL);
  return start + static_cast<int64_t>(r % static_cast<uint64_t>(stop - start));
}

}  // namespace exogym
