// CUDA kernels of the chunked DCT top-k ops: one thread block per chunk.
// Reference: exogym/ops/dct.py; CPU twin: csrc/cpu/dct.cpp (same selection rule, same layout).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cmath>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "dct_limits.h"

namespace exogym {
namespace {

constexpr int kThreads = 256;
// Two float planes of the chunk live in shared memory.
constexpr int64_t kMaxArea = kMaxChunkArea;

// The orthonormal DCT-II matrix of size n (rows are frequencies), as float on `device`; built
// once per (n, device) and kept (a few KiB each), not rebuilt and copied on every call.
at::Tensor dct_matrix(int64_t n, const at::Device& device) {
  static std::mutex mutex;
  static std::map<std::pair<int64_t, int64_t>, at::Tensor> cache;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_pair(n, static_cast<int64_t>(device.index()));
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  auto opts = at::TensorOptions().dtype(at::kDouble);
  at::Tensor k = at::arange(n, opts).unsqueeze(1);
  at::Tensor i = at::arange(n, opts).unsqueeze(0);
  at::Tensor d = at::cos(M_PI * (2 * i + 1) * k / (2.0 * n)) * std::sqrt(2.0 / n);
  d.select(0, 0).div_(std::sqrt(2.0));
  at::Tensor out = d.to(at::kFloat).to(device);
  cache.emplace(key, out);
  return out;
}

__device__ __forceinline__ uint32_t mag_key(float v) { return __float_as_uint(v) & 0x7fffffffu; }

template <typename scalar_t, typename index_t>
__global__ void encode_kernel(const scalar_t* __restrict__ x, int64_t s0, int64_t s1, int64_t cols, int cr, int cc,
                              int k, const float* __restrict__ dr, const float* __restrict__ dc,
                              index_t* __restrict__ idx_out, scalar_t* __restrict__ val_out) {
  extern __shared__ float smem[];
  __shared__ int s_count;
  __shared__ int s_above[kThreads];
  __shared__ int s_ties[kThreads];
  __shared__ int s_off[kThreads];
  const int area = cr * cc;  // at most kMaxArea: checked by the host function
  float* X = smem;
  float* T = smem + area;
  const int tid = threadIdx.x;
  const int64_t c = blockIdx.x;
  const int64_t gcols = cols / cc;
  const int64_t r0 = (c / gcols) * cr, c0 = (c % gcols) * cc;
  for (int t = tid; t < area; t += blockDim.x) {
    const int i = t / cc, j = t % cc;
    X[t] = static_cast<float>(x[(r0 + i) * s0 + (c0 + j) * s1]);
  }
  __syncthreads();
  for (int t = tid; t < area; t += blockDim.x) {  // T[u][j] = sum_i Dr[u][i] X[i][j]
    const int u = t / cc, j = t % cc;
    float acc = 0.f;
    for (int i = 0; i < cr; ++i) acc += dr[u * cr + i] * X[i * cc + j];
    T[t] = acc;
  }
  __syncthreads();
  for (int t = tid; t < area; t += blockDim.x) {  // C[u][v] = sum_j T[u][j] Dc[v][j], into X
    const int u = t / cc, v = t % cc;
    float acc = 0.f;
    for (int j = 0; j < cc; ++j) acc += T[u * cc + j] * dc[v * cc + j];
    X[t] = acc;
  }
  __syncthreads();
  // The k-th largest magnitude key: the largest v with #{key >= v} >= k, built bit by bit.
  uint32_t prefix = 0;
  for (int bit = 30; bit >= 0; --bit) {
    const uint32_t cand = prefix | (1u << bit);
    if (tid == 0) s_count = 0;
    __syncthreads();
    int local = 0;
    for (int t = tid; t < area; t += blockDim.x) local += mag_key(X[t]) >= cand;
    atomicAdd(&s_count, local);  // integer counts: the order of additions does not matter
    __syncthreads();
    if (s_count >= k) prefix = cand;
    __syncthreads();
  }
  const uint32_t thr = prefix;
  // Ordered output: every key above thr, then ties at thr by ascending index.
  const int per = (area + blockDim.x - 1) / blockDim.x;
  const int lo = min(area, tid * per), hi = min(area, lo + per);
  int above = 0, ties = 0;
  for (int t = lo; t < hi; ++t) {
    const uint32_t key = mag_key(X[t]);
    above += key > thr;
    ties += key == thr;
  }
  s_above[tid] = above;
  s_ties[tid] = ties;
  __syncthreads();
  if (tid == 0) {
    int total_above = 0;
    for (int i = 0; i < blockDim.x; ++i) total_above += s_above[i];
    int allowed = k - total_above, running = 0;
    for (int i = 0; i < blockDim.x; ++i) {
      const int take = min(s_ties[i], max(0, allowed));
      allowed -= take;
      s_ties[i] = take;
      s_off[i] = running;
      running += s_above[i] + take;
    }
  }
  __syncthreads();
  int pos = s_off[tid], tie_quota = s_ties[tid];
  for (int t = lo; t < hi; ++t) {
    const uint32_t key = mag_key(X[t]);
    if (key > thr || (key == thr && tie_quota-- > 0)) {
      idx_out[c * k + pos] = static_cast<index_t>(t);
      val_out[c * k + pos] = static_cast<scalar_t>(X[t]);
      ++pos;
    }
  }
}

std::tuple<at::Tensor, at::Tensor> dct_encode_cuda(const at::Tensor& x, int64_t cr, int64_t cc, int64_t k) {
  TORCH_CHECK(x.dim() == 2, "dct_encode: x must be 2-D [rows, cols]");
  TORCH_CHECK(cr >= 1 && cc >= 1 && x.size(0) % cr == 0 && x.size(1) % cc == 0, "dct_encode: chunk must divide the matrix");
  TORCH_CHECK(k >= 1 && k <= cr * cc, "dct_encode: topk must be in [1, ", cr * cc, "]");
  TORCH_CHECK(cr * cc <= kMaxArea, "dct_encode: the CUDA kernel supports chunks of at most ", kMaxArea,
              " entries, got ", cr, "x", cc, "; use a smaller chunk");
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t nchunks = (x.size(0) / cr) * (x.size(1) / cc);
  const bool small = cr * cc <= (1 << 15);
  at::Tensor idx = at::empty({nchunks, k}, x.options().dtype(small ? at::kShort : at::kInt));
  at::Tensor vals = at::empty({nchunks, k}, x.options());
  if (nchunks == 0) return {idx, vals};
  const at::Tensor dr = dct_matrix(cr, x.device()), dc = dct_matrix(cc, x.device());
  const size_t shmem = 2 * cr * cc * sizeof(float);
  auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "dct_encode_cuda", [&] {
    if (small) {
      encode_kernel<scalar_t, int16_t><<<nchunks, kThreads, shmem, stream>>>(
          x.data_ptr<scalar_t>(), x.stride(0), x.stride(1), x.size(1), cr, cc, k, dr.data_ptr<float>(),
          dc.data_ptr<float>(), idx.data_ptr<int16_t>(), vals.data_ptr<scalar_t>());
    } else {
      encode_kernel<scalar_t, int32_t><<<nchunks, kThreads, shmem, stream>>>(
          x.data_ptr<scalar_t>(), x.stride(0), x.stride(1), x.size(1), cr, cc, k, dr.data_ptr<float>(),
          dc.data_ptr<float>(), idx.data_ptr<int32_t>(), vals.data_ptr<scalar_t>());
    }
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {idx, vals};
}

template <typename scalar_t, typename index_t>
__global__ void decode_kernel(const index_t* __restrict__ idx, const scalar_t* __restrict__ vals, int ranks,
                              int64_t nchunks, int k, int64_t cols, int cr, int cc, const float* __restrict__ dr,
                              const float* __restrict__ dc, bool sign, scalar_t* __restrict__ out) {
  extern __shared__ float smem[];
  const int area = cr * cc;  // at most kMaxArea: checked by the host function
  float* S = smem;                                       // coefficient sums, then means
  int* cnt = reinterpret_cast<int*>(smem + area);        // how many ranks chose each coefficient
  float* T = smem + area;                                // reuses cnt's memory after the means
  const int tid = threadIdx.x;
  const int64_t c = blockIdx.x;
  for (int t = tid; t < area; t += blockDim.x) {
    S[t] = 0.f;
    cnt[t] = 0;
  }
  __syncthreads();
  for (int r = 0; r < ranks; ++r) {  // one rank at a time: sums are formed in rank order
    const int64_t base = (r * nchunks + c) * k;
    for (int t = tid; t < k; t += blockDim.x) {
      const int q = static_cast<int>(idx[base + t]);
      CUDA_KERNEL_ASSERT(q >= 0 && q < area);
      S[q] += static_cast<float>(vals[base + t]);  // a rank's indices are distinct: no race
      cnt[q] += 1;
    }
    __syncthreads();
  }
  for (int t = tid; t < area; t += blockDim.x)
    if (cnt[t] > 1) S[t] /= static_cast<float>(cnt[t]);
  __syncthreads();
  for (int t = tid; t < area; t += blockDim.x) {  // T[u][j] = sum_v S[u][v] Dc[v][j]
    const int u = t / cc, j = t % cc;
    float acc = 0.f;
    for (int v = 0; v < cc; ++v) acc += S[u * cc + v] * dc[v * cc + j];
    T[t] = acc;
  }
  __syncthreads();
  const int64_t gcols = cols / cc;
  const int64_t r0 = (c / gcols) * cr, c0 = (c % gcols) * cc;
  for (int t = tid; t < area; t += blockDim.x) {  // X[i][j] = sum_u Dr[u][i] T[u][j]
    const int i = t / cc, j = t % cc;
    float acc = 0.f;
    for (int u = 0; u < cr; ++u) acc += dr[u * cr + i] * T[u * cc + j];
    if (sign) acc = static_cast<float>((acc > 0.f) - (acc < 0.f));
    out[(r0 + i) * cols + c0 + j] = static_cast<scalar_t>(acc);
  }
}

at::Tensor dct_decode_cuda(const at::Tensor& indices, const at::Tensor& values, int64_t rows, int64_t cols,
                           int64_t cr, int64_t cc, bool sign) {
  TORCH_CHECK(indices.dim() == 3 && indices.sizes() == values.sizes(), "dct_decode: indices and values must both be [ranks, chunks, k]");
  TORCH_CHECK(indices.device() == values.device(), "dct_decode: indices must be on values' device ", values.device(),
              ", got ", indices.device());
  TORCH_CHECK(cr >= 1 && cc >= 1 && rows % cr == 0 && cols % cc == 0, "dct_decode: chunk must divide the matrix");
  TORCH_CHECK(indices.size(1) == (rows / cr) * (cols / cc), "dct_decode: wrong number of chunks");
  TORCH_CHECK(cr * cc <= kMaxArea, "dct_decode: the CUDA kernel supports chunks of at most ", kMaxArea, " entries");
  const c10::cuda::CUDAGuard guard(values.device());
  const at::Tensor ix = indices.contiguous(), vx = values.contiguous();
  at::Tensor out = at::empty({rows, cols}, values.options());
  const int64_t nchunks = indices.size(1);
  if (nchunks == 0) return out;
  const at::Tensor dr = dct_matrix(cr, values.device()), dc = dct_matrix(cc, values.device());
  const size_t shmem = 2 * cr * cc * sizeof(float);
  auto stream = c10::cuda::getCurrentCUDAStream();
  const int ranks = static_cast<int>(indices.size(0)), k = static_cast<int>(indices.size(2));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, values.scalar_type(), "dct_decode_cuda", [&] {
    if (ix.scalar_type() == at::kShort) {
      decode_kernel<scalar_t, int16_t><<<nchunks, kThreads, shmem, stream>>>(
          ix.data_ptr<int16_t>(), vx.data_ptr<scalar_t>(), ranks, nchunks, k, cols, cr, cc, dr.data_ptr<float>(),
          dc.data_ptr<float>(), sign, out.data_ptr<scalar_t>());
    } else {
      TORCH_CHECK(ix.scalar_type() == at::kInt, "dct_decode: indices must be int16 or int32");
      decode_kernel<scalar_t, int32_t><<<nchunks, kThreads, shmem, stream>>>(
          ix.data_ptr<int32_t>(), vx.data_ptr<scalar_t>(), ranks, nchunks, k, cols, cr, cc, dr.data_ptr<float>(),
          dc.data_ptr<float>(), sign, out.data_ptr<scalar_t>());
    }
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(exogym, CUDA, m) {
  m.impl("dct_encode", &dct_encode_cuda);
  m.impl("dct_decode", &dct_decode_cuda);
}

}  // namespace exogym
