// Fast orthonormal DCT-II / DCT-III of one length, applied to many vectors at once.
// Shared by the CPU kernels; the pure-torch reference is exogym/ops/dct.py.
//
// Lee's algorithm (B. G. Lee, "A new algorithm to compute the discrete cosine transform",
// IEEE TASSP 1984) for even lengths: with g[n] = x[n] + x[N-1-n] and
// h[n] = (x[n] - x[N-1-n]) / (2 cos(pi (2n+1) / 2N)), the unnormalised DCT-II satisfies
// X[2k] = G[k] and X[2k+1] = H[k] + H[k+1] (H[N/2] = 0), where G, H are half-length DCT-IIs.
// Odd lengths use the cosine matrix directly. The inverse (DCT-III) runs the transposed network.
//
// Vectors are the rows' columns of a [N, W] row-major block: every step is a loop over W
// contiguous floats, which the compiler vectorises.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace exogym {

// Element-wise row kernels. __restrict__ tells the compiler the rows do not overlap, so the
// loops vectorise.
inline void row_add(float* __restrict__ o, const float* __restrict__ a, const float* __restrict__ b, int64_t w) {
  for (int64_t j = 0; j < w; ++j) o[j] = a[j] + b[j];
}
inline void row_butterfly(float* __restrict__ g, float* __restrict__ h, const float* __restrict__ a,
                          const float* __restrict__ b, float c, int64_t w) {
  for (int64_t j = 0; j < w; ++j) {
    g[j] = a[j] + b[j];
    h[j] = (a[j] - b[j]) * c;
  }
}
inline void row_unbutterfly(float* __restrict__ a, float* __restrict__ b, const float* __restrict__ g,
                            const float* __restrict__ h, float c, int64_t w) {
  for (int64_t j = 0; j < w; ++j) {
    const float t = h[j] * c;
    a[j] = g[j] + t;
    b[j] = g[j] - t;
  }
}
inline void row_axpy(float* __restrict__ o, const float* __restrict__ x, float c, int64_t w) {
  for (int64_t j = 0; j < w; ++j) o[j] += c * x[j];
}
inline void row_scale(float* __restrict__ o, const float* __restrict__ x, float s, int64_t w) {
  for (int64_t j = 0; j < w; ++j) o[j] = x[j] * s;
}

class DctPlan {
 public:
  explicit DctPlan(int64_t n) : n_(n) {
    scale_.resize(n);
    for (int64_t k = 0; k < n; ++k) scale_[k] = static_cast<float>(std::sqrt(2.0 / n) * (k == 0 ? std::sqrt(0.5) : 1.0));
    build(n);
  }
  int64_t size() const { return n_; }

  // out[k, :] = sum_n D[k, n] in[n, :] for a [N, W] block (orthonormal DCT-II along dim 0).
  // `work` must hold at least workspace(W) floats. `in` and `out` must not overlap.
  void forward(const float* in, float* out, int64_t w, float* work) const {
    forward_rec(0, in, out, w, work);
    for (int64_t k = 0; k < n_; ++k) {
      float* row = out + static_cast<int64_t>(k) * w;
      const float s = scale_[k];
      for (int64_t j = 0; j < w; ++j) row[j] *= s;  // in place: no aliasing question
    }
  }

  // out[n, :] = sum_k D[k, n] in[k, :] (the inverse, DCT-III). `in` is left unchanged.
  void inverse(const float* in, float* out, int64_t w, float* work) const {
    float* scaled = work;
    for (int64_t k = 0; k < n_; ++k) {
      row_scale(scaled + static_cast<int64_t>(k) * w, in + static_cast<int64_t>(k) * w, scale_[k], w);
    }
    inverse_rec(0, scaled, out, w, work + static_cast<int64_t>(n_) * w);
  }

  // Floats of scratch space forward()/inverse() need for vectors of width w.
  int64_t workspace(int64_t w) const { return static_cast<int64_t>(6) * n_ * w + 64; }

 private:
  struct Level {
    int64_t n;
    std::vector<float> inv2cos;  // 1 / (2 cos(pi (2i+1) / 2n)), i < n/2 (even n)
    std::vector<float> cosmat;   // unnormalised cos matrix, row-major [k][i] (odd n > 1)
  };

  void build(int64_t n) {
    Level lv;
    lv.n = n;
    if (n > 1 && n % 2 == 0) {
      for (int64_t i = 0; i < n / 2; ++i) lv.inv2cos.push_back(static_cast<float>(0.5 / std::cos(M_PI * (2 * i + 1) / (2.0 * n))));
      levels_.push_back(lv);
      build(n / 2);
    } else {
      if (n > 1) {
        lv.cosmat.resize(static_cast<size_t>(n) * n);
        for (int64_t k = 0; k < n; ++k)
          for (int64_t i = 0; i < n; ++i) lv.cosmat[k * n + i] = static_cast<float>(std::cos(M_PI * (2 * i + 1) * k / (2.0 * n)));
      }
      levels_.push_back(lv);
    }
  }

  // Odd lengths: out = C in (or C^T in) with the level's cosine matrix C, row by row.
  static void dense(const Level& lv, bool transpose, const float* in, float* out, int64_t w) {
    const int64_t n = lv.n;
    for (int64_t r = 0; r < n; ++r) {
      float* o = out + static_cast<int64_t>(r) * w;
      for (int64_t j = 0; j < w; ++j) o[j] = 0.f;
      for (int64_t c = 0; c < n; ++c) {
        const float coef = transpose ? lv.cosmat[c * n + r] : lv.cosmat[r * n + c];
        row_axpy(o, in + static_cast<int64_t>(c) * w, coef, w);
      }
    }
  }

  // Unnormalised DCT-II of the level-`d` length along dim 0 of `in` into `out`.
  void forward_rec(size_t d, const float* in, float* out, int64_t w, float* work) const {
    const Level& lv = levels_[d];
    const int64_t n = lv.n;
    if (n == 1) {
      std::memcpy(out, in, sizeof(float) * w);
      return;
    }
    if (!lv.cosmat.empty()) {
      dense(lv, /*transpose=*/false, in, out, w);
      return;
    }
    const int64_t h = n / 2;
    float* g = work;                                   // [h, w]
    float* hh = work + static_cast<int64_t>(h) * w;    // [h, w]
    float* G = work + static_cast<int64_t>(n) * w;     // [h, w]
    float* H = G + static_cast<int64_t>(h) * w;        // [h, w]
    float* next = work + static_cast<int64_t>(2) * n * w;
    for (int64_t i = 0; i < h; ++i) {
      row_butterfly(g + static_cast<int64_t>(i) * w, hh + static_cast<int64_t>(i) * w, in + static_cast<int64_t>(i) * w,
                    in + static_cast<int64_t>(n - 1 - i) * w, lv.inv2cos[i], w);
    }
    forward_rec(d + 1, g, G, w, next);
    forward_rec(d + 1, hh, H, w, next);
    for (int64_t k = 0; k < h; ++k) {
      std::memcpy(out + static_cast<int64_t>(2 * k) * w, G + static_cast<int64_t>(k) * w, sizeof(float) * w);
      float* o = out + static_cast<int64_t>(2 * k + 1) * w;
      const float* h0 = H + static_cast<int64_t>(k) * w;
      if (k + 1 < h) {
        row_add(o, h0, H + static_cast<int64_t>(k + 1) * w, w);
      } else {
        std::memcpy(o, h0, sizeof(float) * w);
      }
    }
  }

  // Transpose of forward_rec: out = D_unnorm^T in, along dim 0.
  void inverse_rec(size_t d, const float* in, float* out, int64_t w, float* work) const {
    const Level& lv = levels_[d];
    const int64_t n = lv.n;
    if (n == 1) {
      std::memcpy(out, in, sizeof(float) * w);
      return;
    }
    if (!lv.cosmat.empty()) {
      dense(lv, /*transpose=*/true, in, out, w);
      return;
    }
    const int64_t h = n / 2;
    float* G = work;
    float* H = work + static_cast<int64_t>(h) * w;
    float* g = work + static_cast<int64_t>(n) * w;
    float* hh = g + static_cast<int64_t>(h) * w;
    float* next = work + static_cast<int64_t>(2) * n * w;
    for (int64_t k = 0; k < h; ++k) {
      std::memcpy(G + static_cast<int64_t>(k) * w, in + static_cast<int64_t>(2 * k) * w, sizeof(float) * w);
      float* hk = H + static_cast<int64_t>(k) * w;
      const float* odd = in + static_cast<int64_t>(2 * k + 1) * w;
      if (k > 0) {
        row_add(hk, odd, in + static_cast<int64_t>(2 * k - 1) * w, w);
      } else {
        std::memcpy(hk, odd, sizeof(float) * w);
      }
    }
    inverse_rec(d + 1, G, g, w, next);
    inverse_rec(d + 1, H, hh, w, next);
    for (int64_t i = 0; i < h; ++i) {
      row_unbutterfly(out + static_cast<int64_t>(i) * w, out + static_cast<int64_t>(n - 1 - i) * w,
                      g + static_cast<int64_t>(i) * w, hh + static_cast<int64_t>(i) * w, lv.inv2cos[i], w);
    }
  }

  int64_t n_;
  std::vector<float> scale_;
  std::vector<Level> levels_;
};

}  // namespace exogym
