#pragma once
// Brute-force references written from the contract (docs/design.md, "The contract"), sharing no
// code with the library: full sorts instead of radix thresholds, exact integer arithmetic for k(n),
// decoding of 16-bit values with ldexp, and dense gradients summed in double by direct loops. Slow
// and obvious on purpose.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include <dropit/dropit.hpp>

namespace ref {

using dropit::bfloat16;
using dropit::half;

// ---------------------------------------------------------------------------------------------
// k(n) = n - floor(gamma * n), for a drop rate given exactly as the fraction num / den.

struct rate {
  double gamma;
  std::int64_t num, den;
};

inline std::int64_t kept(std::int64_t n, rate r) { return n - (r.num * n) / r.den; }

// Rates whose decimal product with n is exact: the library must not suffer from 0.29 * 100 being
// 28.999999999999996 in binary.
inline const std::vector<rate> decimal_rates = {
    {0.0, 0, 1},  {0.1, 1, 10}, {0.25, 1, 4}, {0.29, 29, 100}, {0.3, 3, 10},    {0.5, 1, 2},
    {0.7, 7, 10}, {0.8, 4, 5},  {0.9, 9, 10}, {0.95, 19, 20},  {0.99, 99, 100}, {0.999, 999, 1000}};

// ---------------------------------------------------------------------------------------------
// Element values, decoded independently of dropit::to_float.

inline double value_of(float x) { return x; }

inline double value_of(half h) {
  const int exponent = (h.bits >> 10) & 0x1f, mantissa = h.bits & 0x3ff;
  double magnitude;
  if (exponent == 0x1f)
    magnitude = mantissa != 0 ? std::numeric_limits<double>::quiet_NaN()
                              : std::numeric_limits<double>::infinity();
  else if (exponent == 0)
    magnitude = std::ldexp(mantissa, -24);  // subnormal: mantissa * 2^-24
  else
    magnitude = std::ldexp(1024 + mantissa, exponent - 25);
  return (h.bits & 0x8000) ? -magnitude : magnitude;
}

inline double value_of(bfloat16 b) {
  const std::uint32_t bits = std::uint32_t{b.bits} << 16;  // bfloat16 is a truncated binary32
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

// ---------------------------------------------------------------------------------------------
// Min-k: NaN ranks highest, then larger |x|, then the lower index.

inline bool ranks_before(double a, std::int64_t index_a, double b, std::int64_t index_b) {
  const bool nan_a = std::isnan(a), nan_b = std::isnan(b);
  if (nan_a != nan_b) return nan_a;
  if (!nan_a && std::fabs(a) != std::fabs(b)) return std::fabs(a) > std::fabs(b);
  return index_a < index_b;
}

// Marks the k top-ranked elements of x[begin, begin + length) in `mask`.
template <class T>
void mark_top_k(const std::vector<T>& x, std::int64_t begin, std::int64_t length, std::int64_t k,
                std::vector<bool>& mask) {
  std::vector<std::int64_t> order(static_cast<std::size_t>(length));
  std::iota(order.begin(), order.end(), begin);
  std::sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
    return ranks_before(value_of(x[a]), a, value_of(x[b]), b);
  });
  for (std::int64_t j = 0; j < k; ++j) mask[order[j]] = true;
}

// Chunks of D consecutive elements, each keeping k(length of the chunk).
template <class T>
std::vector<bool> chunked_min_k_mask(const std::vector<T>& x, std::int64_t chunk, rate r) {
  const auto n = static_cast<std::int64_t>(x.size());
  std::vector<bool> mask(x.size(), false);
  for (std::int64_t begin = 0; begin < n; begin += chunk) {
    const std::int64_t length = std::min(chunk, n - begin);
    mark_top_k(x, begin, length, kept(length, r), mask);
  }
  return mask;
}

template <class T>
std::vector<bool> min_k_mask(const std::vector<T>& x, rate r) {
  return chunked_min_k_mask(x, std::max<std::int64_t>(1, static_cast<std::int64_t>(x.size())), r);
}

// ---------------------------------------------------------------------------------------------
// Channel granularity: the tensor seen as [outer, channels, inner].

struct channel_split {
  std::int64_t outer = 1, channels = 1, inner = 1;
};

inline channel_split split_at(const std::vector<std::int64_t>& dims, int axis) {
  const int rank = static_cast<int>(dims.size());
  if (axis < 0) axis += rank;
  channel_split s;
  for (int i = 0; i < axis; ++i) s.outer *= dims[i];
  s.channels = dims[axis];
  for (int i = axis + 1; i < rank; ++i) s.inner *= dims[i];
  return s;
}

template <class T>
std::vector<double> channel_scores(const std::vector<T>& x, channel_split s) {
  std::vector<double> scores(static_cast<std::size_t>(s.channels), 0.0);
  for (std::int64_t o = 0; o < s.outer; ++o)
    for (std::int64_t c = 0; c < s.channels; ++c)
      for (std::int64_t i = 0; i < s.inner; ++i) {
        const double v = value_of(x[(o * s.channels + c) * s.inner + i]);
        scores[c] += v * v;
      }
  return scores;
}

// The k best channels (NaN score first, then larger score, then lower channel), ascending.
inline std::vector<std::int64_t> top_channels(const std::vector<double>& scores, std::int64_t k) {
  std::vector<std::int64_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
    const bool nan_a = std::isnan(scores[a]), nan_b = std::isnan(scores[b]);
    if (nan_a != nan_b) return nan_a;
    if (!nan_a && scores[a] != scores[b]) return scores[a] > scores[b];
    return a < b;
  });
  order.resize(static_cast<std::size_t>(k));
  std::sort(order.begin(), order.end());
  return order;
}

inline std::vector<bool> channel_mask(channel_split s, const std::vector<std::int64_t>& channels) {
  std::vector<bool> mask(static_cast<std::size_t>(s.outer * s.channels * s.inner), false);
  for (std::int64_t o = 0; o < s.outer; ++o)
    for (std::int64_t c : channels)
      for (std::int64_t i = 0; i < s.inner; ++i) mask[(o * s.channels + c) * s.inner + i] = true;
  return mask;
}

// x where the mask is set, +0 (all bits clear) elsewhere.
template <class T>
std::vector<T> masked(const std::vector<T>& x, const std::vector<bool>& mask) {
  std::vector<T> out(x.size(), T{});
  for (std::size_t i = 0; i < x.size(); ++i)
    if (mask[i]) out[i] = x[i];
  return out;
}

// The kept values in ascending position order: what a cache's value buffer must hold.
template <class T>
std::vector<T> kept_values(const std::vector<T>& x, const std::vector<bool>& mask) {
  std::vector<T> out;
  for (std::size_t i = 0; i < x.size(); ++i)
    if (mask[i]) out.push_back(x[i]);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Encoded sizes, from the table "Memory per cached element" in docs/api.md.

inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// One bit per element, 32-bit words, each chunk starting on a fresh word.
inline std::int64_t bitmask_bytes(std::int64_t n, std::int64_t chunk) {
  if (n == 0) return 0;
  return 4 * ((n / chunk) * ceil_div(chunk, 32) + ceil_div(n % chunk, 32));
}

inline std::int64_t chunked_kept(std::int64_t n, std::int64_t chunk, rate r) {
  if (n == 0) return 0;
  return (n / chunk) * kept(chunk, r) + kept(n % chunk, r);
}

// ---------------------------------------------------------------------------------------------
// Dense weight gradients in double. `magnitude` is the sum of |terms|, which scales the error
// bound of any summation order.

struct dense_gradient {
  std::vector<double> value, magnitude;
};

// dW[N, K] = dZ[M, N]^T A[M, K].
template <class T>
dense_gradient linear_dw(const std::vector<T>& a, const std::vector<T>& dz, std::int64_t m,
                         std::int64_t k, std::int64_t n) {
  dense_gradient g{std::vector<double>(static_cast<std::size_t>(n * k), 0.0),
                   std::vector<double>(static_cast<std::size_t>(n * k), 0.0)};
  for (std::int64_t o = 0; o < n; ++o)
    for (std::int64_t i = 0; i < k; ++i)
      for (std::int64_t r = 0; r < m; ++r) {
        const double term = value_of(dz[r * n + o]) * value_of(a[r * k + i]);
        g.value[o * k + i] += term;
        g.magnitude[o * k + i] += std::fabs(term);
      }
  return g;
}

struct conv_shape {
  std::int64_t batch, in_channels, height, width;
  std::int64_t out_channels, kernel_h, kernel_w;
  std::int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dilation_h = 1, dilation_w = 1;
  std::int64_t groups = 1;

  // floor((in + 2p - d(k-1) - 1) / s) + 1; may be <= 0 for invalid geometry.
  static std::int64_t out_extent(std::int64_t in, std::int64_t k, std::int64_t s, std::int64_t p,
                                 std::int64_t d) {
    const std::int64_t span = in + 2 * p - d * (k - 1) - 1;
    return span < 0 ? 0 : span / s + 1;
  }
  std::int64_t out_h() const { return out_extent(height, kernel_h, stride_h, pad_h, dilation_h); }
  std::int64_t out_w() const { return out_extent(width, kernel_w, stride_w, pad_w, dilation_w); }
  std::int64_t x_numel() const { return batch * in_channels * height * width; }
  std::int64_t dz_numel() const { return batch * out_channels * out_h() * out_w(); }
  std::int64_t dw_numel() const {
    return out_channels * (in_channels / groups) * kernel_h * kernel_w;
  }
  // The whole geometry in one line, for a test to CAPTURE.
  std::string text() const {
    return "x [" + std::to_string(batch) + ", " + std::to_string(in_channels) + ", " +
           std::to_string(height) + ", " + std::to_string(width) + "], " +
           std::to_string(out_channels) + " out, kernel " + std::to_string(kernel_h) + "x" +
           std::to_string(kernel_w) + ", stride " + std::to_string(stride_h) + "x" +
           std::to_string(stride_w) + ", pad " + std::to_string(pad_h) + "x" +
           std::to_string(pad_w) + ", dilation " + std::to_string(dilation_h) + "x" +
           std::to_string(dilation_w) + ", groups " + std::to_string(groups);
  }
  // The same geometry as the library's parameters.
  dropit::conv2d_params params() const {
    dropit::conv2d_params p;
    p.stride[0] = stride_h;
    p.stride[1] = stride_w;
    p.padding[0] = pad_h;
    p.padding[1] = pad_w;
    p.dilation[0] = dilation_h;
    p.dilation[1] = dilation_w;
    p.groups = groups;
    return p;
  }
};

// dW[co, ci, kh, kw] = sum_{n, oh, ow} dZ[n, co, oh, ow] * X[n, g*Cin/G + ci, ih, iw] with
// ih = oh*stride - pad + kh*dilation (zero outside the input): the direct seven-loop sum.
template <class T>
dense_gradient conv2d_dw(const std::vector<T>& x, const std::vector<T>& dz, const conv_shape& c) {
  const std::int64_t in_per_group = c.in_channels / c.groups;
  const std::int64_t out_per_group = c.out_channels / c.groups;
  const std::int64_t oh_n = c.out_h(), ow_n = c.out_w();
  dense_gradient g{std::vector<double>(static_cast<std::size_t>(c.dw_numel()), 0.0),
                   std::vector<double>(static_cast<std::size_t>(c.dw_numel()), 0.0)};
  for (std::int64_t co = 0; co < c.out_channels; ++co)
    for (std::int64_t ci = 0; ci < in_per_group; ++ci)
      for (std::int64_t kh = 0; kh < c.kernel_h; ++kh)
        for (std::int64_t kw = 0; kw < c.kernel_w; ++kw) {
          const std::int64_t channel = co / out_per_group * in_per_group + ci;
          const std::int64_t w_index =
              ((co * in_per_group + ci) * c.kernel_h + kh) * c.kernel_w + kw;
          for (std::int64_t n = 0; n < c.batch; ++n)
            for (std::int64_t oh = 0; oh < oh_n; ++oh)
              for (std::int64_t ow = 0; ow < ow_n; ++ow) {
                const std::int64_t ih = oh * c.stride_h - c.pad_h + kh * c.dilation_h;
                const std::int64_t iw = ow * c.stride_w - c.pad_w + kw * c.dilation_w;
                if (ih < 0 || ih >= c.height || iw < 0 || iw >= c.width) continue;
                const double term =
                    value_of(dz[((n * c.out_channels + co) * oh_n + oh) * ow_n + ow]) *
                    value_of(x[((n * c.in_channels + channel) * c.height + ih) * c.width + iw]);
                g.value[w_index] += term;
                g.magnitude[w_index] += std::fabs(term);
              }
        }
  return g;
}

}  // namespace ref
