// CPU kernels of the sparse index ops. Reference: exogym/ops/sparse.py.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <vector>

#include "hash.h"

namespace exogym {
namespace {

void select_indices_cpu(int64_t n, int64_t seed, int64_t step, int64_t tensor_id, at::Tensor& out) {
  TORCH_CHECK(out.scalar_type() == at::kLong, "select_indices: out must be int64, got ", out.scalar_type());
  TORCH_CHECK(out.is_contiguous() && out.dim() == 1, "select_indices: out must be a contiguous 1-D tensor");
  const int64_t k = out.numel();
  TORCH_CHECK(n >= 0 && k <= n, "select_indices: need 0 <= k <= n, got k=", k, " n=", n);
  if (k == 0) return;
  const uint32_t key = stream_key(static_cast<uint64_t>(seed), static_cast<uint64_t>(step),
                                  static_cast<uint64_t>(tensor_id));
  int64_t* o = out.data_ptr<int64_t>();
  at::parallel_for(0, k, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) o[j] = stratified_index(key, j, n, k);
  });
}

void check_pairs(const at::TensorList& a, const at::TensorList& idx, const char* op) {
  TORCH_CHECK(a.size() == idx.size(), op, ": got ", a.size(), " tensors but ", idx.size(), " index tensors");
  for (size_t i = 0; i < a.size(); ++i) {
    TORCH_CHECK(idx[i].scalar_type() == at::kLong && idx[i].dim() == 1, op,
                ": indices[", i, "] must be a 1-D int64 tensor");
    TORCH_CHECK(a[i].scalar_type() == a[0].scalar_type(), op, ": all tensors must share one dtype");
    TORCH_CHECK(idx[i].device() == a[i].device(), op, ": indices[", i, "] must be on its tensor's device ",
                a[i].device(), ", got ", idx[i].device());
  }
}

at::Tensor sparse_gather_cpu(at::TensorList srcs, at::TensorList indices) {
  check_pairs(srcs, indices, "sparse_gather");
  TORCH_CHECK(!srcs.empty(), "sparse_gather: srcs must not be empty");
  int64_t total = 0;
  for (const auto& ix : indices) total += ix.numel();
  at::Tensor out = at::empty({total}, srcs[0].options());
  int64_t offset = 0;
  for (size_t i = 0; i < srcs.size(); ++i) {
    const at::Tensor src = srcs[i].contiguous();
    const at::Tensor ix = indices[i].contiguous();
    const int64_t m = ix.numel();
    const int64_t n = src.numel();
    const int64_t* ip = ix.data_ptr<int64_t>();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, src.scalar_type(), "sparse_gather", [&] {
      const scalar_t* s = src.data_ptr<scalar_t>();
      scalar_t* o = out.data_ptr<scalar_t>() + offset;
      at::parallel_for(0, m, 16384, [&](int64_t b, int64_t e) {
        for (int64_t j = b; j < e; ++j) {
          const int64_t t = ip[j];
          TORCH_CHECK(t >= 0 && t < n, "sparse_gather: index ", t, " out of range for ", n, " elements");
          o[j] = s[t];
        }
      });
    });
    offset += m;
  }
  return out;
}

void sparse_scatter_cpu(at::TensorList dsts, at::TensorList indices, const at::Tensor& values, double scale) {
  check_pairs(dsts, indices, "sparse_scatter_");
  const at::Tensor vals = values.contiguous();
  int64_t total = 0;
  for (const auto& ix : indices) total += ix.numel();
  TORCH_CHECK(vals.dim() == 1 && vals.numel() == total, "sparse_scatter_: values must be 1-D with ",
              total, " elements (the sum of the index lengths), got ", vals.sizes());
  if (!dsts.empty()) {
    TORCH_CHECK(vals.scalar_type() == dsts[0].scalar_type(), "sparse_scatter_: values dtype ",
                vals.scalar_type(), " must match the destination dtype ", dsts[0].scalar_type());
  }
  int64_t offset = 0;
  for (size_t i = 0; i < dsts.size(); ++i) {
    at::Tensor dst = dsts[i];
    // Non-contiguous destinations are written through a contiguous copy, then copied back.
    at::Tensor work = dst.is_contiguous() ? dst : dst.contiguous();
    const at::Tensor ix = indices[i].contiguous();
    const int64_t m = ix.numel();
    const int64_t n = work.numel();
    const int64_t* ip = ix.data_ptr<int64_t>();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, work.scalar_type(), "sparse_scatter_", [&] {
      using acc_t = at::opmath_type<scalar_t>;
      const scalar_t* v = vals.data_ptr<scalar_t>() + offset;
      scalar_t* d = work.data_ptr<scalar_t>();
      const acc_t s = static_cast<acc_t>(scale);
      at::parallel_for(0, m, 16384, [&](int64_t b, int64_t e) {
        for (int64_t j = b; j < e; ++j) {
          const int64_t t = ip[j];
          TORCH_CHECK(t >= 0 && t < n, "sparse_scatter_: index ", t, " out of range for ", n, " elements");
          d[t] = static_cast<scalar_t>(static_cast<acc_t>(v[j]) * s);
        }
      });
    });
    if (!work.is_same(dst)) dst.copy_(work);
    offset += m;
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(exogym, CPU, m) {
  m.impl("select_indices", &select_indices_cpu);
  m.impl("sparse_gather", &sparse_gather_cpu);
  m.impl("sparse_scatter_", &sparse_scatter_cpu);
}

}  // namespace exogym
