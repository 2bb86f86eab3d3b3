// compress and densify of every policy against a memcpy of the same bytes and a read-only pass
// over them.
//
// Inputs are viewed as [N / 2^18, 256, 32, 32], an NCHW activation: element policies see the
// flattened tensor, channel policies select among the 256 channels (axis 1). All buffers are
// allocated and touched before timing, and the expert API with a preallocated workspace keeps
// allocation out of the loop.

#include <algorithm>
#include <cstring>
#include <vector>

#include "bench_common.hpp"

namespace bench {
namespace {

constexpr std::int64_t channels = 256, pixels = 32 * 32;

dropit::shape activation_shape(std::int64_t n) {
  return {n / (channels * pixels), channels, 32, 32};
}

/// One normal input per element type, shared by every case: regenerating 2^26 values per case
/// would dominate the run. Sized once for the largest registered case; smaller cases use a prefix.
template <class T>
struct shared_input {
  static inline std::int64_t reserved = 0;
  static inline array<T> data;

  static void reserve(std::int64_t n) { reserved = std::max(reserved, n); }
  static const T* get(std::int64_t n) {
    if (static_cast<std::int64_t>(data.size()) < n) {
      data = array<T>(static_cast<std::size_t>(std::max(n, reserved)));
      fill_normal(data.data(), static_cast<std::int64_t>(data.size()), 42);
    }
    return data.data();
  }
};

template <class T>
void set_bytes(benchmark::State& state, std::int64_t n) {
  state.SetBytesProcessed(state.iterations() * n * static_cast<std::int64_t>(sizeof(T)));
}

/// Baseline: the input bytes copied on the benchmark threads (or on one, for reference).
template <class T>
void memcpy_case(benchmark::State& state, std::int64_t n, bool threaded) {
  const T* input = shared_input<T>::get(n);
  array<T> output(static_cast<std::size_t>(n));
  const std::size_t bytes = static_cast<std::size_t>(n) * sizeof(T);
  for (auto _ : state) {
    if (threaded)
      parallel_memcpy(output.data(), input, bytes);
    else
      std::memcpy(output.data(), input, bytes);
    benchmark::ClobberMemory();
  }
  set_bytes<T>(state, n);
}

/// Baseline: the input read once on the benchmark threads, nothing written.
template <class T>
void read_case(benchmark::State& state, std::int64_t n) {
  const T* input = shared_input<T>::get(n);
  for (auto _ : state) {
    std::uint64_t checksum = parallel_read(input, static_cast<std::size_t>(n) * sizeof(T));
    benchmark::DoNotOptimize(checksum);
  }
  set_bytes<T>(state, n);
}

template <class T>
void compress_case(benchmark::State& state, policy_spec spec, std::int64_t n) {
  const auto backend = bench::backend();
  const dropit::shape shape = activation_shape(n);
  const auto layout = plan(spec, shape, dropit::element_type_of<T>, 1);
  const T* input = shared_input<T>::get(n);
  cache_storage<T> cache(layout);
  scratch work(dropit::compress_workspace_bytes<T>(backend, layout));
  for (auto _ : state) {
    dropit::compress<T>(backend, {input, shape}, cache.view, work.span());
    benchmark::ClobberMemory();
  }
  set_bytes<T>(state, n);
  state.counters["cache_B_per_elem"] = static_cast<double>(layout.bytes()) / static_cast<double>(n);
}

template <class T>
void densify_case(benchmark::State& state, policy_spec spec, std::int64_t n) {
  const auto backend = bench::backend();
  const dropit::shape shape = activation_shape(n);
  const auto layout = plan(spec, shape, dropit::element_type_of<T>, 1);
  cache_storage<T> cache(layout);
  {
    scratch work(dropit::compress_workspace_bytes<T>(backend, layout));
    dropit::compress<T>(backend, {shared_input<T>::get(n), shape}, cache.view, work.span());
  }
  array<T> output(static_cast<std::size_t>(n));
  scratch work(dropit::densify_workspace_bytes<T>(backend, layout));
  for (auto _ : state) {
    dropit::densify<T>(backend, cache.view, {output.data(), shape}, work.span());
    benchmark::ClobberMemory();
  }
  set_bytes<T>(state, n);
  state.counters["cache_B_per_elem"] = static_cast<double>(layout.bytes()) / static_cast<double>(n);
}

template <class T>
void register_baselines(std::int64_t n) {
  shared_input<T>::reserve(n);
  const auto dtype = std::string(dtype_name<T>());
  const auto size = param("N", n);
  add(join({"memcpy", dtype, size}), [n](benchmark::State& s) { memcpy_case<T>(s, n, true); });
  add(join({"memcpy_1t", dtype, size}), [n](benchmark::State& s) { memcpy_case<T>(s, n, false); });
  add(join({"read", dtype, size}), [n](benchmark::State& s) { read_case<T>(s, n); });
}

template <class T>
void register_compress(const policy_spec& spec, std::int64_t n) {
  add(join({"compress", policy_name(spec), dtype_name<T>(), policy_params(spec), param("N", n)}),
      [spec, n](benchmark::State& s) { compress_case<T>(s, spec, n); });
}

/// The full sweep at one size: every policy and drop rate, plus chunk sizes and densify at 0.9.
template <class T>
void register_sweep(std::int64_t n) {
  register_baselines<T>(n);
  for (policy_kind kind : all_policies)
    for (double gamma : {0.5, 0.8, 0.9, 0.99}) register_compress<T>({kind, gamma}, n);
  for (std::int64_t chunk : {std::int64_t{1} << 10, std::int64_t{1} << 16})
    register_compress<T>({policy_kind::chunked_min_k, 0.9, chunk}, n);
  for (policy_kind kind : all_policies) {
    const policy_spec spec{kind, 0.9};
    add(join({"densify", policy_name(spec), dtype_name<T>(), policy_params(spec), param("N", n)}),
        [spec, n](benchmark::State& s) { densify_case<T>(s, spec, n); });
  }
}

}  // namespace

void register_compress_benchmarks() {
  benchmark::AddCustomContext("compress_shape",
                              "[N/2^18, 256, 32, 32]; channel policies select along axis 1");
  constexpr std::int64_t sweep_n = std::int64_t{1} << 24;
  register_sweep<float>(sweep_n);
  register_sweep<dropit::bfloat16>(sweep_n);
  // Size sweep of the headline policy (chunked min-k, fp32, gamma 0.9, D = 2^14): from
  // cache-resident (2^20 floats = 4 MiB) to far beyond the last-level cache.
  for (int log_n = 20; log_n <= 26; ++log_n) {
    if (log_n == 24) continue;  // measured by the sweep above
    const std::int64_t n = std::int64_t{1} << log_n;
    register_baselines<float>(n);
    register_compress<float>({policy_kind::chunked_min_k, 0.9}, n);
  }
  // Chunk-size sweep at 2^20 floats, compress and densify: small chunks must cost about what large
  // ones do per element.
  constexpr std::int64_t small_n = std::int64_t{1} << 20;
  for (policy_kind kind : {policy_kind::random_element, policy_kind::chunked_min_k})
    for (std::int64_t chunk : {std::int64_t{2}, std::int64_t{16}, std::int64_t{64},
                               std::int64_t{128}, std::int64_t{256}, std::int64_t{1} << 14}) {
      const policy_spec spec{kind, 0.5, chunk};
      register_compress<float>(spec, small_n);
      add(join({"densify", policy_name(spec), "f32", policy_params(spec), param("N", small_n)}),
          [spec](benchmark::State& s) { densify_case<float>(s, spec, small_n); });
    }
}

}  // namespace bench
