// Entry point of dropit_bench_cpu: pins one thread count on every library, records the machine in
// the output's context, registers the cases and runs them.

#include <cblas.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>

#include "bench_common.hpp"
#include "bench_context.hpp"

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace bench {

int thread_count() {
  static const int threads = [] {
    int count = 1;
#if defined(_OPENMP)
    count = static_cast<int>(std::thread::hardware_concurrency());
    if (const char* env = std::getenv("DROPIT_BENCH_THREADS")) count = std::atoi(env);
    if (count < 1) count = 1;
    omp_set_dynamic(0);
    omp_set_num_threads(count);
#endif
    // Without OpenMP dropit is serial, so OpenBLAS gets one thread too: equal cores on both sides.
    openblas_set_num_threads(count);
    return count;
  }();
  return threads;
}

void* aligned_zeroed(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  const std::size_t rounded = (bytes + 63) / 64 * 64;
  void* memory = std::aligned_alloc(64, rounded);
  if (memory == nullptr) throw std::bad_alloc();
  std::memset(memory, 0, rounded);
  return memory;
}

void aligned_free(void* memory) { std::free(memory); }

namespace {

std::uint64_t splitmix(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

template <class T>
void fill_normal(T* out, std::int64_t n, std::uint64_t seed) {
  const std::uint64_t key = splitmix(seed);
  // Counter-based Box-Muller: any prefix of a long input equals the short input, and the values do
  // not depend on the thread count.
#pragma omp parallel for num_threads(thread_count()) schedule(static)
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint64_t a = splitmix(key ^ (2 * static_cast<std::uint64_t>(i)));
    const std::uint64_t b = splitmix(key ^ (2 * static_cast<std::uint64_t>(i) + 1));
    const double u1 = (static_cast<double>(a >> 11) + 1.0) * 0x1p-53;  // (0, 1]
    const double u2 = static_cast<double>(b >> 11) * 0x1p-53;
    const double value = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    out[i] = dropit::from_float<T>(static_cast<float>(value));
  }
}

template void fill_normal(float*, std::int64_t, std::uint64_t);
template void fill_normal(dropit::bfloat16*, std::int64_t, std::uint64_t);
template void fill_normal(dropit::half*, std::int64_t, std::uint64_t);

void parallel_memcpy(void* destination, const void* source, std::size_t bytes) {
  const auto slices = static_cast<std::size_t>(thread_count());
  const std::size_t slice = (bytes / slices + 63) / 64 * 64;  // cache-line aligned boundaries
#pragma omp parallel for num_threads(thread_count()) schedule(static, 1)
  for (std::size_t t = 0; t < slices; ++t) {
    const std::size_t begin = std::min(bytes, t * slice);
    const std::size_t end = t + 1 == slices ? bytes : std::min(bytes, begin + slice);
    std::memcpy(static_cast<char*>(destination) + begin, static_cast<const char*>(source) + begin,
                end - begin);
  }
}

std::uint64_t parallel_read(const void* source, std::size_t bytes) {
  const auto slices = static_cast<std::size_t>(thread_count());
  const std::size_t words = bytes / 8;
  const std::size_t slice = (words / slices + 7) / 8 * 8;  // cache-line aligned boundaries
  std::uint64_t total = 0;
#pragma omp parallel for num_threads(thread_count()) schedule(static, 1) reduction(+ : total)
  for (std::size_t t = 0; t < slices; ++t) {
    const std::size_t begin = std::min(words, t * slice);
    const std::size_t end = t + 1 == slices ? words : std::min(words, begin + slice);
    std::uint64_t sum = 0;
    for (std::size_t i = begin; i < end; ++i) {
      std::uint64_t word;
      std::memcpy(&word, static_cast<const char*>(source) + i * 8, 8);
      sum += word;
    }
    total += sum;
  }
  return total;
}

dropit::cache_layout plan(const policy_spec& spec, const dropit::shape& shape,
                          dropit::element_type type, int channel_axis) {
  using namespace dropit;
  constexpr std::uint64_t seed = 1234;
  switch (spec.kind) {
    case policy_kind::random_element:
      return plan_cache(policy<random_selection>{{spec.gamma, seed, spec.chunk_size}}, shape, type);
    case policy_kind::random_channel:
      return plan_cache(
          policy<random_selection, channel_granularity>{{spec.gamma, seed}, {channel_axis}}, shape,
          type);
    case policy_kind::min_k_element:
      return plan_cache(policy<min_k_selection>{{spec.gamma}}, shape, type);
    case policy_kind::min_k_channel:
      return plan_cache(policy<min_k_selection, channel_granularity>{{spec.gamma}, {channel_axis}},
                        shape, type);
    case policy_kind::chunked_min_k:
      return plan_cache(policy<chunked_min_k_selection>{{spec.gamma, spec.chunk_size}}, shape,
                        type);
  }
  return {};
}

std::string join(std::initializer_list<std::string_view> parts) {
  std::string name;
  for (std::string_view part : parts) {
    if (!name.empty()) name += '/';
    name += part;
  }
  return name;
}

std::string policy_name(const policy_spec& spec) {
  switch (spec.kind) {
    case policy_kind::random_element:
      return "random_element";
    case policy_kind::random_channel:
      return "random_channel";
    case policy_kind::min_k_element:
      return "min_k_element";
    case policy_kind::min_k_channel:
      return "min_k_channel";
    case policy_kind::chunked_min_k:
      return "chunked_min_k";
  }
  return "unknown";
}

std::string policy_params(const policy_spec& spec) {
  const bool chunked =
      spec.kind == policy_kind::random_element || spec.kind == policy_kind::chunked_min_k;
  const auto gamma = param("gamma", spec.gamma);
  return chunked ? join({param("D", spec.chunk_size), gamma}) : gamma;
}

}  // namespace bench

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

  const int threads = bench::thread_count();
  const std::string count = std::to_string(threads);
  bench::add_common_context(threads,
                            "dropit cpu_backend{" + count +
                                "} (OpenMP), OpenBLAS openblas_set_num_threads(" + count +
                                ") (reads back " + std::to_string(openblas_get_num_threads()) +
                                "), memcpy and im2col baselines on " + count + " OpenMP threads",
                            "the im2col + sgemm baselines (2-6x), not dropit");
  benchmark::AddCustomContext("openblas", openblas_get_config());
  benchmark::AddCustomContext("openblas_core", openblas_get_corename());
  benchmark::AddCustomContext("inputs", "standard normal values (counter-based, fixed seeds)");

  bench::register_compress_benchmarks();
  bench::register_weight_grad_benchmarks();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
