// libFuzzer target: the contract of compress, densify and the weight gradients on any input.
//
// The bytes decode into a policy, a drop rate, a chunk size, a shape, an element type, data full
// of special values (NaN, ±inf, ±0, subnormals, ties) and gradient operands. Each input is checked
// against the brute-force references of tests/reference.hpp:
// - bad parameters (gamma, chunk size, channel axis, shape) raise dropit::error, nothing else;
// - exactly k are kept per chunk / tensor / channel set, at the positions the reference ranks
//   first (min-k) or, for random selection, whatever the data;
// - the kept values are the input's, bit for bit, and densify is the input masked (rescaled
//   values: the float product rounded once to the element type);
// - the linear and conv2d weight gradients equal the dense formula on the kept values (scaled
//   in float), up to summation order and the rounding of a 16-bit result;
// - a layout with any field changed, or positions with a bit flipped, are refused or read within
//   bounds;
// - huge shapes are planned or refused with dropit::error, never wrapped.
// Any other outcome aborts, which libFuzzer reports with the input.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "reference.hpp"

namespace {

using namespace dropit;

// Elements per input at most: the references are quadratic in places, and small inputs keep the
// fuzzer fast enough to explore.
constexpr std::int64_t max_elements = 256;

[[noreturn]] void violation(const char* what, const std::string& detail = {}) {
  std::fprintf(stderr, "contract violation: %s %s\n", what, detail.c_str());
  std::abort();
}

void require(bool condition, const char* what, const std::string& detail = {}) {
  if (!condition) violation(what, detail);
}

/// Runs `f`, which must throw dropit::error (any other exception escapes and aborts).
template <class F>
void require_error(F&& f, const char* what) {
  try {
    f();
  } catch (const dropit::error&) {
    return;
  }
  violation("no dropit::error:", what);
}

/// Runs `f`; true if it threw dropit::error.
template <class F>
bool throws_error(F&& f) {
  try {
    f();
  } catch (const dropit::error&) {
    return true;
  }
  return false;
}

/// Bytes in order; zeros once they run out, so every input decodes.
struct reader {
  const std::uint8_t* data;
  std::size_t size, next = 0;

  std::uint8_t byte() { return next < size ? data[next++] : 0; }
  std::uint16_t u16() { return static_cast<std::uint16_t>(byte() | byte() << 8); }
  std::uint32_t u32() { return u16() | static_cast<std::uint32_t>(u16()) << 16; }
  std::uint64_t u64() { return u32() | static_cast<std::uint64_t>(u32()) << 32; }
};

// ---------------------------------------------------------------------------------------------
// Decoding.

enum class kind { chunked_min_k, min_k, random, channel_min_k, channel_random };

struct input_case {
  kind policy_kind = kind::chunked_min_k;
  bool rescale = false;
  int type = 0;  // 0 float, 1 half, 2 bfloat16
  ref::rate rate{0.5, 1, 2};
  bool bad_gamma = false;
  std::int64_t chunk = 16;
  bool bad_chunk = false;
  std::vector<std::int64_t> dims;
  bool huge = false;  // dims too large to allocate: plan only
  int axis = 1;
  std::uint64_t seed = 0;
};

input_case decode_case(reader& in) {
  input_case c;
  const std::uint8_t p = in.byte();
  c.policy_kind = static_cast<kind>(p % 5);
  c.rescale = (p / 5) % 2 == 1 &&
              (c.policy_kind == kind::random || c.policy_kind == kind::channel_random);
  c.type = in.byte() % 3;

  const std::uint8_t g = in.byte();
  if (g >= 248) {
    constexpr double nan = std::numeric_limits<double>::quiet_NaN();
    constexpr double inf = std::numeric_limits<double>::infinity();
    const double bad[] = {nan, -0.1, 1.0, 1.5, inf, -inf, -0.0 - 1e-300, 1.0 + 1e-16};
    c.rate = {bad[g - 248], 0, 1};
    c.bad_gamma = !(c.rate.gamma >= 0.0 && c.rate.gamma < 1.0);
  } else {
    const std::int64_t den = 1 + in.u16() % 1000;
    const std::int64_t num = g < 16 ? 0 : in.u16() % den;
    c.rate = {static_cast<double>(num) / static_cast<double>(den), num, den};
  }

  const std::uint8_t d = in.byte();
  switch (d >> 6) {
    case 0:
      c.chunk = 1 + (d & 63);
      break;
    case 1:
      c.chunk = 1 + in.u16() % 1024;
      break;
    case 2:
      c.chunk = std::int64_t{1} << (d & 15) << ((d & 16) ? 1 : 0);  // up to 65536
      break;
    default: {
      const std::int64_t bad[] = {0, -1, 65537, std::numeric_limits<std::int64_t>::min(),
                                  std::int64_t{1} << 40};
      c.chunk = (d & 63) < 5 ? bad[d & 63] : 1 + (d & 63);
      c.bad_chunk = c.chunk < 1 || c.chunk > max_chunk_size;
    }
  }

  const std::uint8_t r = in.byte();
  const int rank = r % 5;
  c.huge = (r & 0xe0) == 0xe0;
  for (int i = 0; i < rank; ++i) {
    const std::uint8_t e = in.byte();
    if (c.huge) {
      const std::int64_t big[] = {std::int64_t{1} << 31, std::int64_t{1} << 32,
                                  std::int64_t{1} << 40, std::int64_t{1} << 62,
                                  std::numeric_limits<std::int64_t>::max()};
      c.dims.push_back(e < 80 ? e % 5 : big[e % 5]);
    } else {
      c.dims.push_back(e % 9);
    }
  }
  if (!c.huge) {
    // Cap the element count by shrinking the largest extents.
    const auto numel = [&] {
      std::int64_t n = 1;
      for (std::int64_t e : c.dims) n *= e;
      return n;
    };
    while (numel() > max_elements) --*std::max_element(c.dims.begin(), c.dims.end());
  }
  const std::uint8_t a = in.byte();
  c.axis = rank == 0 ? 0 : static_cast<int>(a % (2 * rank + 1)) - rank;  // [-rank, rank]
  c.seed = in.u16();
  return c;
}

/// One element of type T: special values, exact small numbers (ties), or raw bits.
template <class T>
T decode_value(reader& in) {
  constexpr bool is_float = std::is_same_v<T, float>;
  const std::uint8_t b = in.byte();
  if (b < 96) {
    const std::uint32_t sign = (b & 1) ? (is_float ? 0x80000000u : 0x8000u) : 0u;
    std::uint32_t bits;
    switch ((b >> 1) % 8) {
      case 0:  // ±0
        bits = 0;
        break;
      case 1:  // ±inf
        bits = is_float ? 0x7f800000u : std::is_same_v<T, half> ? 0x7c00u : 0x7f80u;
        break;
      case 2:  // NaN, with a payload
        bits = is_float ? 0x7fc00000u | (b & 0x3c) : std::is_same_v<T, half> ? 0x7e00u | (b & 0x3c)
                                                                              : 0x7fc0u | (b & 0x3c);
        break;
      case 3:  // smallest subnormal
        bits = 1;
        break;
      case 4:  // largest subnormal
        bits = is_float ? 0x7fffffu : std::is_same_v<T, half> ? 0x3ffu : 0x7fu;
        break;
      case 5:  // largest finite
        bits = is_float ? 0x7f7fffffu : std::is_same_v<T, half> ? 0x7bffu : 0x7f7fu;
        break;
      default:  // ties: a few exact magnitudes
        return from_float<T>((sign ? -1.0f : 1.0f) * static_cast<float>(1 + (b >> 4) % 3));
    }
    if constexpr (is_float) {
      const std::uint32_t all = sign | bits;
      float x;
      std::memcpy(&x, &all, sizeof x);
      return x;
    } else {
      return T{static_cast<std::uint16_t>(sign | bits)};
    }
  }
  if (b < 160) return from_float<T>(static_cast<float>(static_cast<int>(b) - 128) / 8.0f);
  if constexpr (is_float) {
    const std::uint32_t bits = in.u32();
    float x;
    std::memcpy(&x, &bits, sizeof x);
    return x;
  } else {
    return T{in.u16()};
  }
}

/// Gradient operands: small exact values (and zeros), so that only the cache's values can be
/// extreme.
template <class T>
T decode_gradient(reader& in) {
  const std::uint8_t b = in.byte();
  return from_float<T>(static_cast<float>(static_cast<int>(b % 17) - 8) / 4.0f);
}

// ---------------------------------------------------------------------------------------------
// The policy as dropit's run-time description.

policy_spec spec_of(const input_case& c) {
  policy_spec s;
  s.gamma = c.rate.gamma;
  s.chunk_size = c.chunk;
  s.seed = c.seed;
  s.rescale = c.rescale;
  s.channel_axis = c.axis;
  switch (c.policy_kind) {
    case kind::chunked_min_k:
      s.selection = selection_kind::chunked_min_k;
      break;
    case kind::min_k:
    case kind::channel_min_k:
      s.selection = selection_kind::min_k;
      break;
    case kind::random:
    case kind::channel_random:
      s.selection = selection_kind::random;
  }
  s.channel_granularity = c.policy_kind == kind::channel_min_k || c.policy_kind == kind::channel_random;
  return s;
}

bool uses_chunks(const input_case& c) {
  return c.policy_kind == kind::chunked_min_k || c.policy_kind == kind::random;
}

const cpu_backend serial{1};

template <class T>
cache<T> compress_spec(const policy_spec& spec, const std::vector<T>& x, const shape& s) {
  return visit_policy(spec, [&](const auto& p) {
    return compress(serial, p, tensor_view<const T>{x.data(), s});
  });
}

template <class T>
double value(T x) {
  return ref::value_of(x);
}

/// Same value, or both NaN (NaN payloads may change through float arithmetic).
template <class T>
bool same_value(T a, T b) {
  const double x = value(a), y = value(b);
  if (std::isnan(x) || std::isnan(y)) return std::isnan(x) && std::isnan(y);
  return bits_of(a) == bits_of(b);
}

/// The positions the contract keeps, from the reference (min-k) or from what the policy keeps of
/// an all-ones tensor (random: the draw must not depend on the data).
template <class T>
std::vector<bool> expected_mask(const input_case& c, const policy_spec& spec,
                                const std::vector<T>& x, const shape& s) {
  const auto n = static_cast<std::int64_t>(x.size());
  switch (c.policy_kind) {
    case kind::chunked_min_k:
      return ref::chunked_min_k_mask(x, c.chunk, c.rate);
    case kind::min_k:
      return ref::min_k_mask(x, c.rate);
    case kind::channel_min_k: {
      const auto split = ref::split_at(c.dims, c.axis);
      return ref::channel_mask(split, ref::top_channels(ref::channel_scores(x, split),
                                                        ref::kept(split.channels, c.rate)));
    }
    default:
      break;
  }
  const std::vector<T> ones(x.size(), from_float<T>(1.0f));
  const std::vector<T> dense = densify(serial, compress_spec(spec, ones, s));
  std::vector<bool> mask(x.size());
  for (std::int64_t i = 0; i < n; ++i) mask[i] = value(dense[i]) != 0.0;
  if (c.policy_kind == kind::random) {
    for (std::int64_t begin = 0; begin < n; begin += c.chunk) {
      const std::int64_t length = std::min(c.chunk, n - begin);
      const auto kept = std::count(mask.begin() + begin, mask.begin() + begin + length, true);
      require(kept == ref::kept(length, c.rate), "random: kept per chunk",
              std::to_string(kept) + " of " + std::to_string(length));
    }
  } else {  // channel random: whole channels, k(C) of them
    const auto split = ref::split_at(c.dims, c.axis);
    if (n > 0) {
      std::int64_t channels_kept = 0;
      for (std::int64_t ch = 0; ch < split.channels; ++ch) {
        const bool first = mask[static_cast<std::size_t>(ch * split.inner)];
        channels_kept += first;
        for (std::int64_t o = 0; o < split.outer; ++o)
          for (std::int64_t i = 0; i < split.inner; ++i)
            require(mask[(o * split.channels + ch) * split.inner + i] == first,
                    "random channel: channel not kept whole");
      }
      require(channels_kept == ref::kept(split.channels, c.rate), "random channel: kept channels");
    }
  }
  return mask;
}

/// n/k of the chunk or channel set holding `position`, in float, computed from the contract.
float expected_scale(const input_case& c, std::int64_t position, std::int64_t n) {
  if (!c.rescale) return 1.0f;
  std::int64_t length;
  if (c.policy_kind == kind::random) {
    const std::int64_t begin = position / c.chunk * c.chunk;
    length = std::min(c.chunk, n - begin);
  } else {
    length = ref::split_at(c.dims, c.axis).channels;
  }
  return static_cast<float>(static_cast<double>(length) /
                            static_cast<double>(ref::kept(length, c.rate)));
}

// ---------------------------------------------------------------------------------------------
// Gradients.

/// got (a T) against the dense value `want` (in double) whose terms have summed magnitude
/// `magnitude` (finite terms only) over `terms` terms. Skips what float summation in another order
/// may legitimately overflow.
template <class T>
void check_gradient(T got_t, double want, double magnitude, std::int64_t terms, const char* what) {
  if (!(magnitude <= 1e37)) return;  // float partial sums may overflow where double does not
  const double got = value(got_t);
  if (std::isnan(want)) {
    require(std::isnan(got), what, "want NaN, got " + std::to_string(got));
    return;
  }
  if (std::isinf(want)) {
    require(got == want, what, "want inf, got " + std::to_string(got));
    return;
  }
  constexpr bool is_float = std::is_same_v<T, float>;
  const double out_rel = is_float ? 0.0 : std::is_same_v<T, half> ? 0x1p-11 : 0x1p-8;
  const double absolute = is_float ? 0x1p-140 : std::is_same_v<T, half> ? 0x1p-24 : 0x1p-125;
  const double largest = is_float ? 0x1.fffffep127 : std::is_same_v<T, half> ? 65504.0 : 0x1.fep127;
  if (std::isinf(got) && std::fabs(want) >= largest * (1 - out_rel) && (got > 0) == (want > 0))
    return;  // rounded to the 16-bit type, the value overflows
  const double bound = static_cast<double>(terms + 2) * 0x1p-23 * magnitude +
                       out_rel * std::fabs(want) + absolute * static_cast<double>(terms + 1);
  require(std::fabs(got - want) <= bound, what,
          "got " + std::to_string(got) + ", want " + std::to_string(want));
}

/// The operand backward uses: kept values scaled in float, zero elsewhere; and the same with
/// non-finite values zeroed (for the magnitude of the finite terms).
struct operand {
  std::vector<float> value, finite;
};

template <class T>
void check_linear(reader& in, const cache<T>& c, const operand& a, const std::vector<std::int64_t>& dims) {
  if (dims.empty()) {
    std::vector<T> dz(1), dw(1);
    require_error([&] { linear_weight_grad<T>(serial, c.view(), {dz.data(), {1, 1}}, {dw.data(), {1, 1}}); },
                  "linear: rank-0 input");
    return;
  }
  const std::int64_t k = dims.back();
  const std::int64_t m = k == 0 ? 0 : static_cast<std::int64_t>(a.value.size()) / k;
  std::int64_t rows = 1;
  for (std::size_t i = 0; i + 1 < dims.size(); ++i) rows *= dims[i];
  const std::int64_t n = 1 + in.byte() % 4;
  std::vector<T> dz(static_cast<std::size_t>(rows * n));
  for (auto& v : dz) v = decode_gradient<T>(in);
  std::vector<T> dw(static_cast<std::size_t>(n * k));
  const std::uint8_t mode = in.byte();
  if (mode % 8 == 7) {  // a dZ with one row too many must be refused
    std::vector<T> bad(static_cast<std::size_t>((rows + 1) * n));
    require_error([&] { linear_weight_grad<T>(serial, c.view(), {bad.data(), {rows + 1, n}}, {dw.data(), {n, k}}); },
                  "linear: dZ rows");
    return;
  }
  linear_weight_grad<T>(serial, c.view(), {dz.data(), {rows, n}}, {dw.data(), {n, k}});
  if (k == 0) return;
  (void)m;
  std::vector<float> dz_float(dz.size());
  for (std::size_t i = 0; i < dz.size(); ++i) dz_float[i] = static_cast<float>(value(dz[i]));
  const auto want = ref::linear_dw(a.value, dz_float, rows, k, n);
  const auto finite = ref::linear_dw(a.finite, dz_float, rows, k, n);
  for (std::size_t i = 0; i < dw.size(); ++i)
    check_gradient(dw[i], want.value[i], finite.magnitude[i], rows, "linear dW");
}

template <class T>
void check_conv2d(reader& in, const cache<T>& c, const operand& a, const std::vector<std::int64_t>& dims) {
  ref::conv_shape g{dims[0], dims[1], dims[2], dims[3], 0, 1 + in.byte() % 3, 1 + in.byte() % 3};
  const std::uint8_t p = in.byte();
  g.stride_h = 1 + p % 2;
  g.stride_w = 1 + (p >> 1) % 2;
  g.pad_h = (p >> 2) % 3;
  g.pad_w = (p >> 4) % 3;
  g.dilation_h = 1 + (p >> 6) % 2;
  g.dilation_w = 1 + (p >> 7);
  const std::uint8_t q = in.byte();
  g.groups = 1 + q % 4;
  g.out_channels = g.groups * (1 + (q >> 2) % 3);
  const conv2d_params params = g.params();
  const bool valid_groups = g.in_channels % g.groups == 0;
  const std::int64_t in_per_group = g.in_channels / g.groups;
  const auto span = [](std::int64_t in, std::int64_t k, std::int64_t pad, std::int64_t d) {
    return in + 2 * pad - d * (k - 1) - 1;
  };
  const bool valid_size = span(g.height, g.kernel_h, g.pad_h, g.dilation_h) >= 0 &&
                          span(g.width, g.kernel_w, g.pad_w, g.dilation_w) >= 0;
  const std::int64_t oh = g.out_h(), ow = g.out_w();
  std::vector<T> dz(static_cast<std::size_t>(g.batch * g.out_channels * oh * ow));
  for (auto& v : dz) v = decode_gradient<T>(in);
  std::vector<T> dw(static_cast<std::size_t>(g.out_channels * in_per_group * g.kernel_h * g.kernel_w));
  const shape dz_shape{g.batch, g.out_channels, oh, ow};
  const shape dw_shape{g.out_channels, in_per_group, g.kernel_h, g.kernel_w};
  const auto run = [&] { conv2d_weight_grad<T>(serial, c.view(), {dz.data(), dz_shape}, {dw.data(), dw_shape}, params); };
  if (!valid_groups || !valid_size) {
    require_error(run, "conv2d: groups or output size");
    return;
  }
  run();
  std::vector<float> dz_float(dz.size());
  for (std::size_t i = 0; i < dz.size(); ++i) dz_float[i] = static_cast<float>(value(dz[i]));
  const auto want = ref::conv2d_dw(a.value, dz_float, g);
  const auto finite = ref::conv2d_dw(a.finite, dz_float, g);
  for (std::size_t i = 0; i < dw.size(); ++i)
    check_gradient(dw[i], want.value[i], finite.magnitude[i], g.batch * oh * ow, "conv2d dW");
}

// ---------------------------------------------------------------------------------------------
// Layouts changed by hand.

/// Changes one field of `layout` by a small amount.
void mutate(cache_layout& layout, std::uint8_t field, std::int64_t delta) {
  switch (field % 16) {
    case 0:
      layout.shape.rank += static_cast<int>(delta);
      break;
    case 1:
      layout.shape.extents[static_cast<std::size_t>(delta & 7)] += delta;
      break;
    case 2:
      layout.type = static_cast<element_type>(static_cast<int>(layout.type) + delta);
      break;
    case 3:
      layout.selection = static_cast<selection_kind>(static_cast<int>(layout.selection) + delta);
      break;
    case 4:
      layout.channel_granularity = !layout.channel_granularity;
      break;
    case 5:
      layout.encoding = static_cast<position_encoding>(static_cast<int>(layout.encoding) + delta);
      break;
    case 6:
      layout.gamma += static_cast<double>(delta) / 64.0;
      break;
    case 7:
      layout.rescale = !layout.rescale;
      break;
    case 8:
      layout.chunk_size += delta;
      break;
    case 9:
      layout.kept_per_chunk += delta;
      break;
    case 10:
      layout.kept_per_tail += delta;
      break;
    case 11:
      layout.offset_bytes += static_cast<int>(delta);
      break;
    case 12:
      layout.channel_axis += static_cast<int>(delta);
      break;
    case 13:
      layout.outer += delta;
      break;
    case 14:
      layout.channels += delta;
      break;
    default:
      layout.kept_channels += delta;
  }
}

template <class T>
void check_mutated_layout(reader& in, const cache<T>& c) {
  cache_layout changed = c.layout();
  const std::uint8_t field = in.byte();
  std::int64_t delta = static_cast<std::int8_t>(in.byte());
  if (delta == 0) delta = 1;
  mutate(changed, field, delta);
  const cache_view<const T> view{changed, c.view().values, c.view().positions};
  bool refused = throws_error([&] { (void)densify_workspace_bytes<T>(serial, changed); });
  if (refused) {
    std::vector<T> out(static_cast<std::size_t>(c.layout().numel()));
    require_error([&] { densify<T>(serial, view, {out.data(), c.layout().shape}, {}); },
                  "densify accepted a layout its size query refused");
    return;
  }
  // Accepted: a valid layout of its own. Reading the cache's buffers through it is safe only if
  // it needs no more of them; then densify must run cleanly (sanitizers watch the accesses).
  // (The positions stored for the old layout may not fit the new one: refusing them is fine.)
  if (changed.kept() <= c.layout().kept() && changed.position_bytes() <= c.layout().position_bytes())
    (void)throws_error([&] { (void)densify(serial, view); });
}

/// A cache whose stored positions have one bit flipped: every reader refuses them or reads within
/// bounds (sanitizers watch the accesses).
template <class T>
void check_corrupted_positions(reader& in, const cache<T>& c, const std::vector<std::int64_t>& dims) {
  const std::size_t bytes = c.layout().position_bytes();
  if (bytes == 0) return;
  std::vector<std::uint32_t> words((bytes + 3) / 4);
  std::memcpy(words.data(), c.view().positions, bytes);
  const std::size_t bit = in.u16() % (bytes * 8);
  words[bit / 32] ^= 1u << (bit % 32);
  const cache_view<const T> view{c.layout(), c.view().values, words.data()};
  (void)throws_error([&] { (void)densify(serial, view); });
  if (dims.empty()) return;
  const std::int64_t k = dims.back(), rows = k == 0 ? 0 : c.layout().numel() / k;
  std::vector<T> dz(static_cast<std::size_t>(rows)), dw(static_cast<std::size_t>(k));
  (void)throws_error([&] {
    linear_weight_grad<T>(serial, view, {dz.data(), {rows, 1}}, {dw.data(), {1, k}});
  });
}

// ---------------------------------------------------------------------------------------------

template <class T>
void check_element_type(reader& in, const input_case& c) {
  const policy_spec spec = spec_of(c);
  if (c.huge) {
    // Plan only: a valid plan gives sizes that do not wrap, an invalid one raises dropit::error.
    try {
      const shape s(c.dims);
      const cache_layout layout = plan_cache(spec, s, element_type_of<T>);
      require(layout.kept() <= layout.numel() && layout.kept() >= 0, "huge plan: kept count");
      (void)compress_workspace_bytes<T>(serial, layout);
      (void)densify_workspace_bytes<T>(serial, layout);
    } catch (const dropit::error&) {
    }
    return;
  }
  const shape s(c.dims);
  const auto n = static_cast<std::int64_t>(s.numel());
  std::vector<T> x(static_cast<std::size_t>(n));
  for (auto& v : x) v = decode_value<T>(in);

  const bool bad_axis = (c.policy_kind == kind::channel_min_k || c.policy_kind == kind::channel_random) && (c.dims.empty() || c.axis >= static_cast<int>(c.dims.size()));
  if (c.bad_gamma || (c.bad_chunk && uses_chunks(c)) || bad_axis) {
    require_error([&] { (void)plan_cache(spec, s, element_type_of<T>); }, "bad parameters: plan");
    require_error([&] { (void)compress_spec(spec, x, s); }, "bad parameters: compress");
    return;
  }

  const cache<T> c_out = compress_spec(spec, x, s);
  const cache_layout& layout = c_out.layout();
  const std::vector<bool> mask = expected_mask(c, spec, x, s);

  // Exactly the expected positions are kept, with the input's values in ascending order.
  const std::vector<T> kept = ref::kept_values(x, mask);
  require(static_cast<std::int64_t>(kept.size()) == layout.kept(), "kept count",
          std::to_string(kept.size()) + " vs layout " + std::to_string(layout.kept()));
  const auto values = c_out.values();
  for (std::size_t j = 0; j < kept.size(); ++j)
    require(bits_of(values[j]) == bits_of(kept[j]), "kept value", std::to_string(j));

  // densify: the input masked; rescaled values are the float product rounded once.
  const std::vector<T> dense = densify(serial, c_out);
  operand a{std::vector<float>(x.size(), 0.0f), std::vector<float>(x.size(), 0.0f)};
  for (std::int64_t i = 0; i < n; ++i) {
    if (!mask[i]) {
      require(bits_of(dense[i]) == 0, "densify: dropped position not +0", std::to_string(i));
      continue;
    }
    const float scaled = static_cast<float>(value(x[i])) * expected_scale(c, i, n);
    a.value[i] = scaled;
    a.finite[i] = std::isfinite(scaled) ? scaled : 0.0f;
    const T want = c.rescale ? from_float<T>(scaled) : x[i];
    require(same_value(dense[i], want), "densify value", std::to_string(i));
  }

  // The expert overload refuses a workspace one byte short.
  const std::size_t bytes = compress_workspace_bytes<T>(serial, layout);
  if (bytes > 0) {
    std::vector<std::byte> memory(bytes - 1);
    cache<T> target(layout);
    require_error([&] { compress<T>(serial, {x.data(), s}, target.view(), memory); },
                  "compress: short workspace");
  }

  check_linear(in, c_out, a, c.dims);
  if (c.dims.size() == 4) check_conv2d(in, c_out, a, c.dims);
  check_mutated_layout(in, c_out);
  check_corrupted_positions(in, c_out, c.dims);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  reader in{data, size};
  const input_case c = decode_case(in);
  switch (c.type) {
    case 0:
      check_element_type<float>(in, c);
      break;
    case 1:
      check_element_type<half>(in, c);
      break;
    default:
      check_element_type<bfloat16>(in, c);
  }
  return 0;
}
