// A consumer of dropit, built by tests/package/check_consumer.cmake through find_package,
// add_subdirectory or FetchContent. It compresses a small tensor and checks the result, so that a
// package that compiles but links or configures the library wrongly still fails.
#include <dropit/dropit.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#ifndef DROPIT_EXPECT_OPENMP
#error "the consumer's CMakeLists.txt defines DROPIT_EXPECT_OPENMP"
#endif

namespace {

int failures = 0;

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "FAILED: %s\n", what);
    ++failures;
  }
}

}  // namespace

int main() {
  // 1000 elements in chunks of 64: 15 full chunks and a tail of 40.
  constexpr std::int64_t n = 1000, chunk = 64;
  constexpr double gamma = 0.9;
  std::vector<float> x(n);
  std::uint32_t state = 12345;
  for (auto& v : x) {  // nonzero values of mixed sign and magnitude
    state = state * 1664525u + 1013904223u;
    v = (static_cast<float>(state >> 8) / 16777216.0f + 0.01f) * ((state & 1u) ? 1.0f : -1.0f);
  }

  dropit::policy<dropit::chunked_min_k_selection> p{{gamma, chunk}};
  const auto c = dropit::compress(dropit::cpu, p, dropit::tensor_view<const float>{x.data(), {n}});
  const std::vector<float> dense = dropit::densify(dropit::cpu, c);

  std::int64_t expected_kept = 0;
  for (std::int64_t begin = 0; begin < n; begin += chunk)
    expected_kept += dropit::kept_count(std::min(chunk, n - begin), gamma);
  std::int64_t nonzeros = 0;
  bool masked = true, largest = true;
  for (std::int64_t begin = 0; begin < n; begin += chunk) {
    const std::int64_t end = std::min(begin + chunk, n);
    float smallest_kept = INFINITY, largest_dropped = 0.0f;
    for (std::int64_t i = begin; i < end; ++i) {
      const auto u = static_cast<std::size_t>(i);
      if (dense[u] != 0.0f) {
        ++nonzeros;
        masked = masked && dense[u] == x[u];
        smallest_kept = std::min(smallest_kept, std::fabs(x[u]));
      } else {
        largest_dropped = std::max(largest_dropped, std::fabs(x[u]));
      }
    }
    largest = largest && smallest_kept >= largest_dropped;
  }

  check(dense.size() == static_cast<std::size_t>(n), "densify returns n elements");
  check(c.layout().kept() == expected_kept, "the cache keeps sum of kept_count over chunks");
  check(nonzeros == expected_kept, "densify(compress(x)) has exactly kept_count nonzeros");
  check(masked, "kept values equal the input");
  check(largest, "each chunk keeps its largest magnitudes");
  check(c.bytes() < sizeof(float) * static_cast<std::size_t>(n) / 5, "the cache is compact");

  bool threw = false;
  try {
    dropit::policy<dropit::chunked_min_k_selection> bad{{1.0, chunk}};
    (void)dropit::compress(dropit::cpu, bad, dropit::tensor_view<const float>{x.data(), {n}});
  } catch (const dropit::error&) {
    threw = true;
  }
  check(threw, "gamma = 1 throws dropit::error");

#if defined(_OPENMP)
  constexpr bool has_openmp = true;
#else
  constexpr bool has_openmp = false;
#endif
  check(has_openmp == static_cast<bool>(DROPIT_EXPECT_OPENMP),
        "OpenMP reaches the consumer exactly when dropit::dropit links it");

#if defined(DROPIT_EXPECT_VERSION_MAJOR)
  check(DROPIT_VERSION_MAJOR == DROPIT_EXPECT_VERSION_MAJOR &&
            DROPIT_VERSION_MINOR == DROPIT_EXPECT_VERSION_MINOR &&
            DROPIT_VERSION_PATCH == DROPIT_EXPECT_VERSION_PATCH,
        "the headers' DROPIT_VERSION_* match the package version");
#endif

  std::printf("dropit %d.%d.%d consumer: kept %lld of %lld, cache %zu bytes, openmp %d: %s\n",
              DROPIT_VERSION_MAJOR, DROPIT_VERSION_MINOR, DROPIT_VERSION_PATCH,
              static_cast<long long>(nonzeros), static_cast<long long>(n), c.bytes(),
              static_cast<int>(has_openmp), failures == 0 ? "ok" : "FAILED");
  return failures == 0 ? 0 : 1;
}
