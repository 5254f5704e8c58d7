// CPU kernels of the chunked DCT top-k ops. Reference: exogym/ops/dct.py.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <tuple>
#include <vector>

#include "dct_limits.h"
#include "dct_plan.h"

namespace exogym {
namespace {

// The k-th largest of n non-negative float bit patterns (as uint32, order-preserving): one
// histogram pass over the top 11 bits finds the bucket that holds it, then a selection among
// that bucket's few members. Faster than nth_element on the whole chunk.
uint32_t kth_largest_key(const uint32_t* keys, int64_t n, int64_t k, std::vector<int32_t>& hist,
                         std::vector<uint32_t>& cand) {
  constexpr int kShift = 21;
  hist.assign(1 << (32 - kShift), 0);
  for (int64_t t = 0; t < n; ++t) hist[keys[t] >> kShift] += 1;
  int64_t above = 0;
  int b = static_cast<int>(hist.size()) - 1;
  for (; b > 0 && above + hist[b] < k; --b) above += hist[b];
  cand.clear();
  for (int64_t t = 0; t < n; ++t)
    if ((keys[t] >> kShift) == static_cast<uint32_t>(b)) cand.push_back(keys[t]);
  const int64_t r = k - above;  // r-th largest within the bucket
  std::nth_element(cand.begin(), cand.begin() + (r - 1), cand.end(), std::greater<uint32_t>());
  return cand[r - 1];
}

void check_chunks(int64_t rows, int64_t cols, int64_t cr, int64_t cc, const char* op) {
  TORCH_CHECK(cr >= 1 && cc >= 1 && rows % cr == 0 && cols % cc == 0, op, ": chunk ", cr, "x", cc,
              " must divide the ", rows, "x", cols, " matrix");
  TORCH_CHECK(cr * cc <= kMaxChunkArea, op, ": chunks hold at most ", kMaxChunkArea, " entries (on every device), got ",
              cr, "x", cc, "; use a smaller chunk");
}

template <typename index_t>
void encode_impl(const at::Tensor& x, int64_t cr, int64_t cc, int64_t k, at::Tensor& idx, at::Tensor& vals) {
  const int64_t rows = x.size(0), cols = x.size(1);
  const int64_t s0 = x.stride(0), s1 = x.stride(1);
  const int64_t gcols = cols / cc, nchunks = (rows / cr) * gcols, area = cr * cc;
  const DctPlan pr(static_cast<int>(cr)), pc(static_cast<int>(cc));
  index_t* ip = idx.data_ptr<index_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "dct_encode", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* vp = vals.data_ptr<scalar_t>();
    at::parallel_for(0, nchunks, 8, [&](int64_t begin, int64_t end) {
      std::vector<float> block(area), rowt(area), colt(area), coef(area);
      std::vector<float> work(std::max(pr.workspace(static_cast<int>(cc)), pc.workspace(static_cast<int>(cr))));
      std::vector<uint32_t> keys(area), cand;
      std::vector<int32_t> hist;
      for (int64_t c = begin; c < end; ++c) {
        const int64_t r0 = (c / gcols) * cr, c0 = (c % gcols) * cc;
        for (int64_t i = 0; i < cr; ++i) {
          const scalar_t* src = xp + (r0 + i) * s0 + c0 * s1;
          float* dst = block.data() + i * cc;
          if (s1 == 1) {
            for (int64_t j = 0; j < cc; ++j) dst[j] = static_cast<float>(src[j]);
          } else {
            for (int64_t j = 0; j < cc; ++j) dst[j] = static_cast<float>(src[j * s1]);
          }
        }
        pr.forward(block.data(), rowt.data(), static_cast<int>(cc), work.data());  // rowt[u][j]
        for (int64_t u = 0; u < cr; ++u)
          for (int64_t j = 0; j < cc; ++j) colt[j * cr + u] = rowt[u * cc + j];
        pc.forward(colt.data(), coef.data(), static_cast<int>(cr), work.data());  // coef[v][u]
        // Coefficients in row-major chunk order (u*cc+v), their magnitudes' bit patterns, and
        // the k-th largest as the threshold.
        for (int64_t u = 0; u < cr; ++u)
          for (int64_t v = 0; v < cc; ++v) block[u * cc + v] = coef[v * cr + u];
        for (int64_t t = 0; t < area; ++t) {
          uint32_t bits;
          std::memcpy(&bits, &block[t], sizeof(bits));
          keys[t] = bits & 0x7fffffffu;
        }
        const uint32_t thr = kth_largest_key(keys.data(), area, k, hist, cand);
        // Everything above the threshold, then ties at it by ascending index: sorted output.
        int64_t above = 0;
        for (int64_t t = 0; t < area; ++t) above += keys[t] > thr;
        int64_t ties = k - above, n = 0;
        for (int64_t t = 0; t < area && n < k; ++t) {
          const bool take = keys[t] > thr || (keys[t] == thr && ties-- > 0);
          if (take) {
            ip[c * k + n] = static_cast<index_t>(t);
            vp[c * k + n] = static_cast<scalar_t>(block[t]);
            ++n;
          }
        }
      }
    });
  });
}

std::tuple<at::Tensor, at::Tensor> dct_encode_cpu(const at::Tensor& x, int64_t cr, int64_t cc, int64_t k) {
  TORCH_CHECK(x.dim() == 2, "dct_encode: x must be 2-D [rows, cols], got ", x.dim(), " dims");
  check_chunks(x.size(0), x.size(1), cr, cc, "dct_encode");
  TORCH_CHECK(k >= 1 && k <= cr * cc, "dct_encode: topk must be in [1, ", cr * cc, "], got ", k);
  const int64_t nchunks = (x.size(0) / cr) * (x.size(1) / cc);
  const bool small = cr * cc <= (1 << 15);
  at::Tensor idx = at::empty({nchunks, k}, x.options().dtype(small ? at::kShort : at::kInt));
  at::Tensor vals = at::empty({nchunks, k}, x.options());
  if (small) {
    encode_impl<int16_t>(x, cr, cc, k, idx, vals);
  } else {
    encode_impl<int32_t>(x, cr, cc, k, idx, vals);
  }
  return {idx, vals};
}

// The orthonormal DCT-II matrix of size n, row-major (rows are frequencies).
std::vector<float> dct_matrix(int64_t n) {
  std::vector<float> d(static_cast<size_t>(n * n));
  for (int64_t k = 0; k < n; ++k)
    for (int64_t i = 0; i < n; ++i)
      d[k * n + i] = static_cast<float>(std::sqrt((k == 0 ? 1.0 : 2.0) / n) * std::cos(M_PI * (2 * i + 1) * k / (2.0 * n)));
  return d;
}

// Decode exploits sparsity: a chunk has at most ranks*k non-zero coefficients C[u][v], so the
// column pass T = C Dc is one axpy of a basis row per coefficient, and only the row pass
// X = Dr^T T runs the fast inverse DCT (along dim 0, no transposes).
template <typename index_t>
void decode_impl(const at::Tensor& indices, const at::Tensor& values, int64_t rows, int64_t cols, int64_t cr,
                 int64_t cc, bool sign, at::Tensor& out) {
  const int64_t ranks = indices.size(0), nchunks = indices.size(1), k = indices.size(2);
  const int64_t gcols = cols / cc, area = cr * cc;
  const DctPlan pr(static_cast<int>(cr));
  const std::vector<float> dc = dct_matrix(cc);
  const index_t* ip = indices.data_ptr<index_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, values.scalar_type(), "dct_decode", [&] {
    const scalar_t* vp = values.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, nchunks, 8, [&](int64_t begin, int64_t end) {
      std::vector<float> sum(area, 0.f), t(area), block(area), work(pr.workspace(static_cast<int>(cc)));
      std::vector<int32_t> count(area, 0);
      std::vector<int32_t> touched;
      touched.reserve(ranks * k);
      for (int64_t c = begin; c < end; ++c) {
        touched.clear();
        for (int64_t r = 0; r < ranks; ++r) {  // ranks in order: the sums do not depend on timing
          const int64_t base = (r * nchunks + c) * k;
          for (int64_t i = 0; i < k; ++i) {
            const int64_t q = static_cast<int64_t>(ip[base + i]);
            TORCH_CHECK(q >= 0 && q < area, "dct_decode: index ", q, " out of range for a ", cr, "x", cc, " chunk");
            if (count[q]++ == 0) touched.push_back(static_cast<int32_t>(q));
            sum[q] += static_cast<float>(vp[base + i]);
          }
        }
        std::fill(t.begin(), t.end(), 0.f);
        for (const int32_t q : touched) {  // T[u, :] += mean(C[u][v]) * Dc[v, :]
          const float mean = sum[q] / static_cast<float>(count[q]);
          row_axpy(t.data() + (q / cc) * cc, dc.data() + (q % cc) * cc, mean, static_cast<int>(cc));
          sum[q] = 0.f;
          count[q] = 0;
        }
        pr.inverse(t.data(), block.data(), static_cast<int>(cc), work.data());  // block[i][j]
        const int64_t r0 = (c / gcols) * cr, c0 = (c % gcols) * cc;
        for (int64_t i = 0; i < cr; ++i) {
          const float* src = block.data() + i * cc;
          scalar_t* dst = op + (r0 + i) * cols + c0;
          if (sign) {
            for (int64_t j = 0; j < cc; ++j) dst[j] = static_cast<scalar_t>(static_cast<float>((src[j] > 0.f) - (src[j] < 0.f)));
          } else {
            for (int64_t j = 0; j < cc; ++j) dst[j] = static_cast<scalar_t>(src[j]);
          }
        }
      }
    });
  });
}

at::Tensor dct_decode_cpu(const at::Tensor& indices, const at::Tensor& values, int64_t rows, int64_t cols, int64_t cr,
                          int64_t cc, bool sign) {
  TORCH_CHECK(indices.dim() == 3 && indices.sizes() == values.sizes(),
              "dct_decode: indices and values must both be [ranks, chunks, k]");
  TORCH_CHECK(indices.device() == values.device(), "dct_decode: indices must be on values' device ", values.device(),
              ", got ", indices.device());
  check_chunks(rows, cols, cr, cc, "dct_decode");
  TORCH_CHECK(indices.size(1) == (rows / cr) * (cols / cc), "dct_decode: expected ", (rows / cr) * (cols / cc),
              " chunks, got ", indices.size(1));
  const at::Tensor ix = indices.contiguous();
  const at::Tensor vx = values.contiguous();
  at::Tensor out = at::empty({rows, cols}, values.options());
  if (ix.scalar_type() == at::kShort) {
    decode_impl<int16_t>(ix, vx, rows, cols, cr, cc, sign, out);
  } else {
    TORCH_CHECK(ix.scalar_type() == at::kInt, "dct_decode: indices must be int16 or int32, got ", ix.scalar_type());
    decode_impl<int32_t>(ix, vx, rows, cols, cr, cc, sign, out);
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(exogym, CPU, m) {
  m.impl("dct_encode", &dct_encode_cpu);
  m.impl("dct_decode", &dct_decode_cpu);
}

}  // namespace exogym
