// Random selection: exactly k per chunk, positions regenerated from the seed alone, different
// seeds and chunks drawing differently, uniform inclusion (with a statistic shown to reject
// biased samplers) and the optional n/k rescaling.

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>

#include "helpers.hpp"

namespace {

using dropit::bfloat16;
using dropit::half;
using namespace dropit;

using test::serial;

// Positions a cache kept: where densify of an input with no zeros is non-zero.
template <class T>
std::vector<bool> kept_mask(const cache<T>& c) {
  std::vector<bool> mask;
  for (const T& v : densify(serial, c)) mask.push_back(dropit::bits_of(v) != 0);
  return mask;
}

std::vector<float> nonzero_input(std::int64_t n) {
  std::vector<float> x(static_cast<std::size_t>(n));
  std::iota(x.begin(), x.end(), 1.0f);
  return x;
}

policy<random_selection> random_policy(double gamma, std::uint64_t seed, std::int64_t d) {
  return {{.gamma = gamma, .seed = seed, .chunk_size = d}};
}

// ---------------------------------------------------------------------------------------------
// Uniformity. Each draw keeps k of n positions. Under uniform sampling without replacement the
// inclusion counts c_i over `draws` draws have variance draws*p*(1-p) (p = k/n) and a constant
// sum, so sum (c_i - E)^2 / (draws*p*(1-p)) * (n-1)/n follows chi-square with n-1 degrees of
// freedom. The pair statistic does the same for co-inclusion counts (q = k(k-1)/(n(n-1))); its
// mean is exactly n(n-1)/2, and its spread was measured by simulation (sd ~150 for n=64, k=16).

struct uniformity {
  double marginal = 0, pairs = 0;
};

using sampler = std::function<std::vector<int>(int draw)>;

uniformity measure(int n, int k, int draws, const sampler& sample) {
  std::vector<double> count(n, 0.0), pair(n * n, 0.0);
  for (int d = 0; d < draws; ++d) {
    std::vector<int> kept = sample(d);
    REQUIRE(static_cast<int>(kept.size()) == k);
    std::sort(kept.begin(), kept.end());
    for (int a = 0; a < k; ++a) {
      count[kept[a]] += 1;
      for (int b = a + 1; b < k; ++b) pair[kept[a] * n + kept[b]] += 1;
    }
  }
  const double p = double(k) / n, q = double(k) * (k - 1) / (double(n) * (n - 1));
  uniformity u;
  for (int i = 0; i < n; ++i) u.marginal += std::pow(count[i] - draws * p, 2);
  u.marginal *= (n - 1.0) / n / (draws * p * (1 - p));
  for (int i = 0; i < n; ++i)
    for (int j = i + 1; j < n; ++j) u.pairs += std::pow(pair[i * n + j] - draws * q, 2);
  u.pairs /= draws * q * (1 - q);
  return u;
}

// Wilson-Hilferty approximation of the chi-square quantile at standard normal deviate z.
double chi_square_quantile(double dof, double z) {
  const double a = 2.0 / (9.0 * dof);
  return dof * std::pow(1.0 - a + z * std::sqrt(a), 3);
}

// Two-sided at a false-positive rate of about 1e-6 per tail (z = 4.75): a perfectly balanced but
// deterministic sampler fails the lower bound. The pair bound sits ~10 sd above the mean.
bool looks_uniform(const uniformity& u, int n) {
  const double dof = n - 1;
  return u.marginal > chi_square_quantile(dof, -4.75) &&
         u.marginal < chi_square_quantile(dof, 4.75) && u.pairs < 1.75 * n * (n - 1) / 2.0;
}

constexpr int n_uniform = 64, k_uniform = 16, draws = 4000;
constexpr double gamma_uniform = 0.75;  // k(64) = 16

std::vector<int> positions_of(const std::vector<bool>& mask, std::int64_t begin, int length) {
  std::vector<int> out;
  for (int i = 0; i < length; ++i)
    if (mask[begin + i]) out.push_back(i);
  return out;
}

}  // namespace

TEST_CASE_TEMPLATE("random keeps exactly k per chunk, values unchanged", T, float, half, bfloat16) {
  for (std::int64_t n : {1, 5, 100, 1000, 4099})
    for (std::int64_t d : {1, 7, 64, 1000, 65536})
      for (const ref::rate& r : {ref::rate{0.29, 29, 100}, ref::rate{0.5, 1, 2},
                                 ref::rate{0.9, 9, 10}, ref::rate{0.99, 99, 100}}) {
        CAPTURE(n);
        CAPTURE(d);
        CAPTURE(r.gamma);
        const auto x = test::smooth_values<T>(n, static_cast<std::uint64_t>(n + d));
        const auto c = compress(serial, random_policy(r.gamma, 42, d), test::view_of(x, {n}));
        const std::vector<bool> mask = kept_mask(c);
        for (std::int64_t begin = 0; begin < n; begin += d) {
          const std::int64_t length = std::min(d, n - begin);
          CHECK(std::count(mask.begin() + begin, mask.begin() + begin + length, true) ==
                ref::kept(length, r));
        }
        CHECK_BITS_EQUAL(test::values_of(c), ref::kept_values(x, mask));
        CHECK_BITS_EQUAL(densify(serial, c), ref::masked(x, mask));
      }
}

TEST_CASE("random: the seed alone fixes the positions") {
  const std::int64_t n = 3000, d = 256;
  const auto p = random_policy(0.8, 2024, d);
  const auto x1 = nonzero_input(n);
  auto x2 = x1;
  std::reverse(x2.begin(), x2.end());  // different data, same seed
  const auto c1 = compress(serial, p, test::view_of(x1, {n}));
  const auto c2 = compress(serial, p, test::view_of(x2, {n}));
  const auto c1_again = compress(serial, p, test::view_of(x1, {n}));
  CHECK(kept_mask(c1) == kept_mask(c2));
  CHECK_BITS_EQUAL(test::values_of(c1), test::values_of(c1_again));
  CHECK_BITS_EQUAL(densify(serial, c1), densify(serial, c1));  // backward regenerates the same
  // A cache whose layout is copied by hand (as after a trip through a device) reads the same.
  const cache_view<const float> by_hand{c1.layout(), c1.values().data(), nullptr};
  CHECK_BITS_EQUAL(densify(serial, by_hand), densify(serial, c1));
}

TEST_CASE("random: different seeds and different chunks draw differently") {
  const std::int64_t n = 1024;
  const auto x = nonzero_input(n);
  std::vector<std::vector<bool>> masks;
  for (std::uint64_t seed = 0; seed < 20; ++seed)
    masks.push_back(
        kept_mask(compress(serial, random_policy(0.5, seed, n), test::view_of(x, {n}))));
  for (std::size_t a = 0; a < masks.size(); ++a)
    for (std::size_t b = a + 1; b < masks.size(); ++b) CHECK(masks[a] != masks[b]);
  // Within one tensor each chunk has its own stream: no two of 16 chunks share a pattern.
  const auto chunked =
      kept_mask(compress(serial, random_policy(0.5, 1, 64), test::view_of(x, {n})));
  for (int a = 0; a < 16; ++a)
    for (int b = a + 1; b < 16; ++b)
      CHECK(positions_of(chunked, a * 64, 64) != positions_of(chunked, b * 64, 64));
}

TEST_CASE("random: a stream's draws never tie") {
  // Distinct draws make every chunk's k largest a set of its own, whatever k: checked over the
  // longest chunk, for chunk, channel and extreme seed and stream values.
  for (const std::uint64_t seed : {std::uint64_t{0}, std::uint64_t{1}, ~std::uint64_t{0}})
    for (const std::uint64_t stream :
         {std::uint64_t{0}, std::uint64_t{12345}, detail::channel_stream}) {
      CAPTURE(seed);
      CAPTURE(stream);
      std::vector<std::uint32_t> draws;
      for (std::uint64_t i = 0; i < std::uint64_t{max_chunk_size}; ++i)
        draws.push_back(detail::random_key(seed, stream, i));
      std::sort(draws.begin(), draws.end());
      CHECK(std::adjacent_find(draws.begin(), draws.end()) == draws.end());
    }
}

TEST_CASE("random: streams whose index steps overlap still draw independently") {
  // A draw hashes the key's low half plus index times a step. Two streams whose low halves differ
  // by s steps walk the same words s indices apart; the key's high half, mixed in between the
  // hash's rounds, must keep their draws apart (without it, every draw would repeat).
  constexpr std::uint32_t step = 0x9e3779b9u;
  for (const std::uint32_t s : {1u, 7u, 1000u}) {
    CAPTURE(s);
    const std::uint64_t first = 0x0123456789abcdefull;
    const std::uint64_t second =
        (first ^ (std::uint64_t{0x5bd1e995u} << 32)) + std::uint32_t(s * step);
    REQUIRE(std::uint32_t(second) == std::uint32_t(std::uint32_t(first) + s * step));
    int repeated = 0;
    for (std::uint64_t i = 0; i < 4096; ++i)
      repeated += detail::random_draw(second, i) == detail::random_draw(first, i + s);
    CHECK(repeated == 0);
  }
}

TEST_CASE("random: neighbouring chunks and seeds overlap as independent draws do") {
  // Two independent uniform k-subsets of n positions share a hypergeometric number of them: mean
  // k^2/n, variance k^2/n ((n-k)/n)^2 n/(n-1). Streams that shared one pattern, or drew from few
  // patterns, would overlap far more; the mean's bound is 6 standard errors, the variance's 25 %.
  // (INFO names are std::string: doctest prints a const char* as an address.)
  constexpr std::int64_t n = 1024, chunks = 1024;
  constexpr double gamma = 0.9;
  const std::int64_t k = ref::kept(n, ref::rate{gamma, 9, 10});
  const auto x = nonzero_input(n * chunks);
  const auto check_overlaps = [&](const char* name, const auto& mask_of_draw) {
    double sum = 0, sum_squares = 0;
    std::vector<bool> previous = mask_of_draw(0);
    for (std::int64_t d = 1; d < chunks; ++d) {
      const std::vector<bool> current = mask_of_draw(d);
      double shared = 0;
      for (std::int64_t i = 0; i < n; ++i) shared += previous[i] && current[i];
      sum += shared;
      sum_squares += shared * shared;
      previous = current;
    }
    const double pairs = chunks - 1, mean = sum / pairs,
                 variance = sum_squares / pairs - mean * mean;
    const double expected_mean = double(k) * k / n;
    const double expected_variance =
        expected_mean * (double(n - k) / n) * (double(n - k) / n) * n / (n - 1.0);
    INFO(std::string(name) << ": mean overlap " << mean << " (expected " << expected_mean
                           << "), variance " << variance << " (expected " << expected_variance
                           << ")");
    CHECK(std::abs(mean - expected_mean) < 6 * std::sqrt(expected_variance / pairs));
    CHECK(std::abs(variance / expected_variance - 1) < 0.25);
  };
  const std::vector<bool> chunked =
      kept_mask(compress(serial, random_policy(gamma, 5, n), test::view_of(x, {n * chunks})));
  check_overlaps("chunks", [&](std::int64_t chunk) {
    return std::vector<bool>(chunked.begin() + chunk * n, chunked.begin() + (chunk + 1) * n);
  });
  check_overlaps("seeds", [&](std::int64_t seed) {
    return kept_mask(
        compress(serial, random_policy(gamma, std::uint64_t(seed), n), test::view_of(x, {n})));
  });
}

TEST_CASE("random: inclusion is uniform over seeds, chunks, tails and channels") {
  const auto x = nonzero_input(n_uniform);
  const sampler over_seeds = [&](int draw) {
    const auto c = compress(serial, random_policy(gamma_uniform, std::uint64_t(draw), n_uniform),
                            test::view_of(x, {n_uniform}));
    return positions_of(kept_mask(c), 0, n_uniform);
  };
  const auto big = nonzero_input(std::int64_t{n_uniform} * draws);
  const auto chunked_mask = kept_mask(compress(serial, random_policy(gamma_uniform, 77, n_uniform),
                                               test::view_of(big, {n_uniform * draws})));
  const sampler over_chunks = [&](int draw) {
    return positions_of(chunked_mask, std::int64_t{draw} * n_uniform, n_uniform);
  };
  const auto tailed = nonzero_input(100 + n_uniform);  // D = 100: the tail holds 64 elements
  const sampler over_tails = [&](int draw) {
    const auto c = compress(serial, random_policy(gamma_uniform, std::uint64_t(draw), 100),
                            test::view_of(tailed, {100 + n_uniform}));
    return positions_of(kept_mask(c), 100, n_uniform);
  };
  const sampler over_channels = [&](int draw) {
    const policy<random_selection, channel_granularity> p{
        {.gamma = gamma_uniform, .seed = std::uint64_t(draw)}, {1}};
    return positions_of(kept_mask(compress(serial, p, test::view_of(x, {1, n_uniform, 1}))), 0,
                        n_uniform);
  };
  for (const auto& [name, sample] :
       {std::pair{"seeds", over_seeds}, std::pair{"chunks", over_chunks},
        std::pair{"tail chunks", over_tails}, std::pair{"channels", over_channels}}) {
    const uniformity u = measure(n_uniform, k_uniform, draws, sample);
    INFO(std::string(name) << ": marginal chi-square " << u.marginal << " (63 dof), pair statistic "
                           << u.pairs << " (mean 2016)");
    CHECK(looks_uniform(u, n_uniform));
  }
}

TEST_CASE("the uniformity statistic rejects biased samplers") {
  // A fair reference sampler passes...
  std::mt19937_64 rng(3);
  const sampler fair = [&](int) {
    std::vector<int> idx(n_uniform);
    std::iota(idx.begin(), idx.end(), 0);
    for (int j = 0; j < k_uniform; ++j) std::swap(idx[j], idx[j + rng() % (n_uniform - j)]);
    return std::vector<int>(idx.begin(), idx.begin() + k_uniform);
  };
  const uniformity fair_u = measure(n_uniform, k_uniform, draws, fair);
  INFO("fair: " << fair_u.marginal << ", " << fair_u.pairs);
  CHECK(looks_uniform(fair_u, n_uniform));

  // ...while "always the first k", a sampler favouring position 0 by 1.5x, and a deterministic
  // rotation with perfectly balanced marginals all fail.
  const sampler first_k = [](int) {
    std::vector<int> idx(k_uniform);
    std::iota(idx.begin(), idx.end(), 0);
    return idx;
  };
  const sampler favour_first = [&](int) {
    std::vector<double> weight(n_uniform, 1.0);
    weight[0] = 1.5;
    std::vector<int> out;
    for (int j = 0; j < k_uniform; ++j) {
      double u = std::uniform_real_distribution<double>(
          0.0, std::accumulate(weight.begin(), weight.end(), 0.0))(rng);
      int pick = -1;
      for (int i = 0; i < n_uniform; ++i) {
        if (weight[i] == 0.0) continue;
        pick = i;  // the last candidate absorbs rounding at the top end
        if (u < weight[i]) break;
        u -= weight[i];
      }
      out.push_back(pick);
      weight[pick] = 0.0;
    }
    return out;
  };
  const sampler rotation = [](int draw) {
    std::vector<int> idx;
    for (int j = 0; j < k_uniform; ++j) idx.push_back((draw * k_uniform + j) % n_uniform);
    return idx;
  };
  for (const auto& [name, sample] :
       {std::pair{"first k", first_k}, std::pair{"favour position 0", favour_first},
        std::pair{"rotation", rotation}}) {
    const uniformity u = measure(n_uniform, k_uniform, draws, sample);
    INFO(std::string(name) << ": marginal " << u.marginal << ", pairs " << u.pairs);
    CHECK_FALSE(looks_uniform(u, n_uniform));
  }
}

TEST_CASE_TEMPLATE("random with rescale scales densified values by n/k of their chunk", T, float,
                   half, bfloat16) {
  const std::int64_t d = 64, n = 3 * d + 10;  // chunks keep 16 of 64 (x4), the tail 3 of 10
  const auto x = test::smooth_values<T>(n, 8);
  auto p = random_policy(0.75, 31, d);
  const auto plain = compress(serial, p, test::view_of(x, {n}));
  p.selection.rescale = true;
  const auto scaled = compress(serial, p, test::view_of(x, {n}));
  const std::vector<bool> mask = kept_mask(plain);
  CHECK(kept_mask(scaled) == mask);                                   // rescaling moves nothing
  CHECK_BITS_EQUAL(test::values_of(scaled), test::values_of(plain));  // and stores raw values
  std::vector<T> want(x.size(), T{});
  for (std::int64_t i = 0; i < n; ++i) {
    const double scale = i < 3 * d ? 64.0 / 16.0 : 10.0 / 3.0;
    if (mask[i])
      want[i] = dropit::from_float<T>(dropit::to_float(x[i]) * static_cast<float>(scale));
  }
  CHECK_BITS_EQUAL(densify(serial, scaled), want);

  // Channel granularity scales by C / k(C): 10 channels, 3 kept.
  const policy<random_selection, channel_granularity> channel_p{
      {.gamma = 0.7, .seed = 4, .rescale = true}, {-1}};
  const auto y = test::smooth_values<T>(20 * 10, 9);
  const auto c = compress(serial, channel_p, test::view_of(y, {20, 10}));
  std::vector<bool> channel_kept;
  for (const T& v : densify(serial, c)) channel_kept.push_back(dropit::bits_of(v) != 0);
  CHECK(std::count(channel_kept.begin(), channel_kept.end(), true) == 20 * 3);
  std::vector<T> channel_want(y.size(), T{});
  for (std::size_t i = 0; i < y.size(); ++i) {
    if (channel_kept[i])
      channel_want[i] =
          dropit::from_float<T>(dropit::to_float(y[i]) * static_cast<float>(10.0 / 3.0));
    CHECK(channel_kept[i] == channel_kept[i % 10]);  // whole channels: the same columns each row
  }
  CHECK_BITS_EQUAL(densify(serial, c), channel_want);
}

TEST_CASE("random channel selection keeps exactly k channels, fixed by the seed") {
  const std::vector<std::int64_t> dims = {4, 32, 3, 3};
  const auto x = test::smooth_values<float>(4 * 32 * 9, 12);
  for (const ref::rate& r : {ref::rate{0.5, 1, 2}, ref::rate{0.9, 9, 10}}) {
    const policy<random_selection, channel_granularity> p{{.gamma = r.gamma, .seed = 6}, {1}};
    const auto mask = kept_mask(compress(serial, p, test::view_of(x, {4, 32, 3, 3})));
    std::vector<std::int64_t> channels;
    for (std::int64_t ch = 0; ch < 32; ++ch)
      if (mask[ch * 9]) channels.push_back(ch);
    CHECK(static_cast<std::int64_t>(channels.size()) == ref::kept(32, r));
    CHECK(mask == ref::channel_mask(ref::split_at(dims, 1), channels));
    std::vector<float> other(x.size(), 1.0f);
    CHECK(kept_mask(compress(serial, p, test::view_of(other, {4, 32, 3, 3}))) == mask);
  }
}
