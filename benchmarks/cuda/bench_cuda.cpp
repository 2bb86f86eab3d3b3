// dropit_bench_cuda: the CUDA backend against what a GPU user already runs, in the same process
// and on the same shapes, timed with CUDA events on one stream, the L2 cache flushed before each
// timed launch (so no case reads its input from the previous iteration's L2):
// - compress/<policy>/<dtype>/.../N:n, densify/...    vs  device_copy/<dtype>/N:n
//   (cudaMemcpyAsync of the dense tensor). Counter `bytes`: what the case must move (compress: the
//   input read plus the cache written; densify: the cache read plus the dense tensor written);
//   `GB_per_s` is that over the median time, to compare with the copy's (2 x its bytes).
// - linear_dw/<policy>/<dtype>/gamma:g/M:m/K:k/N:n: the CUDA backend's weight gradient on the cache
//   (it densifies into its workspace and calls cuBLAS itself), and densify_gemm/...: public densify
//   then cuBLAS by the caller (the LibTorch adapters' path on a GPU),  vs  gemm/<dtype>/M:m/K:k/N:n: cublasGemmEx on the dense input (float
//   accumulation; tensor cores for 16-bit types).
// Built by CMake when the CUDA backend is (it links cuBLAS); run by scripts/gpu-check. Without a
// CUDA device it says so and exits with status 1.

#include <benchmark/benchmark.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <concepts>
#include <cstdio>
#include <dropit/cuda.hpp>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string(what) + ": cuBLAS status " + std::to_string(status));
}

/// Device memory, freed on scope exit.
class device_buffer {
 public:
  explicit device_buffer(std::size_t bytes) : bytes_(bytes) {
    check(cudaMalloc(&data_, bytes == 0 ? 1 : bytes), "cudaMalloc");
  }
  ~device_buffer() { cudaFree(data_); }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  template <class T = void>
  T* get() const {
    return static_cast<T*>(data_);
  }
  std::size_t bytes() const { return bytes_; }
  dropit::workspace span() const { return {static_cast<std::byte*>(data_), bytes_}; }

 private:
  void* data_ = nullptr;
  std::size_t bytes_;
};

/// One stream, its events and an L2-sized buffer to overwrite between timed launches.
class gpu_clock {
 public:
  gpu_clock() {
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaEventCreate(&start_), "cudaEventCreate");
    check(cudaEventCreate(&stop_), "cudaEventCreate");
    int device = 0, l2 = 0;
    check(cudaGetDevice(&device), "cudaGetDevice");
    check(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device), "L2 size");
    flush_ = std::make_unique<device_buffer>(2 * static_cast<std::size_t>(l2));
  }
  ~gpu_clock() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
    cudaStreamDestroy(stream_);
  }

  cudaStream_t stream() const { return stream_; }

  /// Milliseconds `work()` takes on the stream, after flushing L2.
  template <class Work>
  double time_ms(Work&& work) {
    check(cudaMemsetAsync(flush_->get(), ++flushes_ & 0xff, flush_->bytes(), stream_), "flush");
    check(cudaEventRecord(start_, stream_), "cudaEventRecord");
    work();
    check(cudaEventRecord(stop_, stream_), "cudaEventRecord");
    check(cudaEventSynchronize(stop_), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start_, stop_), "cudaEventElapsedTime");
    return ms;
  }

 private:
  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  std::unique_ptr<device_buffer> flush_;
  int flushes_ = 0;
};

gpu_clock& timer() {
  static gpu_clock instance;
  return instance;
}

/// Times `work` once per iteration (manual time), and records the bytes it moves.
template <class Work>
void run_timed(benchmark::State& state, double bytes, Work&& work) {
  work();  // warm-up: first-launch costs stay out of the timings
  check(cudaStreamSynchronize(timer().stream()), "warm-up");
  for (auto _ : state) state.SetIterationTime(timer().time_ms(work) / 1e3);
  if (bytes > 0) {
    state.counters["bytes"] = bytes;
    state.counters["GB_per_s"] = benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsRate);
  }
}

template <class T>
constexpr const char* dtype_name() {
  return std::same_as<T, float> ? "f32" : std::same_as<T, dropit::bfloat16> ? "bf16" : "f16";
}

template <class T>
constexpr cudaDataType_t cuda_type() {
  return std::same_as<T, float> ? CUDA_R_32F : std::same_as<T, dropit::bfloat16> ? CUDA_R_16BF
                                                                                 : CUDA_R_16F;
}

/// A device tensor of `n` standard normal values (post-ReLU when `relu`), fixed seed.
template <class T>
std::unique_ptr<device_buffer> normal_tensor(std::int64_t n, bool relu, unsigned seed) {
  std::mt19937 generator(seed);
  std::normal_distribution<float> normal;
  std::vector<T> host(static_cast<std::size_t>(n));
  for (auto& value : host) {
    const float x = normal(generator);
    value = T(relu && x < 0 ? 0.0f : x);
  }
  auto device = std::make_unique<device_buffer>(host.size() * sizeof(T));
  check(cudaMemcpy(device->get(), host.data(), device->bytes(), cudaMemcpyHostToDevice), "upload");
  return device;
}

/// A device cache of `input` planned from `spec`.
template <class T>
struct device_cache {
  dropit::cache_layout layout;
  device_buffer values, positions;

  device_cache(const dropit::policy_spec& spec, const dropit::shape& shape, const T* input)
      : layout(dropit::plan_cache(spec, shape, dropit::element_type_of<T>)),
        values(layout.value_bytes()),
        positions(layout.position_bytes()) {
    const dropit::cuda_backend backend{timer().stream()};
    device_buffer scratch(dropit::compress_workspace_bytes<T>(backend, layout));
    dropit::compress<T>(backend, {input, shape}, view(), scratch.span());
    check(cudaStreamSynchronize(timer().stream()), "compress");
  }
  dropit::cache_view<T> view() const { return {layout, values.get<T>(), positions.get()}; }
  dropit::cache_view<const T> const_view() const {
    return {layout, values.get<const T>(), positions.get()};
  }
};

std::string policy_name(const dropit::policy_spec& spec) {
  switch (spec.selection) {
    case dropit::selection_kind::chunked_min_k:
      return "chunked_min_k/D:" + std::to_string(spec.chunk_size);
    case dropit::selection_kind::min_k:
      return "min_k";
    case dropit::selection_kind::random:
      return "random/D:" + std::to_string(spec.chunk_size);
  }
  return "unknown";
}

std::string gamma_param(double gamma) {
  char text[16];
  std::snprintf(text, sizeof text, "gamma:%g", gamma);
  return text;
}

// --- compress and densify against a device copy -------------------------------------------------

template <class T>
void register_copy_cases(std::int64_t n) {
  const std::string dtype = dtype_name<T>();
  const std::string size = "/N:" + std::to_string(n);
  benchmark::RegisterBenchmark(("device_copy/" + dtype + size).c_str(), [n](benchmark::State& s) {
    const auto bytes = static_cast<std::size_t>(n) * sizeof(T);
    device_buffer from(bytes), to(bytes);
    run_timed(s, 2.0 * static_cast<double>(bytes), [&] {
      check(cudaMemcpyAsync(to.get(), from.get(), bytes, cudaMemcpyDeviceToDevice, timer().stream()),
            "cudaMemcpyAsync");
    });
  })->UseManualTime()->Unit(benchmark::kMicrosecond);

  for (const auto selection : {dropit::selection_kind::chunked_min_k, dropit::selection_kind::min_k,
                               dropit::selection_kind::random}) {
    dropit::policy_spec spec;
    spec.selection = selection;
    spec.gamma = 0.9;
    const std::string name = policy_name(spec) + "/" + dtype + "/" + gamma_param(spec.gamma) + size;
    benchmark::RegisterBenchmark(("compress/" + name).c_str(), [n, spec](benchmark::State& s) {
      const dropit::shape shape{n / 1024, 1024};
      const auto input = normal_tensor<T>(n, true, 1);
      device_cache<T> cache(spec, shape, input->template get<const T>());
      const dropit::cuda_backend backend{timer().stream()};
      device_buffer scratch(dropit::compress_workspace_bytes<T>(backend, cache.layout));
      run_timed(s, static_cast<double>(n * sizeof(T) + cache.layout.bytes()), [&] {
        dropit::compress<T>(backend, {input->template get<const T>(), shape}, cache.view(),
                            scratch.span());
      });
    })->UseManualTime()->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("densify/" + name).c_str(), [n, spec](benchmark::State& s) {
      const dropit::shape shape{n / 1024, 1024};
      const auto input = normal_tensor<T>(n, true, 1);
      device_cache<T> cache(spec, shape, input->template get<const T>());
      const dropit::cuda_backend backend{timer().stream()};
      device_buffer dense(static_cast<std::size_t>(n) * sizeof(T)),
          scratch(dropit::densify_workspace_bytes<T>(backend, cache.layout));
      run_timed(s, static_cast<double>(n * sizeof(T) + cache.layout.bytes()), [&] {
        dropit::densify<T>(backend, cache.const_view(), {dense.get<T>(), shape}, scratch.span());
      });
    })->UseManualTime()->Unit(benchmark::kMicrosecond);
  }
}

// --- linear weight gradient against cuBLAS --------------------------------------------------------

struct linear_shape {
  std::int64_t rows, in, out;  // M, K, N: A [M, K], dZ [M, N], dW [N, K]
  std::string params() const {
    return "M:" + std::to_string(rows) + "/K:" + std::to_string(in) + "/N:" + std::to_string(out);
  }
};

cublasHandle_t cublas() {
  static cublasHandle_t handle = [] {
    cublasHandle_t h = nullptr;
    check(cublasCreate(&h), "cublasCreate");
    check(cublasSetStream(h, timer().stream()), "cublasSetStream");
    return h;
  }();
  return handle;
}

/// dW[N, K] = dZᵀ[N, M] · A[M, K], row-major, in column-major terms dWᵀ = Aᵀ · dZ.
template <class T>
void dense_gemm(const linear_shape& s, const T* a, const T* dz, T* dw) {
  const float one = 1.0f, zero = 0.0f;
  check(cublasGemmEx(cublas(), CUBLAS_OP_N, CUBLAS_OP_T, static_cast<int>(s.in),
                     static_cast<int>(s.out), static_cast<int>(s.rows), &one, a, cuda_type<T>(),
                     static_cast<int>(s.in), dz, cuda_type<T>(), static_cast<int>(s.out), &zero, dw,
                     cuda_type<T>(), static_cast<int>(s.in), CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx");
}

template <class T>
void register_linear_cases(const linear_shape& s, double gamma) {
  const std::string dtype = dtype_name<T>();
  struct operands {
    std::unique_ptr<device_buffer> a, dz;
    device_buffer dw;
    explicit operands(const linear_shape& s)
        : a(normal_tensor<T>(s.rows * s.in, true, 1)),
          dz(normal_tensor<T>(s.rows * s.out, false, 2)),
          dw(static_cast<std::size_t>(s.out * s.in) * sizeof(T)) {}
  };
  benchmark::RegisterBenchmark(("gemm/" + dtype + "/" + s.params()).c_str(),
                               [s](benchmark::State& state) {
                                 operands o(s);
                                 run_timed(state, 0, [&] {
                                   dense_gemm<T>(s, o.a->template get<const T>(),
                                                 o.dz->template get<const T>(), o.dw.template get<T>());
                                 });
                               })
      ->UseManualTime()
      ->Unit(benchmark::kMicrosecond);

  dropit::policy_spec spec;
  spec.gamma = gamma;
  const std::string name =
      policy_name(spec) + "/" + dtype + "/" + gamma_param(gamma) + "/" + s.params();
  benchmark::RegisterBenchmark(("linear_dw/" + name).c_str(), [s, spec](benchmark::State& state) {
    operands o(s);
    device_cache<T> cache(spec, {s.rows, s.in}, o.a->template get<const T>());
    const dropit::cuda_backend backend{timer().stream()};
    device_buffer scratch(dropit::linear_weight_grad_workspace_bytes<T>(
        backend, cache.layout, {s.rows, s.out}, {s.out, s.in}));
    run_timed(state, 0, [&] {
      dropit::linear_weight_grad<T>(backend, cache.const_view(),
                                    {o.dz->template get<const T>(), {s.rows, s.out}},
                                    {o.dw.template get<T>(), {s.out, s.in}}, dropit::grad_mode::overwrite,
                                    scratch.span());
    });
  })->UseManualTime()->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark(("densify_gemm/" + name).c_str(), [s, spec](benchmark::State& state) {
    operands o(s);
    device_cache<T> cache(spec, {s.rows, s.in}, o.a->template get<const T>());
    const dropit::cuda_backend backend{timer().stream()};
    device_buffer dense(static_cast<std::size_t>(s.rows * s.in) * sizeof(T)),
        scratch(dropit::densify_workspace_bytes<T>(backend, cache.layout));
    run_timed(state, 0, [&] {
      dropit::densify<T>(backend, cache.const_view(), {dense.get<T>(), {s.rows, s.in}},
                         scratch.span());
      dense_gemm<T>(s, dense.get<const T>(), o.dz->template get<const T>(), o.dw.template get<T>());
    });
  })->UseManualTime()->Unit(benchmark::kMicrosecond);
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "dropit_bench_cuda: no CUDA device: nothing to measure\n");
    return 1;
  }
  cudaDeviceProp properties{};
  check(cudaGetDeviceProperties(&properties, 0), "cudaGetDeviceProperties");
  benchmark::AddCustomContext("gpu", properties.name);
  benchmark::AddCustomContext("gpu_memory_GiB", std::to_string(properties.totalGlobalMem >> 30));
  benchmark::AddCustomContext("timing", "CUDA events on one stream, L2 flushed before each launch");

  constexpr std::int64_t n = std::int64_t{1} << 24;
  register_copy_cases<float>(n);
  register_copy_cases<dropit::bfloat16>(n);
  for (const linear_shape& s : {linear_shape{8192, 1024, 4096}, linear_shape{16384, 768, 3072}})
    for (const double gamma : {0.9, 0.99}) {
      register_linear_cases<float>(s, gamma);
      register_linear_cases<dropit::bfloat16>(s, gamma);
    }
  try {
    benchmark::RunSpecifiedBenchmarks();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dropit_bench_cuda: %s\n", e.what());
    return 1;
  }
  benchmark::Shutdown();
  return 0;
}
