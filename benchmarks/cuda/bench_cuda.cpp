// dropit_bench_cuda: the CUDA backend against what a GPU user already runs, in the same process
// and on the same shapes, timed with CUDA events on one stream, the L2 cache flushed before each
// timed launch (so no case reads its input from the previous iteration's L2):
// - compress/<policy>/<dtype>/.../N:n, densify/...    vs  device_copy/<dtype>/N:n
//   (cudaMemcpyAsync of the dense tensor). Counter `bytes`: what the case must move (compress: the
//   input read plus the cache written; densify: the cache read plus the dense tensor written);
//   `GB_per_s` is that over the median time, to compare with the copy's (2 x its bytes).
// - linear_dw/<policy>/<dtype>/gamma:g/M:m/K:k/N:n: the CUDA backend's weight gradient on the cache
//   (it densifies into its workspace and calls cuBLAS itself), and densify_gemm/...: public densify
//   then cuBLAS by the caller (the LibTorch adapters' path on a GPU),  vs gemm/<dtype>/M:m/K:k/N:n:
//   cublasGemmEx on the dense input (float accumulation; tensor cores for 16-bit types).
// - conv2d_dw/<policy>/<dtype>/gamma:g/<layer>: the CUDA backend's conv2d weight gradient on the
//   cache (densify, then cuDNN's graph API where dropit::cuda is built with cuDNN, else im2col
//   blocks and cuBLAS), and densify_cudnn/...: public densify then cuDNN by the
//   caller (the LibTorch adapters' path on a GPU),  vs  cudnn/<dtype>/<layer>: cuDNN's backward
//   filter on the dense input, as PyTorch configures it by default (tensor-op math, so TF32 for
//   float; the algorithm cuDNN's heuristics rank first). Built when CMake finds cuDNN.
// Built by CMake when the CUDA backend is (it links cuBLAS); run by scripts/gpu-check. Without a
// CUDA device it says so and exits with status 1.

#include <benchmark/benchmark.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#if DROPIT_BENCH_CUDNN
#include <cudnn.h>
#endif

#include <concepts>
#include <cstdio>
#include <dropit/cuda.hpp>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
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
  return std::same_as<T, float>              ? CUDA_R_32F
         : std::same_as<T, dropit::bfloat16> ? CUDA_R_16BF
                                             : CUDA_R_16F;
}

/// `n` standard normal values from `seed`, drawn once per (n, seed) for the whole run: every case
/// of a size reads the same data, and drawing it again for each case would cost more than timing.
const std::vector<float>& normal_values(std::int64_t n, unsigned seed) {
  static std::map<std::pair<std::int64_t, unsigned>, std::vector<float>> drawn;
  auto [entry, fresh] = drawn.try_emplace({n, seed});
  if (fresh) {
    std::mt19937 generator(seed);
    std::normal_distribution<float> normal;
    entry->second.resize(static_cast<std::size_t>(n));
    for (auto& value : entry->second) value = normal(generator);
  }
  return entry->second;
}

/// A device tensor of `n` standard normal values (post-ReLU when `relu`), fixed seed.
template <class T>
std::unique_ptr<device_buffer> normal_tensor(std::int64_t n, bool relu, unsigned seed) {
  const std::vector<float>& values = normal_values(n, seed);
  std::vector<T> host(values.size());
  for (std::size_t i = 0; i < values.size(); ++i)
    host[i] = T(relu && values[i] < 0 ? 0.0f : values[i]);
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
  benchmark::RegisterBenchmark(("device_copy/" + dtype + size).c_str(),
                               [n](benchmark::State& s) {
                                 const auto bytes = static_cast<std::size_t>(n) * sizeof(T);
                                 device_buffer from(bytes), to(bytes);
                                 run_timed(s, 2.0 * static_cast<double>(bytes), [&] {
                                   check(
                                       cudaMemcpyAsync(to.get(), from.get(), bytes,
                                                       cudaMemcpyDeviceToDevice, timer().stream()),
                                       "cudaMemcpyAsync");
                                 });
                               })
      ->UseManualTime()
      ->Unit(benchmark::kMicrosecond);

  // gamma 0.9 stores a bitmask; chunked min-k at 0.95 stores 16-bit offsets instead.
  const std::pair<dropit::selection_kind, double> policies[] = {
      {dropit::selection_kind::chunked_min_k, 0.9},
      {dropit::selection_kind::min_k, 0.9},
      {dropit::selection_kind::random, 0.9},
      {dropit::selection_kind::chunked_min_k, 0.95}};
  for (const auto& [selection, gamma] : policies) {
    dropit::policy_spec spec;
    spec.selection = selection;
    spec.gamma = gamma;
    const std::string name = policy_name(spec) + "/" + dtype + "/" + gamma_param(spec.gamma) + size;
    benchmark::RegisterBenchmark(
        ("compress/" + name).c_str(),
        [n, spec](benchmark::State& s) {
          const dropit::shape shape{n / 1024, 1024};
          const auto input = normal_tensor<T>(n, true, 1);
          device_cache<T> cache(spec, shape, input->template get<const T>());
          const dropit::cuda_backend backend{timer().stream()};
          device_buffer scratch(dropit::compress_workspace_bytes<T>(backend, cache.layout));
          run_timed(s, static_cast<double>(n * sizeof(T) + cache.layout.bytes()), [&] {
            dropit::compress<T>(backend, {input->template get<const T>(), shape}, cache.view(),
                                scratch.span());
          });
        })
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(
        ("densify/" + name).c_str(),
        [n, spec](benchmark::State& s) {
          const dropit::shape shape{n / 1024, 1024};
          const auto input = normal_tensor<T>(n, true, 1);
          device_cache<T> cache(spec, shape, input->template get<const T>());
          const dropit::cuda_backend backend{timer().stream()};
          device_buffer dense(static_cast<std::size_t>(n) * sizeof(T)),
              scratch(dropit::densify_workspace_bytes<T>(backend, cache.layout));
          run_timed(s, static_cast<double>(n * sizeof(T) + cache.layout.bytes()), [&] {
            dropit::densify<T>(backend, cache.const_view(), {dense.get<T>(), shape},
                               scratch.span());
          });
        })
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
  }

  // The ReLU mask: the fused forward (relu(x) and its mask) and the backward, each one launch.
  const double mask_bytes = static_cast<double>(dropit::relu_mask_words(n)) * 4,
               moved_bytes = 2 * static_cast<double>(n) * sizeof(T) + mask_bytes;
  benchmark::RegisterBenchmark(
      ("relu_mask/pack/" + dtype + size).c_str(),
      [n, moved_bytes](benchmark::State& s) {
        const auto x = normal_tensor<T>(n, false, 1);
        device_buffer y(static_cast<std::size_t>(n) * sizeof(T)),
            words(static_cast<std::size_t>(dropit::relu_mask_words(n)) * 4);
        const dropit::cuda_backend backend{timer().stream()};
        run_timed(s, moved_bytes, [&] {
          dropit::relu_with_mask<T>(backend, {x->template get<const T>(), {n}}, {y.get<T>(), {n}},
                                    words.get<std::uint32_t>());
        });
      })
      ->UseManualTime()
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark(
      ("relu_mask/apply/" + dtype + size).c_str(),
      [n, moved_bytes](benchmark::State& s) {
        const auto x = normal_tensor<T>(n, false, 1), dy = normal_tensor<T>(n, false, 2);
        device_buffer dx(static_cast<std::size_t>(n) * sizeof(T)),
            words(static_cast<std::size_t>(dropit::relu_mask_words(n)) * 4);
        const dropit::cuda_backend backend{timer().stream()};
        dropit::relu_with_mask<T>(backend, {x->template get<const T>(), {n}}, {dx.get<T>(), {n}},
                                  words.get<std::uint32_t>());
        run_timed(s, moved_bytes, [&] {
          dropit::apply_relu_mask<T>(backend, words.get<const std::uint32_t>(),
                                     {dy->template get<const T>(), {n}}, {dx.get<T>(), {n}});
        });
      })
      ->UseManualTime()
      ->Unit(benchmark::kMicrosecond);
}

// --- weight gradients against the dense library call -------------------------------------------

/// Registers one layer's three weight-gradient cases, on the same operands (post-ReLU normal input,
/// normal dZ): `<Layer::baseline>/<dtype>/<layer>`, the dense library call on the dense input;
/// `<Layer::op>/<policy>/<dtype>/<gamma>/<layer>`, the CUDA backend on the cache (it densifies into
/// its workspace itself); and `densify_<Layer::baseline>/...`, the public densify into a tensor,
/// then the dense library call (the LibTorch adapters' path on a GPU).
/// `Layer` gives the names, `input()`, `dz()`, `dw()` shapes, `params()` (the name's suffix),
/// `typename Layer::template dense<T>` (constructed from the layer; `run(x, dz, dw)`) and
/// `backend_workspace<T>` / `run_backend<T>` (the public workspace query and operation).
template <class T, class Layer>
void register_weight_grad_cases(const Layer& layer, double gamma) {
  const std::string dtype = dtype_name<T>();
  struct operands {
    std::unique_ptr<device_buffer> x, dz;
    device_buffer dw;
    typename Layer::template dense<T> dense;
    explicit operands(const Layer& layer)
        : x(normal_tensor<T>(layer.input().numel(), true, 1)),
          dz(normal_tensor<T>(layer.dz().numel(), false, 2)),
          dw(static_cast<std::size_t>(layer.dw().numel()) * sizeof(T)),
          dense(layer) {}
    void run_dense(const T* input) { dense.run(input, dz->template get<const T>(), dw.get<T>()); }
  };
  benchmark::RegisterBenchmark(
      (std::string(Layer::baseline) + "/" + dtype + "/" + layer.params()).c_str(),
      [layer](benchmark::State& state) {
        operands o(layer);
        run_timed(state, 0, [&] { o.run_dense(o.x->template get<const T>()); });
      })
      ->UseManualTime()
      ->Unit(benchmark::kMicrosecond);

  dropit::policy_spec spec;
  spec.gamma = gamma;
  const std::string name =
      policy_name(spec) + "/" + dtype + "/" + gamma_param(gamma) + "/" + layer.params();
  benchmark::RegisterBenchmark(
      (std::string(Layer::op) + "/" + name).c_str(),
      [layer, spec](benchmark::State& state) {
        operands o(layer);
        device_cache<T> cache(spec, layer.input(), o.x->template get<const T>());
        // TF32 for float as the baseline has it (PyTorch's defaults: off for matmul, on for cuDNN).
        const dropit::cuda_backend backend{.stream = timer().stream(),
                                           .allow_tf32 = Layer::pytorch_tf32};
        device_buffer scratch(layer.template backend_workspace<T>(backend, cache.layout));
        run_timed(state, 0, [&] {
          layer.template run_backend<T>(backend, cache.const_view(), o.dz->template get<const T>(),
                                        o.dw.template get<T>(), scratch.span());
        });
      })
      ->UseManualTime()
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark(
      ("densify_" + std::string(Layer::baseline) + "/" + name).c_str(),
      [layer, spec](benchmark::State& state) {
        operands o(layer);
        device_cache<T> cache(spec, layer.input(), o.x->template get<const T>());
        const dropit::cuda_backend backend{timer().stream()};
        device_buffer dense(static_cast<std::size_t>(layer.input().numel()) * sizeof(T)),
            scratch(dropit::densify_workspace_bytes<T>(backend, cache.layout));
        run_timed(state, 0, [&] {
          dropit::densify<T>(backend, cache.const_view(), {dense.get<T>(), layer.input()},
                             scratch.span());
          o.run_dense(dense.get<const T>());
        });
      })
      ->UseManualTime()
      ->Unit(benchmark::kMicrosecond);
}

cublasHandle_t cublas() {
  static cublasHandle_t handle = [] {
    cublasHandle_t h = nullptr;
    check(cublasCreate(&h), "cublasCreate");
    check(cublasSetStream(h, timer().stream()), "cublasSetStream");
    return h;
  }();
  return handle;
}

/// A linear layer: A [M, K] cached, dZ [M, N], dW [N, K]; the baseline is cublasGemmEx.
struct linear_layer {
  static constexpr const char* op = "linear_dw";
  static constexpr const char* baseline = "gemm";
  static constexpr bool pytorch_tf32 = false;  // torch.backends.cuda.matmul.allow_tf32
  std::int64_t rows, in, out;                  // M, K, N

  dropit::shape input() const { return {rows, in}; }
  dropit::shape dz() const { return {rows, out}; }
  dropit::shape dw() const { return {out, in}; }
  std::string params() const {
    return "M:" + std::to_string(rows) + "/K:" + std::to_string(in) + "/N:" + std::to_string(out);
  }

  /// dW[N, K] = dZᵀ[N, M] · A[M, K], row-major, in column-major terms dWᵀ = Aᵀ · dZ (float
  /// accumulation; tensor cores for 16-bit types).
  template <class T>
  class dense {
   public:
    explicit dense(const linear_layer& s)
        : rows_(static_cast<int>(s.rows)),
          in_(static_cast<int>(s.in)),
          out_(static_cast<int>(s.out)) {}
    void run(const T* a, const T* dz, T* dw) const {
      const float one = 1.0f, zero = 0.0f;
      check(cublasGemmEx(cublas(), CUBLAS_OP_N, CUBLAS_OP_T, in_, out_, rows_, &one, a,
                         cuda_type<T>(), in_, dz, cuda_type<T>(), out_, &zero, dw, cuda_type<T>(),
                         in_, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            "cublasGemmEx");
    }

   private:
    int rows_, in_, out_;
  };

  template <class T>
  std::size_t backend_workspace(const dropit::cuda_backend& backend,
                                const dropit::cache_layout& layout) const {
    return dropit::linear_weight_grad_workspace_bytes<T>(backend, layout, dz(), dw());
  }
  template <class T>
  void run_backend(const dropit::cuda_backend& backend, const dropit::cache_view<const T>& cache,
                   const T* dz_data, T* dw_data, dropit::workspace scratch) const {
    dropit::linear_weight_grad<T>(backend, cache, {dz_data, dz()}, {dw_data, dw()},
                                  dropit::grad_mode::overwrite, scratch);
  }
};

#if DROPIT_BENCH_CUDNN
void check(cudnnStatus_t status, const char* what) {
  if (status != CUDNN_STATUS_SUCCESS)
    throw std::runtime_error(std::string(what) + ": " + cudnnGetErrorString(status));
}

cudnnHandle_t cudnn() {
  static cudnnHandle_t handle = [] {
    cudnnHandle_t h = nullptr;
    check(cudnnCreate(&h), "cudnnCreate");
    check(cudnnSetStream(h, timer().stream()), "cudnnSetStream");
    return h;
  }();
  return handle;
}

template <class T>
constexpr cudnnDataType_t cudnn_type() {
  return std::same_as<T, float>              ? CUDNN_DATA_FLOAT
         : std::same_as<T, dropit::bfloat16> ? CUDNN_DATA_BFLOAT16
                                             : CUDNN_DATA_HALF;
}

/// A square conv2d layer: X [N, C_in, HW, HW] cached, dW [C_out, C_in, k, k]; the baseline is
/// cuDNN's backward filter as PyTorch configures it by default (tensor-op math, so TF32 for float;
/// the algorithm cuDNN's heuristics rank first).
struct conv_layer {
  static constexpr const char* op = "conv2d_dw";
  static constexpr const char* baseline = "cudnn";
  static constexpr bool pytorch_tf32 = true;  // torch.backends.cudnn.allow_tf32
  int batch, in, out, size, kernel, stride, pad;

  int out_size() const { return (size + 2 * pad - kernel) / stride + 1; }
  dropit::shape input() const { return {batch, in, size, size}; }
  dropit::shape dz() const { return {batch, out, out_size(), out_size()}; }
  dropit::shape dw() const { return {out, in, kernel, kernel}; }
  dropit::conv2d_params conv() const {
    return {.stride = {stride, stride}, .padding = {pad, pad}, .dilation = {1, 1}, .groups = 1};
  }
  std::string params() const {
    return "N:" + std::to_string(batch) + "/C:" + std::to_string(in) + "x" + std::to_string(out) +
           "/HW:" + std::to_string(size) + "/k:" + std::to_string(kernel) +
           "/s:" + std::to_string(stride);
  }

  template <class T>
  class dense {
   public:
    explicit dense(const conv_layer& s) {
      check(cudnnCreateTensorDescriptor(&x_), "x descriptor");
      check(cudnnCreateTensorDescriptor(&dz_), "dz descriptor");
      check(cudnnCreateFilterDescriptor(&dw_), "dw descriptor");
      check(cudnnCreateConvolutionDescriptor(&conv_), "conv descriptor");
      check(cudnnSetTensor4dDescriptor(x_, CUDNN_TENSOR_NCHW, cudnn_type<T>(), s.batch, s.in,
                                       s.size, s.size),
            "x descriptor");
      check(cudnnSetTensor4dDescriptor(dz_, CUDNN_TENSOR_NCHW, cudnn_type<T>(), s.batch, s.out,
                                       s.out_size(), s.out_size()),
            "dz descriptor");
      check(cudnnSetFilter4dDescriptor(dw_, cudnn_type<T>(), CUDNN_TENSOR_NCHW, s.out, s.in,
                                       s.kernel, s.kernel),
            "dw descriptor");
      check(cudnnSetConvolution2dDescriptor(conv_, s.pad, s.pad, s.stride, s.stride, 1, 1,
                                            CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
            "conv descriptor");
      check(cudnnSetConvolutionMathType(conv_, CUDNN_TENSOR_OP_MATH), "math type");
      int returned = 0;
      cudnnConvolutionBwdFilterAlgoPerf_t ranked[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
      check(cudnnGetConvolutionBackwardFilterAlgorithm_v7(cudnn(), x_, dz_, conv_, dw_,
                                                          CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT,
                                                          &returned, ranked),
            "backward filter heuristics");
      int first = 0;
      while (first < returned && ranked[first].status != CUDNN_STATUS_SUCCESS) ++first;
      if (first == returned) throw std::runtime_error("cuDNN offers no backward filter algorithm");
      algorithm_ = ranked[first].algo;
      std::size_t bytes = 0;
      check(cudnnGetConvolutionBackwardFilterWorkspaceSize(cudnn(), x_, dz_, conv_, dw_, algorithm_,
                                                           &bytes),
            "backward filter workspace");
      workspace_ = std::make_unique<device_buffer>(bytes);
    }
    ~dense() {
      cudnnDestroyConvolutionDescriptor(conv_);
      cudnnDestroyFilterDescriptor(dw_);
      cudnnDestroyTensorDescriptor(dz_);
      cudnnDestroyTensorDescriptor(x_);
    }
    dense(const dense&) = delete;
    dense& operator=(const dense&) = delete;

    void run(const T* x, const T* dz, T* dw) const {
      const float one = 1.0f, zero = 0.0f;
      check(cudnnConvolutionBackwardFilter(cudnn(), &one, x_, x, dz_, dz, conv_, algorithm_,
                                           workspace_->get(), workspace_->bytes(), &zero, dw_, dw),
            "cudnnConvolutionBackwardFilter");
    }

   private:
    cudnnTensorDescriptor_t x_ = nullptr, dz_ = nullptr;
    cudnnFilterDescriptor_t dw_ = nullptr;
    cudnnConvolutionDescriptor_t conv_ = nullptr;
    cudnnConvolutionBwdFilterAlgo_t algorithm_{};
    std::unique_ptr<device_buffer> workspace_;
  };

  template <class T>
  std::size_t backend_workspace(const dropit::cuda_backend& backend,
                                const dropit::cache_layout& layout) const {
    return dropit::conv2d_weight_grad_workspace_bytes<T>(backend, layout, dz(), dw(), conv());
  }
  template <class T>
  void run_backend(const dropit::cuda_backend& backend, const dropit::cache_view<const T>& cache,
                   const T* dz_data, T* dw_data, dropit::workspace scratch) const {
    dropit::conv2d_weight_grad<T>(backend, cache, {dz_data, dz()}, {dw_data, dw()}, conv(),
                                  dropit::grad_mode::overwrite, scratch);
  }
};
#endif  // DROPIT_BENCH_CUDNN

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
  for (const linear_layer& layer : {linear_layer{8192, 1024, 4096}, linear_layer{16384, 768, 3072}})
    for (const double gamma : {0.9, 0.99}) {
      register_weight_grad_cases<float>(layer, gamma);
      register_weight_grad_cases<dropit::bfloat16>(layer, gamma);
    }
#if DROPIT_BENCH_CUDNN
  // ResNet-50's 3x3 convolutions and a strided 1x1 shortcut, batch 64.
  for (const conv_layer& layer :
       {conv_layer{64, 64, 64, 56, 3, 1, 1}, conv_layer{64, 128, 128, 28, 3, 1, 1},
        conv_layer{64, 256, 256, 14, 3, 1, 1}, conv_layer{64, 512, 512, 7, 3, 1, 1},
        conv_layer{64, 256, 512, 56, 1, 2, 0}})
    for (const double gamma : {0.9, 0.99}) {
      register_weight_grad_cases<float>(layer, gamma);
      register_weight_grad_cases<dropit::bfloat16>(layer, gamma);
    }
#endif
  try {
    benchmark::RunSpecifiedBenchmarks();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dropit_bench_cuda: %s\n", e.what());
    return 1;
  }
  benchmark::Shutdown();
  return 0;
}
