#pragma once
// Plumbing shared by the dropit CPU benchmarks: one thread count for every library, aligned
// pre-touched buffers, deterministic inputs, the policies under test and regular names.
//
// Names are '/'-separated: the operation, then labels (policy, dtype), then key:value parameters,
// e.g. `compress/chunked_min_k/f32/D:16384/gamma:0.9/N:16777216` beside its baseline
// `memcpy/f32/N:16777216`. report.py pairs cases with baselines by those parameters.

#include <benchmark/benchmark.h>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>

#include <dropit/dropit.hpp>

namespace bench {

/// Threads used by dropit, OpenBLAS and the OpenMP baselines alike (DROPIT_BENCH_THREADS, else
/// every hardware thread; 1 without OpenMP since dropit then runs serially). Configures OpenMP and
/// OpenBLAS on first use.
int thread_count();

/// The dropit backend every case runs on: an explicit thread count rather than OpenMP's default.
inline dropit::cpu_backend backend() { return dropit::cpu_backend{thread_count()}; }

/// A 64-byte aligned heap array, zero-filled at construction so that page faults never land in a
/// timed loop. Move-only.
template <class T>
class array {
 public:
  array() = default;
  explicit array(std::size_t count);
  array(array&& other) noexcept : data_(other.data_), size_(other.size_) {
    other.data_ = nullptr;
    other.size_ = 0;
  }
  array& operator=(array&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
    return *this;
  }
  array(const array&) = delete;
  array& operator=(const array&) = delete;
  ~array();

  T* data() const { return data_; }
  std::size_t size() const { return size_; }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

void* aligned_zeroed(std::size_t bytes);
void aligned_free(void* memory);

template <class T>
array<T>::array(std::size_t count)
    : data_(static_cast<T*>(aligned_zeroed(count * sizeof(T)))), size_(count) {}

template <class T>
array<T>::~array() {
  aligned_free(data_);
}

/// Workspace of exactly `bytes` (aligned, pre-touched).
struct scratch {
  explicit scratch(std::size_t bytes) : memory(bytes) {}
  dropit::workspace span() const { return {memory.data(), memory.size()}; }
  array<std::byte> memory;
};

/// A cache's own buffers, sized by its layout.
template <class T>
struct cache_storage {
  explicit cache_storage(const dropit::cache_layout& layout)
      : values(static_cast<std::size_t>(layout.kept())),
        positions((layout.position_bytes() + 3) / 4),
        view{layout, values.data(), positions.data()} {}
  array<T> values;
  array<std::uint32_t> positions;
  dropit::cache_view<T> view;
};

/// Fills `out[0, n)` with standard normal values; value i depends only on (seed, i).
template <class T>
void fill_normal(T* out, std::int64_t n, std::uint64_t seed);

/// A new array of `n` standard normal values.
template <class T>
array<T> normal_array(std::int64_t n, std::uint64_t seed) {
  array<T> values(static_cast<std::size_t>(n));
  fill_normal(values.data(), n, seed);
  return values;
}

/// Parallel std::memcpy over the benchmark threads (contiguous slices, one per thread).
void parallel_memcpy(void* destination, const void* source, std::size_t bytes);

/// Reads `bytes` (a multiple of 8) once on the benchmark threads: the floor for any pass over them.
std::uint64_t parallel_read(const void* source, std::size_t bytes);

/// The policies under test, as names and as a runtime description turned into a cache layout.
enum class policy_kind {
  random_element,
  random_channel,
  min_k_element,
  min_k_channel,
  chunked_min_k
};

inline constexpr policy_kind all_policies[] = {
    policy_kind::random_element, policy_kind::random_channel, policy_kind::min_k_element,
    policy_kind::min_k_channel, policy_kind::chunked_min_k};

struct policy_spec {
  policy_kind kind = policy_kind::chunked_min_k;
  double gamma = 0.9;
  std::int64_t chunk_size = dropit::default_chunk_size;
};

/// Plans the cache of a tensor of `shape` and `type`; channel policies select along `channel_axis`.
dropit::cache_layout plan(const policy_spec& spec, const dropit::shape& shape,
                          dropit::element_type type, int channel_axis);

/// The policy's name, e.g. `chunked_min_k`.
std::string policy_name(const policy_spec& spec);
/// Its parameters: `D:16384/gamma:0.9` (D only for the policies that cut chunks).
std::string policy_params(const policy_spec& spec);

template <class T>
constexpr std::string_view dtype_name() {
  return std::same_as<T, float> ? "f32" : std::same_as<T, dropit::bfloat16> ? "bf16" : "f16";
}

/// `key:value`, numbers in their shortest usual form (0.9, 16777216).
template <class V>
std::string param(std::string_view key, V value) {
  std::ostringstream out;
  out << key << ':' << value;
  return out.str();
}

/// Joins name parts with '/'.
std::string join(std::initializer_list<std::string_view> parts);

/// Registers `fn` under `name`, timed in wall-clock time (the work runs on several threads, so the
/// main thread's CPU time would undercount it).
template <class Fn>
benchmark::internal::Benchmark* add(const std::string& name, Fn&& fn) {
  return benchmark::RegisterBenchmark(name.c_str(), std::forward<Fn>(fn))
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
}

void register_compress_benchmarks();
void register_weight_grad_benchmarks();

}  // namespace bench
