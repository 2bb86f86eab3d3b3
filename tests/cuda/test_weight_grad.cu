// GPU weight gradients from a cache equal the dense formula applied to densify(cache), within the
// float tolerance of the CPU tests, for every policy, element type, a range of linear shapes and
// the convolution parameter grid; replacing or accumulating into dW. The caches are made by the CPU
// backend and copied to the device, so these tests exercise the gradient path alone.

#include <array>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

#include "cuda_helpers.cuh"

namespace {

using cuda_test::device_buffer;
using dropit::bfloat16;
using dropit::half;
using namespace dropit;

const cpu_backend serial{1};

// want + old, for checking grad_mode::accumulate.
template <class T>
ref::dense_gradient plus(ref::dense_gradient g, const std::vector<T>& old) {
  for (std::size_t i = 0; i < old.size(); ++i) {
    g.value[i] += ref::value_of(old[i]);
    g.magnitude[i] += std::fabs(ref::value_of(old[i]));
  }
  return g;
}

struct linear_case {
  std::vector<std::int64_t> a_dims;  // [..., K]
  std::int64_t out_features;
};

const linear_case linear_cases[] = {
    {{1, 1}, 1}, {{7, 5}, 3}, {{64, 33}, 65}, {{200, 48}, 64}, {{3, 4, 10}, 130}, {{130, 1}, 2},
    {{17}, 5},   {{0, 5}, 3}, {{4, 0}, 3},    {{4, 6}, 0},     {{300, 100}, 17}};

template <class T, class P>
void check_linear(const P& p, const linear_case& lc, std::uint64_t seed,
                  const cuda_backend& gpu = {}, test::tolerance tol = test::tolerance_for<T>()) {
  const std::int64_t k = lc.a_dims.back();
  const std::int64_t m =
      std::accumulate(lc.a_dims.begin(), lc.a_dims.end() - 1, std::int64_t{1}, std::multiplies<>());
  const std::int64_t n = lc.out_features;
  const auto a = test::smooth_values<T>(m * k, seed);
  const auto dz = test::smooth_values<T>(m * n, seed + 1);
  const auto c = compress(serial, p, test::view_of(a, test::shape_of(lc.a_dims)));
  const auto want = ref::linear_dw(test::gradient_operand(c), test::as_float(dz), m, k, n);

  const auto cache = cuda_test::upload(c);
  const device_buffer<T> d_dz(dz);
  const dropit::shape dz_shape{m, n}, dw_shape{n, k};
  const auto scratch = cuda_test::device_workspace(
      linear_weight_grad_workspace_bytes<T>(gpu, c.layout(), dz_shape, dw_shape));
  device_buffer<T> d_dw(std::vector<T>(static_cast<std::size_t>(n * k), test::make<T>(123.0)));
  linear_weight_grad<T>(gpu, cache.const_view(), {d_dz.data(), dz_shape}, {d_dw.data(), dw_shape},
                        grad_mode::overwrite, cuda_test::as_workspace(scratch));
  cuda_test::finish(gpu);
  CHECK_GRADIENT(d_dw.download(), want, tol);

  const auto old = test::smooth_values<T>(n * k, seed + 2);
  d_dw.upload(old);
  linear_weight_grad<T>(gpu, cache.const_view(), {d_dz.data(), dz_shape}, {d_dw.data(), dw_shape},
                        grad_mode::accumulate, cuda_test::as_workspace(scratch));
  cuda_test::finish(gpu);
  CHECK_GRADIENT(d_dw.download(), plus(want, old), tol);
}

// Calls `f(policy, name)` for each of test::for_each_policy's policies — on the emulated device
// for two of them: a bitmask cache (densify, then the GEMM or im2col path) and a rescaled seeded
// one (16-bit types' direct kernels), where every policy over the conv2d grid takes minutes; the
// policies' own caches are checked by test_cache.cu there.
template <class F>
void for_each_gradient_policy(double gamma, int channel_axis, F&& f) {
  int chosen = 0;
  test::for_each_policy(gamma, channel_axis, [&](const auto& p, const char* name) {
    const std::string_view policy = name;
    if (cuda_test::emulated_device && policy != "chunked min-k, D = 2^14" &&
        policy != "random, D = 50, rescaled")
      return;
    ++chosen;
    f(p, name);
  });
  if (cuda_test::emulated_device) REQUIRE(chosen == 2);
}

std::vector<ref::conv_shape> conv_grid() {
  std::vector<ref::conv_shape> grid;
  const std::int64_t kernels[][2] = {{1, 1}, {3, 3}, {3, 2}};
  for (std::int64_t stride : {1, 2})
    for (std::int64_t pad : {0, 1})
      for (std::int64_t dilation : {1, 2})
        for (std::int64_t groups : {1, 2, 8})
          for (const auto& kernel : kernels) {
            ref::conv_shape g{.batch = 2,
                              .in_channels = 8,
                              .height = 9,
                              .width = 7,
                              .out_channels = 8,
                              .kernel_h = kernel[0],
                              .kernel_w = kernel[1]};
            g.stride_h = g.stride_w = stride;
            g.pad_h = g.pad_w = pad;
            g.dilation_h = g.dilation_w = dilation;
            g.groups = groups;
            if (g.out_h() > 0 && g.out_w() > 0) grid.push_back(g);
          }
  // A 7x7 kernel of stride 2 on an odd input, in blocks of one sample.
  grid.push_back({.batch = 3,
                  .in_channels = 5,
                  .height = 19,
                  .width = 17,
                  .out_channels = 6,
                  .kernel_h = 7,
                  .kernel_w = 7,
                  .stride_h = 2,
                  .stride_w = 2,
                  .pad_h = 3,
                  .pad_w = 3});
  // The im2col path sums blocks of samples: five samples in blocks of three and two, and none.
  for (std::int64_t batch : {5, 0})
    grid.push_back({.batch = batch,
                    .in_channels = 8,
                    .height = 9,
                    .width = 7,
                    .out_channels = 24,
                    .kernel_h = 1,
                    .kernel_w = 1,
                    .stride_h = 2,
                    .stride_w = 2});
  return grid;
}

dropit::detail::conv2d_geometry geometry_of(const ref::conv_shape& s) {
  dropit::detail::conv2d_geometry g{};
  g.batch = s.batch, g.in_channels = s.in_channels, g.height = s.height, g.width = s.width;
  g.out_channels = s.out_channels, g.out_height = s.out_h(), g.out_width = s.out_w();
  g.kernel_h = s.kernel_h, g.kernel_w = s.kernel_w;
  g.stride_h = s.stride_h, g.stride_w = s.stride_w, g.pad_h = s.pad_h, g.pad_w = s.pad_w;
  g.dilation_h = s.dilation_h, g.dilation_w = s.dilation_w, g.groups = s.groups;
  return g;
}

template <class T, class P>
void check_conv(const P& p, const ref::conv_shape& g, std::uint64_t seed,
                const cuda_backend& gpu = {}, test::tolerance tol = test::tolerance_for<T>()) {
  const auto x = test::smooth_values<T>(g.x_numel(), seed);
  const auto dz = test::smooth_values<T>(g.dz_numel(), seed + 1);
  const dropit::shape x_shape{g.batch, g.in_channels, g.height, g.width};
  const dropit::shape dz_shape{g.batch, g.out_channels, g.out_h(), g.out_w()};
  const dropit::shape dw_shape{g.out_channels, g.in_channels / g.groups, g.kernel_h, g.kernel_w};
  const conv2d_params params = g.params();
  const auto c = compress(serial, p, test::view_of(x, x_shape));
  const auto want = ref::conv2d_dw(test::gradient_operand(c), test::as_float(dz), g);

  const auto cache = cuda_test::upload(c);
  const device_buffer<T> d_dz(dz);
  const auto scratch = cuda_test::device_workspace(
      conv2d_weight_grad_workspace_bytes<T>(gpu, c.layout(), dz_shape, dw_shape, params));
  device_buffer<T> d_dw(
      std::vector<T>(static_cast<std::size_t>(g.dw_numel()), test::make<T>(-7.0)));
  conv2d_weight_grad<T>(gpu, cache.const_view(), {d_dz.data(), dz_shape}, {d_dw.data(), dw_shape},
                        params, grad_mode::overwrite, cuda_test::as_workspace(scratch));
  cuda_test::finish(gpu);
  CHECK_GRADIENT(d_dw.download(), want, tol);

  const auto old = test::smooth_values<T>(g.dw_numel(), seed + 2);
  d_dw.upload(old);
  conv2d_weight_grad<T>(gpu, cache.const_view(), {d_dz.data(), dz_shape}, {d_dw.data(), dw_shape},
                        params, grad_mode::accumulate, cuda_test::as_workspace(scratch));
  cuda_test::finish(gpu);
  CHECK_GRADIENT(d_dw.download(), plus(want, old), tol);
}

}  // namespace

TEST_CASE_TEMPLATE("cuda: linear dW equals dZ^T densify(cache)", T, float, dropit::half,
                   dropit::bfloat16) {
  std::uint64_t seed = 1;
  for (const linear_case& lc : linear_cases)
    for (double gamma : {0.0, 0.7, 0.95}) {
      CAPTURE(lc.a_dims.size());
      CAPTURE(lc.out_features);
      CAPTURE(gamma);
      for_each_gradient_policy(gamma, -1, [&](const auto& p, const char* name) {
        CAPTURE(name);
        check_linear<T>(p, lc, seed += 3);
      });
    }
}

// (On the emulated device, built without cuDNN, this is the next case's im2col path: skipped
// there.)
TEST_CASE_TEMPLATE("cuda: conv2d dW equals the direct sum over densify(cache)" *
                       doctest::skip(cuda_test::emulated_device),
                   T, float, dropit::half, bfloat16) {
  std::uint64_t seed = 1;
  for (const ref::conv_shape& g : conv_grid())
    for (double gamma : {0.0, 0.6}) {
      const std::string geometry = g.text();
      CAPTURE(geometry);
      CAPTURE(gamma);
      for_each_gradient_policy(gamma, 1, [&](const auto& p, const char* name) {
        CAPTURE(name);
        check_conv<T>(p, g, seed += 3);
      });
    }
}

// The backend's own im2col + cuBLAS path, which `use_cudnn` off takes where the backend is built
// with cuDNN (and a build without cuDNN always): the grid, and 64 input channels of 32x32 under a
// 3x3 kernel, whose 589 824 column elements per sample outnumber the threads of conv2d_columns'
// grid (1 024 blocks), so that each thread takes several steps of its walk.
TEST_CASE_TEMPLATE("cuda: conv2d dW equals the direct sum through im2col and cuBLAS", T, float,
                   dropit::half, bfloat16) {
  cuda_backend im2col;
  im2col.use_cudnn = false;
  std::vector<ref::conv_shape> shapes = conv_grid();
  shapes.push_back({.batch = 2,
                    .in_channels = 64,
                    .height = 32,
                    .width = 32,
                    .out_channels = 8,
                    .kernel_h = 3,
                    .kernel_w = 3,
                    .pad_h = 1,
                    .pad_w = 1});
  std::uint64_t seed = 700;
  for (const ref::conv_shape& g : shapes) {
    const std::string geometry = g.text();
    CAPTURE(geometry);
    for_each_gradient_policy(0.6, 1, [&](const auto& p, const char* name) {
      CAPTURE(name);
      check_conv<T>(p, g, seed += 3, im2col);
    });
  }
}

// The workspace the backend asks for is the im2col path's (blocks of samples, no cuDNN plan) with
// use_cudnn off, and cuDNN's with it on (built with cuDNN). (16-bit caches with rescaling take the
// direct kernel either way.)
TEST_CASE_TEMPLATE("cuda: conv2d dW with use_cudnn off takes the im2col path", T, float,
                   dropit::half, bfloat16) {
  namespace dc = dropit::detail::cuda;
  const ref::conv_shape s = conv_grid().front();
  const auto x = test::smooth_values<T>(s.x_numel(), 1);
  const auto c = compress(serial, policy<chunked_min_k_selection>{{0.6, 64}},
                          test::view_of(x, {s.batch, s.in_channels, s.height, s.width}));
  const auto scratch_for = [&](bool use_cudnn) {
    dc::conv2d_scratch scratch;
    const std::size_t bytes =
        dropit::detail::workspace_bytes_of([&](dropit::detail::workspace_carver& carver) {
          scratch = dc::add_conv2d_scratch<T>(carver, c.layout(), geometry_of(s), false, use_cudnn);
        });
    return std::pair{scratch, bytes};
  };
  const auto asked_by = [&](bool use_cudnn) {
    cuda_backend gpu;
    gpu.use_cudnn = use_cudnn;
    return conv2d_weight_grad_workspace_bytes<T>(
        gpu, c.layout(), {s.batch, s.out_channels, s.out_h(), s.out_w()},
        {s.out_channels, s.in_channels / s.groups, s.kernel_h, s.kernel_w}, s.params());
  };
  const auto [im2col, im2col_bytes] = scratch_for(false);
  CHECK(im2col.block_samples >= 1);
  CHECK(asked_by(false) == im2col_bytes);
#if DROPIT_CUDA_CUDNN
  CHECK(im2col.cudnn == nullptr);
  const auto [cudnn, cudnn_bytes] = scratch_for(true);
  CHECK(cudnn.cudnn != nullptr);
  CHECK(cudnn.block_samples == 0);
  CHECK(asked_by(true) == cudnn_bytes);
  CHECK(cudnn_bytes != im2col_bytes);
#endif
}

TEST_CASE("cuda: conv2d dW sums im2col blocks no larger than the dense input") {
  // The grid's five-sample case: per sample, 20 output pixels x (8 input rows + 24 dZ rows) = 640
  // block elements against 504 input elements, so 3 samples fit in the input's 2520.
  dropit::detail::conv2d_geometry g{};
  g.batch = 5, g.in_channels = 8, g.height = 9, g.width = 7;
  g.out_channels = 24, g.out_height = 5, g.out_width = 4;
  g.kernel_h = g.kernel_w = 1, g.stride_h = g.stride_w = 2, g.dilation_h = g.dilation_w = 1;
  g.groups = 1;
  CHECK(dropit::detail::cuda::conv2d_block_samples(g) == 3);
  g.batch = 1;  // one sample even when its block is larger than the input
  CHECK(dropit::detail::cuda::conv2d_block_samples(g) == 1);
  g.batch = 0;
  CHECK(dropit::detail::cuda::conv2d_block_samples(g) == 1);
}

// The library handles are bound to a stream and workspace only when a call's differ from the last
// call's: calls alternating between two streams (each with a workspace of its own) each run on
// their own stream, which cuBLAS's and cuDNN's handles report, and give the dense gradients.
TEST_CASE("cuda: weight gradients alternating between two streams run on each call's own") {
  namespace dc = dropit::detail::cuda;
  std::array<cudaStream_t, 2> streams{};
  for (cudaStream_t& stream : streams)
    CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const policy<chunked_min_k_selection> p{{0.9, 256}};
  std::uint64_t seed = 40;
  for (int call = 0; call < 4; ++call) {
    CAPTURE(call);
    const cuda_backend gpu{streams[static_cast<std::size_t>(call % 2)]};
    check_linear<float>(p, {{300, 100}, 17}, seed += 3, gpu);
    cudaStream_t bound = nullptr;
    CHECK(cublasGetStream(dc::library_handles<dc::cublas_library>::current("test").handle,
                          &bound) == CUBLAS_STATUS_SUCCESS);
    CHECK(bound == gpu.stream);
    check_conv<float>(p, conv_grid().front(), seed += 3, gpu);
#if DROPIT_CUDA_CUDNN
    bound = nullptr;
    CHECK(cudnnGetStream(dc::library_handles<dc::cudnn_library>::current("test").handle, &bound) ==
          CUDNN_STATUS_SUCCESS);
    CHECK(bound == gpu.stream);
#endif
  }
  for (cudaStream_t stream : streams) CUDA_REQUIRE(cudaStreamDestroy(stream));
}

TEST_CASE("cuda: weight-gradient bad inputs throw dropit::error naming the value") {
  const cuda_backend gpu{};
  const auto a = test::smooth_values<float>(6 * 4, 1);
  const auto c = compress(serial, policy<min_k_selection>{{0.5}}, test::view_of(a, {6, 4}));
  const auto cache = cuda_test::upload(c);
  const device_buffer<float> dz(std::vector<float>(6 * 3, 1.0f));
  device_buffer<float> dw(3 * 4);
  const auto bytes = linear_weight_grad_workspace_bytes<float>(gpu, c.layout(), {6, 3}, {3, 4});
  const auto scratch = cuda_test::device_workspace(bytes);
  const workspace ws = cuda_test::as_workspace(scratch);

  CHECK_ERROR(linear_weight_grad<float>(gpu, cache.const_view(), {dz.data(), dropit::shape{5, 3}},
                                        {dw.data(), dropit::shape{3, 4}}, grad_mode::overwrite, ws),
              "dZ", "[5, 3]");
  CHECK_ERROR(linear_weight_grad<float>(gpu, cache.const_view(), {dz.data(), dropit::shape{6, 3}},
                                        {dw.data(), dropit::shape{4, 3}}, grad_mode::overwrite, ws),
              "dW", "[4, 3]");
  CHECK_ERROR(linear_weight_grad<float>(gpu, cache.const_view(), {dz.data(), dropit::shape{6, 3}},
                                        {dw.data(), dropit::shape{3, 4}}, grad_mode::overwrite,
                                        ws.first(bytes - 1)),
              "linear_weight_grad", "workspace of");
  CHECK_ERROR(linear_weight_grad_workspace_bytes<dropit::half>(gpu, c.layout(), {6, 3}, {3, 4}),
              "float32", "float16");
  CHECK_ERROR(
      conv2d_weight_grad_workspace_bytes<float>(gpu, c.layout(), {6, 3}, {3, 4}, conv2d_params{}),
      "conv2d input", "[6, 4]");
}

// What TF32 tensor cores may lose: each operand keeps 10 bits of mantissa (rounded or truncated,
// at most 2^-10 of it), so each product up to 2^-9 of its magnitude, summed in float: 2^-9 of the
// sum of the products' magnitudes. (Half precision's tolerance, 10^-5 of that sum and 2^-10 of the
// value, holds for 16-bit operands, whose products are exact; TF32's rounding exceeds it.)
const test::tolerance tf32_rounding{0x1p-9, 0.0, 1e-30};

// Float weight gradients through cuBLAS on TF32 tensor cores where the backend allows them (the
// linear gradient, and conv2d's im2col path). (cuDNN's TF32 path: below.)
TEST_CASE("cuda: linear and im2col conv2d dW with TF32 allowed stay within TF32's rounding") {
  cuda_backend tf32{.allow_tf32 = true};
  tf32.use_cudnn = false;
  const policy<chunked_min_k_selection> p{{0.6, 1000}};
  std::uint64_t seed = 1;
  for (const linear_case& lc : {linear_case{{300, 100}, 17}, linear_case{{64, 33}, 65}}) {
    CAPTURE(lc.out_features);
    check_linear<float>(p, lc, seed += 3, tf32, tf32_rounding);
  }
  const auto grid = conv_grid();
  for (const ref::conv_shape& g : {grid.front(), grid[grid.size() - 2]}) {
    const std::string geometry = g.text();
    CAPTURE(geometry);
    check_conv<float>(p, g, seed += 3, tf32, tf32_rounding);
  }
}

#if DROPIT_CUDA_CUDNN
// cuDNN's backward-filter convolution, the conv2d weight gradient's path where dropit::cuda is
// built with cuDNN. cuDNN checks an operation graph without a device, so the "deviceless" suite
// runs on every machine (ctest: cuda.deviceless); the plans need a GPU.

namespace {

// ResNet-50's 3x3 layers of its four stages and a strided 1x1 shortcut, batch 64 (the kernel
// benchmark's conv2d cases).
std::vector<ref::conv_shape> resnet50_layers() {
  std::vector<ref::conv_shape> layers;
  for (const auto& [channels, size] : {std::pair{64, 56}, {128, 28}, {256, 14}, {512, 7}})
    layers.push_back({.batch = 64,
                      .in_channels = channels,
                      .height = size,
                      .width = size,
                      .out_channels = channels,
                      .kernel_h = 3,
                      .kernel_w = 3,
                      .pad_h = 1,
                      .pad_w = 1});
  layers.push_back({.batch = 64,
                    .in_channels = 256,
                    .height = 56,
                    .width = 56,
                    .out_channels = 512,
                    .kernel_h = 1,
                    .kernel_w = 1,
                    .stride_h = 2,
                    .stride_w = 2});
  return layers;
}

// A small 3x3 layer whose gradient the tests below compute from operands cuDNN must not assume
// 16-byte aligned.
const ref::conv_shape small_layer{.batch = 4,
                                  .in_channels = 32,
                                  .height = 9,
                                  .width = 9,
                                  .out_channels = 16,
                                  .kernel_h = 3,
                                  .kernel_w = 3,
                                  .pad_h = 1,
                                  .pad_w = 1};

std::vector<ref::conv_shape> cudnn_shapes() {
  std::vector<ref::conv_shape> shapes;
  for (const ref::conv_shape& s : conv_grid())
    if (s.batch > 0) shapes.push_back(s);
  for (const ref::conv_shape& s : resnet50_layers()) shapes.push_back(s);
  shapes.push_back(small_layer);
  return shapes;
}

}  // namespace

TEST_SUITE("deviceless") {
  TEST_CASE_TEMPLATE("cuda: cuDNN accepts the conv2d weight-gradient graph of every geometry", T,
                     float, dropit::half, bfloat16) {
    namespace dc = dropit::detail::cuda;
    for (const ref::conv_shape& s : cudnn_shapes())
      for (const bool aligned : {true, false})
        for (const bool accumulate : {false, true}) {
          const std::string geometry = s.text();
          CAPTURE(geometry);
          CAPTURE(aligned);
          CAPTURE(accumulate);
          CHECK_NOTHROW(dc::cudnn_wgrad_graph(
              dc::make_cudnn_wgrad_problem<T>(geometry_of(s), aligned, accumulate, false)));
        }
  }

  // The test grid's geometries and ResNet-50's layers get a plan on an H100 as cuDNN's
  // device-property JSON describes one (what the GPU machines lent so far were): engines exist
  // for every type, alignment and mode the backend asks for, within the workspace cap. The plans
  // run only on a GPU (the test after this suite).
  TEST_CASE_TEMPLATE("cuda: cuDNN builds a weight-gradient plan of every geometry for an H100", T,
                     float, dropit::half, bfloat16) {
    namespace dc = dropit::detail::cuda;
    const std::string h100 =
        R"({"maxGridSize":[2147483647,65535,65535],"maxBlockSize":[1024,1024,64],)"
        R"("regsPerBlock":65536,"multiProcessorCount":132,"warpSize":32,)"
        R"("maxSharedMemoryPerBlock":49152,"maxSharedMemoryPerBlockOptin":232448,)"
        R"("reservedSharedMemoryPerBlock":1024,"maxRegistersPerSM":65536,"maxCtasPerSM":32,)"
        R"("maxThreadsPerBlock":1024,"maxThreadsPerSM":2048,"pciDeviceId":0,"isTccDriver":0,)"
        R"("supportCoopLaunch":1,"totalGlobalMem":85520809984,"smClockRateKHz":1980000,)"
        R"("memClockRateKHz":2619000,"l2CacheSize":52428800,"cudaDeviceId":0,)"
        R"("deviceVer":900,"driverVer":13000,"deviceName":"NVIDIA H100 80GB HBM3"})";
    const auto described = [&] {
      auto device = std::make_unique<dc::cudnn_descriptor>(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR,
                                                           "described H100");
      device
          ->set(CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, h100.data(),
                static_cast<std::int64_t>(h100.size()))
          .finalize();
      return device;
    };
    for (const ref::conv_shape& s : cudnn_shapes())
      for (const bool allow_tf32 : {false, true})
        for (const bool aligned : {true, false})
          for (const bool accumulate : {false, true}) {
            if (allow_tf32 && !std::is_same_v<T, float>) continue;  // the same problem
            const std::string geometry = s.text();
            CAPTURE(geometry);
            CAPTURE(allow_tf32);
            CAPTURE(aligned);
            CAPTURE(accumulate);
            const auto problem =
                dc::make_cudnn_wgrad_problem<T>(geometry_of(s), aligned, accumulate, allow_tf32);
            const auto plan = dc::find_cudnn_wgrad_plan(problem, described());
            REQUIRE(plan != nullptr);
            CHECK(plan->workspace_bytes <= dc::cudnn_workspace_cap(problem));
          }
  }

  TEST_CASE("cuda: cuDNN refuses a weight-gradient graph whose dY does not fit its geometry") {
    namespace dc = dropit::detail::cuda;
    const ref::conv_shape s = resnet50_layers().front();
    auto problem = dc::make_cudnn_wgrad_problem<float>(geometry_of(s), true, false, false);
    problem.dy[2] += 1;  // one output row too many for 56 rows, a 3x3 kernel and padding 1
    CHECK_ERROR(dc::cudnn_wgrad_graph{problem}, "cuDNN graph", "CUDNN_STATUS_BAD_PARAM");
  }

  TEST_CASE("cuda: cuDNN engines follow the TF32 setting and keep dW to summation order") {
    namespace dc = dropit::detail::cuda;
    const ref::conv_shape s = resnet50_layers().front();
    const auto problem = [&](auto type_tag, bool allow_tf32) {
      return dc::make_cudnn_wgrad_problem<decltype(type_tag)>(geometry_of(s), true, false,
                                                              allow_tf32);
    };
    const std::vector<cudnnBackendNumericalNote_t> tensor_cores{CUDNN_NUMERICAL_NOTE_TENSOR_CORE};
    CHECK_FALSE(dc::cudnn_engine_allowed(problem(0.0f, false), tensor_cores));
    CHECK(dc::cudnn_engine_allowed(problem(0.0f, true), tensor_cores));
    CHECK(dc::cudnn_engine_allowed(problem(bfloat16{}, false), tensor_cores));
    CHECK(dc::cudnn_engine_allowed(problem(0.0f, false), {}));
    CHECK(dc::cudnn_engine_allowed(problem(0.0f, false), {CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC}));
    for (const cudnnBackendNumericalNote_t note :
         {CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION,
          CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS, CUDNN_NUMERICAL_NOTE_FFT,
          CUDNN_NUMERICAL_NOTE_WINOGRAD, CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_4x4}) {
      CAPTURE(note);
      CHECK_FALSE(dc::cudnn_engine_allowed(problem(dropit::half{}, true), {note}));
    }
  }
}

// With a GPU: the gradient tests above that leave use_cudnn on ran through cuDNN, not the im2col
// path, for every geometry (all four plans were built: aligned and unaligned operands, overwriting
// and accumulating), as do ResNet-50's layers with and without TF32.
TEST_CASE_TEMPLATE("cuda: conv2d dW takes cuDNN's plans for the test grid and ResNet-50's layers",
                   T, float, dropit::half, bfloat16) {
  namespace dc = dropit::detail::cuda;
  for (const ref::conv_shape& s : cudnn_shapes())
    for (const bool allow_tf32 : {false, true}) {
      const std::string geometry = s.text();
      CAPTURE(geometry);
      CAPTURE(allow_tf32);
      CHECK(dc::cudnn_wgrad_plans_for<T>(geometry_of(s), allow_tf32) != nullptr);
    }
}

// dZ and dW one element into their buffers: the element-aligned plans, overwriting and
// accumulating, equal the dense formula.
TEST_CASE_TEMPLATE("cuda: conv2d dW from operands that are not 16-byte aligned", T, float,
                   dropit::half, bfloat16) {
  const ref::conv_shape& g = small_layer;
  const auto x = test::smooth_values<T>(g.x_numel(), 5);
  const auto dz = test::smooth_values<T>(g.dz_numel() + 1, 6);
  const dropit::shape x_shape{g.batch, g.in_channels, g.height, g.width};
  const dropit::shape dz_shape{g.batch, g.out_channels, g.out_h(), g.out_w()};
  const dropit::shape dw_shape{g.out_channels, g.in_channels, g.kernel_h, g.kernel_w};
  const auto c = compress(serial, policy<min_k_selection>{{0.5}}, test::view_of(x, x_shape));
  const std::vector<T> dz_used(dz.begin() + 1, dz.end());
  const auto want = ref::conv2d_dw(test::gradient_operand(c), test::as_float(dz_used), g);
  const auto tol = test::tolerance_for<T>();

  const cuda_backend gpu{};
  const auto cache = cuda_test::upload(c);
  const device_buffer<T> d_dz(dz);
  const auto scratch = cuda_test::device_workspace(
      conv2d_weight_grad_workspace_bytes<T>(gpu, c.layout(), dz_shape, dw_shape, g.params()));
  auto old = test::smooth_values<T>(g.dw_numel() + 1, 7);
  device_buffer<T> d_dw(old);
  conv2d_weight_grad<T>(gpu, cache.const_view(), {d_dz.data() + 1, dz_shape},
                        {d_dw.data() + 1, dw_shape}, g.params(), grad_mode::overwrite,
                        cuda_test::as_workspace(scratch));
  cuda_test::finish(gpu);
  const auto overwritten = d_dw.download();
  CHECK_GRADIENT(std::vector<T>(overwritten.begin() + 1, overwritten.end()), want, tol);

  d_dw.upload(old);
  conv2d_weight_grad<T>(gpu, cache.const_view(), {d_dz.data() + 1, dz_shape},
                        {d_dw.data() + 1, dw_shape}, g.params(), grad_mode::accumulate,
                        cuda_test::as_workspace(scratch));
  cuda_test::finish(gpu);
  const auto accumulated = d_dw.download();
  old.erase(old.begin());
  CHECK_GRADIENT(std::vector<T>(accumulated.begin() + 1, accumulated.end()), plus(want, old), tol);
}

// Float weight gradients on TF32 tensor cores where the backend allows them: within TF32's
// rounding of the dense formula (tf32_rounding, above).
TEST_CASE("cuda: conv2d dW with TF32 allowed stays within TF32's rounding") {
  std::uint64_t seed = 1;
  const cuda_backend tf32{.allow_tf32 = true};
  const auto grid = conv_grid();
  for (const ref::conv_shape& g : {small_layer, grid.front(), grid[grid.size() - 2]}) {
    const std::string geometry = g.text();
    CAPTURE(geometry);
    check_conv<float>(policy<chunked_min_k_selection>{{0.6, 1000}}, g, seed += 3, tf32,
                      tf32_rounding);
  }
}
#endif
