// CUDA kernels of the sparse index ops. Reference: exogym/ops/sparse.py; CPU twin: csrc/cpu/sparse.cpp.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "hash.h"

namespace exogym {
namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t n) { return static_cast<int>((n + kThreads - 1) / kThreads); }

__global__ void select_kernel(uint32_t key, int64_t n, int64_t k, int64_t* __restrict__ out) {
  const int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (j < k) out[j] = stratified_index(key, j, n, k);
}

void select_indices_cuda(int64_t n, int64_t seed, int64_t step, int64_t tensor_id, at::Tensor& out) {
  TORCH_CHECK(out.scalar_type() == at::kLong && out.is_contiguous() && out.dim() == 1,
              "select_indices: out must be a contiguous 1-D int64 tensor");
  const int64_t k = out.numel();
  TORCH_CHECK(n >= 0 && k <= n, "select_indices: need 0 <= k <= n, got k=", k, " n=", n);
  if (k == 0) return;
  const c10::cuda::CUDAGuard guard(out.device());
  const uint32_t key = stream_key(static_cast<uint64_t>(seed), static_cast<uint64_t>(step), static_cast<uint64_t>(tensor_id));
  select_kernel<<<blocks_for(k), kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(key, n, k, out.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename scalar_t>
__global__ void gather_kernel(const scalar_t* __restrict__ src, const int64_t* __restrict__ idx, int64_t m, int64_t n,
                              scalar_t* __restrict__ out) {
  const int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (j < m) {
    const int64_t t = idx[j];
    CUDA_KERNEL_ASSERT(t >= 0 && t < n);
    out[j] = src[t];
  }
}

template <typename scalar_t>
__global__ void scatter_kernel(scalar_t* __restrict__ dst, const int64_t* __restrict__ idx, int64_t m, int64_t n,
                               const scalar_t* __restrict__ vals, at::opmath_type<scalar_t> scale) {
  const int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (j < m) {
    const int64_t t = idx[j];
    CUDA_KERNEL_ASSERT(t >= 0 && t < n);
    dst[t] = static_cast<scalar_t>(static_cast<at::opmath_type<scalar_t>>(vals[j]) * scale);
  }
}

at::Tensor sparse_gather_cuda(at::TensorList srcs, at::TensorList indices) {
  TORCH_CHECK(!srcs.empty() && srcs.size() == indices.size(), "sparse_gather: need one index tensor per source");
  const c10::cuda::CUDAGuard guard(srcs[0].device());
  int64_t total = 0;
  for (const auto& ix : indices) total += ix.numel();
  at::Tensor out = at::empty({total}, srcs[0].options());
  auto stream = c10::cuda::getCurrentCUDAStream();
  int64_t offset = 0;
  for (size_t i = 0; i < srcs.size(); ++i) {
    TORCH_CHECK(srcs[i].scalar_type() == srcs[0].scalar_type(), "sparse_gather: all tensors must share one dtype");
    TORCH_CHECK(indices[i].scalar_type() == at::kLong, "sparse_gather: indices must be int64");
    TORCH_CHECK(indices[i].device() == srcs[i].device(), "sparse_gather: indices[", i, "] must be on ",
                srcs[i].device(), ", got ", indices[i].device());
    const at::Tensor src = srcs[i].contiguous();
    const at::Tensor ix = indices[i].contiguous();
    const int64_t m = ix.numel();
    if (m > 0) {
      AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, src.scalar_type(), "sparse_gather_cuda", [&] {
        gather_kernel<scalar_t><<<blocks_for(m), kThreads, 0, stream>>>(
            src.data_ptr<scalar_t>(), ix.data_ptr<int64_t>(), m, src.numel(), out.data_ptr<scalar_t>() + offset);
      });
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    offset += m;
  }
  return out;
}

void sparse_scatter_cuda(at::TensorList dsts, at::TensorList indices, const at::Tensor& values, double scale) {
  TORCH_CHECK(dsts.size() == indices.size(), "sparse_scatter_: need one index tensor per destination");
  int64_t total = 0;
  for (const auto& ix : indices) total += ix.numel();
  const at::Tensor vals = values.contiguous();
  TORCH_CHECK(vals.dim() == 1 && vals.numel() == total, "sparse_scatter_: values must be 1-D with ", total, " elements");
  if (dsts.empty()) return;
  const c10::cuda::CUDAGuard guard(dsts[0].device());
  auto stream = c10::cuda::getCurrentCUDAStream();
  int64_t offset = 0;
  for (size_t i = 0; i < dsts.size(); ++i) {
    at::Tensor dst = dsts[i];
    TORCH_CHECK(dst.scalar_type() == vals.scalar_type(), "sparse_scatter_: values dtype must match the destination");
    TORCH_CHECK(indices[i].device() == dst.device() && vals.device() == dst.device(), "sparse_scatter_: indices[", i,
                "] and values must be on ", dst.device());
    at::Tensor work = dst.is_contiguous() ? dst : dst.contiguous();
    const at::Tensor ix = indices[i].contiguous();
    const int64_t m = ix.numel();
    if (m > 0) {
      AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, work.scalar_type(), "sparse_scatter_cuda", [&] {
        scatter_kernel<scalar_t><<<blocks_for(m), kThreads, 0, stream>>>(
            work.data_ptr<scalar_t>(), ix.data_ptr<int64_t>(), m, work.numel(), vals.data_ptr<scalar_t>() + offset,
            static_cast<at::opmath_type<scalar_t>>(scale));
      });
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    if (!work.is_same(dst)) dst.copy_(work);
    offset += m;
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(exogym, CUDA, m) {
  m.impl("select_indices", &select_indices_cuda);
  m.impl("sparse_gather", &sparse_gather_cuda);
  m.impl("sparse_scatter_", &sparse_scatter_cuda);
}

}  // namespace exogym
