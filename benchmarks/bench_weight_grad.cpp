// Weight gradients from a compact cache against the dense computation on the same shapes:
// - linear: dropit::linear_weight_grad vs cblas_sgemm, dW[N, K] = dZ^T[N, M] * A[M, K];
// - conv2d: dropit::conv2d_weight_grad vs im2col + cblas_sgemm, dW[Cout, Cin*k*k] =
//   dZ[Cout, pixels] * cols^T, in two forms (per image with beta = 1, or one im2col of the whole
//   batch and one large sgemm); report.py compares against the faster of the two.
// The dense baselines always run in fp32, whatever the cache's element type.

#include <cblas.h>

#include <algorithm>
#include <cstring>

#include "bench_common.hpp"

namespace bench {
namespace {

/// Dense-equivalent FLOP rate (2 * multiply-adds of the dense product per second), comparable
/// between a case and its baseline.
void set_dense_flops(benchmark::State& state, double flops) {
  state.counters["dense_FLOPS"] = benchmark::Counter(
      flops, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

void set_cache_bytes(benchmark::State& state, const dropit::cache_layout& layout) {
  state.counters["cache_B_per_elem"] =
      static_cast<double>(layout.bytes()) / static_cast<double>(layout.numel());
}

/// Compresses `input` into storage for `layout`, outside any timed loop.
template <class T>
cache_storage<T> make_cache(const dropit::cache_layout& layout, const T* input) {
  const auto backend = bench::backend();
  cache_storage<T> cache(layout);
  scratch work(dropit::compress_workspace_bytes<T>(backend, layout));
  dropit::compress<T>(backend, {input, layout.shape}, cache.view, work.span());
  return cache;
}

// ---------------------------------------------------------------------------------------------
// Linear.

struct linear_shape {
  std::int64_t rows, in, out;  // M, K, N
};

std::string linear_params(const linear_shape& s) {
  return join({param("M", s.rows), param("K", s.in), param("N", s.out)});
}

double linear_flops(const linear_shape& s) {
  return 2.0 * static_cast<double>(s.rows) * static_cast<double>(s.in) * static_cast<double>(s.out);
}

/// dW[N, K] = dZ^T[N, M] * A[M, K], dZ stored [M, N].
void dense_linear(const linear_shape& s, const float* a, const float* dz, float* dw) {
  const auto m = static_cast<int>(s.rows), k = static_cast<int>(s.in), n = static_cast<int>(s.out);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, k, m, 1.0f, dz, n, a, k, 0.0f, dw, k);
}

void sgemm_linear_case(benchmark::State& state, linear_shape s) {
  const auto a = normal_array<float>(s.rows * s.in, 1);
  const auto dz = normal_array<float>(s.rows * s.out, 2);
  array<float> dw(static_cast<std::size_t>(s.out * s.in));
  for (auto _ : state) {
    dense_linear(s, a.data(), dz.data(), dw.data());
    benchmark::ClobberMemory();
  }
  set_dense_flops(state, linear_flops(s));
}

template <class T>
void linear_case(benchmark::State& state, policy_spec spec, linear_shape s) {
  const auto backend = bench::backend();
  const dropit::shape a_shape{s.rows, s.in}, dz_shape{s.rows, s.out}, dw_shape{s.out, s.in};
  const auto layout = plan(spec, a_shape, dropit::element_type_of<T>, -1);  // features axis
  const auto a = normal_array<T>(s.rows * s.in, 1);
  const auto dz = normal_array<T>(s.rows * s.out, 2);
  array<T> dw(static_cast<std::size_t>(s.out * s.in));
  const auto cache = make_cache<T>(layout, a.data());
  scratch work(dropit::linear_weight_grad_workspace_bytes<T>(backend, layout, dz_shape, dw_shape));
  for (auto _ : state) {
    dropit::linear_weight_grad<T>(backend, cache.view, {dz.data(), dz_shape}, {dw.data(), dw_shape},
                                  dropit::grad_mode::overwrite, work.span());
    benchmark::ClobberMemory();
  }
  set_dense_flops(state, linear_flops(s));
  set_cache_bytes(state, layout);
}

template <class T>
void register_linear(const policy_spec& spec, const linear_shape& s) {
  add(join(
          {"linear_dw", policy_name(spec), dtype_name<T>(), policy_params(spec), linear_params(s)}),
      [spec, s](benchmark::State& state) { linear_case<T>(state, spec, s); });
}

// ---------------------------------------------------------------------------------------------
// Conv2d (square images and kernels, dilation 1, groups 1).

struct conv_layer {
  std::int64_t batch, in, out, size, kernel, stride, pad;

  std::int64_t out_size() const { return (size + 2 * pad - kernel) / stride + 1; }
  std::int64_t out_pixels() const { return out_size() * out_size(); }
  std::int64_t patch() const { return in * kernel * kernel; }  // columns of dW
  bool pointwise() const { return kernel == 1 && stride == 1 && pad == 0; }
};

std::string conv_params(const conv_layer& l) {
  return join({param("B", l.batch), param("Cin", l.in), param("Cout", l.out), param("HW", l.size),
               param("k", l.kernel), param("s", l.stride), param("p", l.pad)});
}

double conv_flops(const conv_layer& l) {
  return 2.0 * static_cast<double>(l.out) * static_cast<double>(l.patch()) *
         static_cast<double>(l.batch * l.out_pixels());
}

/// Writes row `row` = (channel, kh, kw) of one image's im2col matrix: the input pixel each output
/// pixel meets through that tap, 0 in the padding. Stride 1 copies whole runs.
void im2col_row(const float* image, const conv_layer& l, std::int64_t row, float* out) {
  const std::int64_t k = l.kernel, c = row / (k * k), kh = row / k % k, kw = row % k;
  const std::int64_t size = l.size, out_size = l.out_size();
  for (std::int64_t oh = 0; oh < out_size; ++oh) {
    float* dst = out + oh * out_size;
    const std::int64_t ih = oh * l.stride - l.pad + kh;
    if (ih < 0 || ih >= size) {
      std::fill_n(dst, out_size, 0.0f);
      continue;
    }
    const float* src = image + (c * size + ih) * size;
    if (l.stride == 1) {
      const std::int64_t shift = kw - l.pad;  // iw = ow + shift
      const std::int64_t lo = std::clamp<std::int64_t>(-shift, 0, out_size);
      const std::int64_t hi = std::clamp<std::int64_t>(size - shift, lo, out_size);
      std::fill_n(dst, lo, 0.0f);
      std::memcpy(dst + lo, src + lo + shift, static_cast<std::size_t>(hi - lo) * sizeof(float));
      std::fill_n(dst + hi, out_size - hi, 0.0f);
    } else {
      for (std::int64_t ow = 0; ow < out_size; ++ow) {
        const std::int64_t iw = ow * l.stride - l.pad + kw;
        dst[ow] = iw >= 0 && iw < size ? src[iw] : 0.0f;
      }
    }
  }
}

/// Per image: im2col [Cin*k*k, pixels] (on the benchmark threads), then dW += dZ_n * cols^T.
/// A 1x1 stride-1 convolution needs no im2col: the image already is that matrix. `cols` holds
/// Cin*k*k*pixels floats (none for 1x1).
void dense_conv_per_image(const conv_layer& l, const float* x, const float* dz, float* dw,
                          float* cols) {
  const std::int64_t pixels = l.out_pixels(), patch = l.patch(),
                     image_size = l.in * l.size * l.size;
  for (std::int64_t n = 0; n < l.batch; ++n) {
    const float* image = x + n * image_size;
    const float* matrix = image;
    if (!l.pointwise()) {
#pragma omp parallel for num_threads(thread_count()) schedule(static)
      for (std::int64_t r = 0; r < patch; ++r) im2col_row(image, l, r, cols + r * pixels);
      matrix = cols;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(l.out),
                static_cast<int>(patch), static_cast<int>(pixels), 1.0f, dz + n * l.out * pixels,
                static_cast<int>(pixels), matrix, static_cast<int>(pixels), n == 0 ? 0.0f : 1.0f,
                dw, static_cast<int>(patch));
  }
}

/// Whole batch: cols [Cin*k*k, B*pixels] and dZ permuted to dz_t [Cout, B*pixels], then one sgemm
/// whose long inner dimension runs OpenBLAS at full speed, at the cost of two large copies.
void dense_conv_batched(const conv_layer& l, const float* x, const float* dz, float* dw,
                        float* cols, float* dz_t) {
  const std::int64_t pixels = l.out_pixels(), patch = l.patch(), columns = l.batch * pixels;
  const std::int64_t image_size = l.in * l.size * l.size;
#pragma omp parallel for num_threads(thread_count()) schedule(static)
  for (std::int64_t r = 0; r < patch; ++r)
    for (std::int64_t n = 0; n < l.batch; ++n)
      im2col_row(x + n * image_size, l, r, cols + r * columns + n * pixels);
#pragma omp parallel for num_threads(thread_count()) schedule(static)
  for (std::int64_t co = 0; co < l.out; ++co)
    for (std::int64_t n = 0; n < l.batch; ++n)
      std::memcpy(dz_t + co * columns + n * pixels, dz + (n * l.out + co) * pixels,
                  static_cast<std::size_t>(pixels) * sizeof(float));
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(l.out),
              static_cast<int>(patch), static_cast<int>(columns), 1.0f, dz_t,
              static_cast<int>(columns), cols, static_cast<int>(columns), 0.0f, dw,
              static_cast<int>(patch));
}

struct conv_operands {
  explicit conv_operands(const conv_layer& l)
      : x(normal_array<float>(l.batch * l.in * l.size * l.size, 3)),
        dz(normal_array<float>(l.batch * l.out * l.out_pixels(), 4)),
        dw(static_cast<std::size_t>(l.out * l.patch())) {}
  array<float> x, dz, dw;
};

void im2col_per_image_case(benchmark::State& state, conv_layer l) {
  conv_operands ops(l);
  array<float> cols(l.pointwise() ? 0 : static_cast<std::size_t>(l.patch() * l.out_pixels()));
  for (auto _ : state) {
    dense_conv_per_image(l, ops.x.data(), ops.dz.data(), ops.dw.data(), cols.data());
    benchmark::ClobberMemory();
  }
  set_dense_flops(state, conv_flops(l));
}

void im2col_batched_case(benchmark::State& state, conv_layer l) {
  conv_operands ops(l);
  const std::int64_t columns = l.batch * l.out_pixels();
  array<float> cols(static_cast<std::size_t>(l.patch() * columns));
  array<float> dz_t(static_cast<std::size_t>(l.out * columns));
  for (auto _ : state) {
    dense_conv_batched(l, ops.x.data(), ops.dz.data(), ops.dw.data(), cols.data(), dz_t.data());
    benchmark::ClobberMemory();
  }
  set_dense_flops(state, conv_flops(l));
}

template <class T>
void conv_case(benchmark::State& state, policy_spec spec, conv_layer l) {
  const auto backend = bench::backend();
  const dropit::shape x_shape{l.batch, l.in, l.size, l.size};
  const dropit::shape dz_shape{l.batch, l.out, l.out_size(), l.out_size()};
  const dropit::shape dw_shape{l.out, l.in, l.kernel, l.kernel};
  dropit::conv2d_params params;
  params.stride[0] = params.stride[1] = l.stride;
  params.padding[0] = params.padding[1] = l.pad;
  const auto layout = plan(spec, x_shape, dropit::element_type_of<T>, 1);
  const auto x = normal_array<T>(x_shape.numel(), 3);
  const auto dz = normal_array<T>(dz_shape.numel(), 4);
  array<T> dw(static_cast<std::size_t>(dw_shape.numel()));
  const auto cache = make_cache<T>(layout, x.data());
  scratch work(
      dropit::conv2d_weight_grad_workspace_bytes<T>(backend, layout, dz_shape, dw_shape, params));
  for (auto _ : state) {
    dropit::conv2d_weight_grad<T>(backend, cache.view, {dz.data(), dz_shape}, {dw.data(), dw_shape},
                                  params, dropit::grad_mode::overwrite, work.span());
    benchmark::ClobberMemory();
  }
  set_dense_flops(state, conv_flops(l));
  set_cache_bytes(state, layout);
}

template <class T>
void register_conv(const policy_spec& spec, const conv_layer& l) {
  add(join({"conv2d_dw", policy_name(spec), dtype_name<T>(), policy_params(spec), conv_params(l)}),
      [spec, l](benchmark::State& state) { conv_case<T>(state, spec, l); });
}

}  // namespace

void register_weight_grad_benchmarks() {
  const policy_spec headline{policy_kind::chunked_min_k, 0.9};

  // Square layer first (every policy and bf16 there), then transformer MLP shapes (BERT-base
  // up/down projections, a 4096-wide layer).
  const linear_shape linear_shapes[] = {
      {8192, 1024, 1024}, {4096, 768, 3072}, {4096, 3072, 768}, {2048, 4096, 4096}};
  for (const auto& s : linear_shapes) {
    add(join({"sgemm", "f32", linear_params(s)}),
        [s](benchmark::State& state) { sgemm_linear_case(state, s); });
    if (&s == &linear_shapes[0]) {
      for (policy_kind kind : all_policies) register_linear<float>({kind, 0.9}, s);
      register_linear<dropit::bfloat16>(headline, s);
    } else {
      register_linear<float>(headline, s);
    }
  }

  // ResNet-like layers on a batch of 32: the three 3x3 stages, a stride-2 downsampling 3x3 and a
  // 1x1 projection.
  const conv_layer conv_layers[] = {{32, 64, 64, 32, 3, 1, 1},
                                    {32, 128, 128, 16, 3, 1, 1},
                                    {32, 256, 256, 8, 3, 1, 1},
                                    {32, 128, 256, 16, 3, 2, 1},
                                    {32, 256, 128, 16, 1, 1, 0}};
  for (const auto& l : conv_layers) {
    add(join({"im2col_sgemm", "per_image", conv_params(l)}),
        [l](benchmark::State& state) { im2col_per_image_case(state, l); });
    add(join({"im2col_sgemm", "batched", conv_params(l)}),
        [l](benchmark::State& state) { im2col_batched_case(state, l); });
    if (&l == &conv_layers[0]) {
      for (policy_kind kind : all_policies) register_conv<float>({kind, 0.9}, l);
      register_conv<dropit::bfloat16>(headline, l);
    } else {
      register_conv<float>(headline, l);
    }
  }
}

}  // namespace bench
