// Weight gradients from a cache must equal the dense formula applied to densify(cache) (float
// summation order aside; for rescaled random caches, to the kept values times n/k in float, before
// densify's rounding to the element type), for every policy, several shapes and a grid of
// convolution parameters; at gamma = 0 they must equal the dense gradient of the original input.

#include <numeric>

#include "helpers.hpp"

namespace {

using dropit::bfloat16;
using dropit::half;
using namespace dropit;

using test::serial;

std::int64_t product(const std::vector<std::int64_t>& dims, std::size_t first, std::size_t last) {
  return std::accumulate(dims.begin() + first, dims.begin() + last, std::int64_t{1},
                         std::multiplies<>());
}

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
  bool dz_keeps_leading_dims;  // dZ as [..., N] rather than [M, N]
};

const linear_case linear_cases[] = {
    {{1, 1}, 1, false},      {{7, 5}, 3, false},       {{64, 33}, 65, false},
    {{200, 48}, 64, false},  {{3, 4, 10}, 130, false}, {{3, 4, 10}, 70, true},
    {{2, 3, 5, 8}, 9, true}, {{130, 1}, 2, false},     {{17}, 5, false},
    {{0, 5}, 3, false},      {{4, 0}, 3, false},       {{4, 6}, 0, false}};

template <class T, class P>
void check_linear(const P& p, const linear_case& lc, std::uint64_t seed) {
  const std::int64_t k = lc.a_dims.back(), m = product(lc.a_dims, 0, lc.a_dims.size() - 1);
  const std::int64_t n = lc.out_features;
  std::vector<std::int64_t> dz_dims = {m, n};
  if (lc.dz_keeps_leading_dims) {
    dz_dims.assign(lc.a_dims.begin(), lc.a_dims.end() - 1);
    dz_dims.push_back(n);
  }
  const auto a = test::smooth_values<T>(m * k, seed);
  const auto dz = test::smooth_values<T>(m * n, seed + 1);
  const auto c = compress(serial, p, test::view_of(a, test::shape_of(lc.a_dims)));
  const auto want = ref::linear_dw(test::gradient_operand(c), test::as_float(dz), m, k, n);
  const auto tol = test::tolerance_for<T>();

  std::vector<T> dw(static_cast<std::size_t>(n * k), test::make<T>(123.0));  // must be replaced
  linear_weight_grad<T>(serial, c.view(), test::view_of(dz, test::shape_of(dz_dims)),
                        test::view_of(dw, {n, k}));
  CHECK_GRADIENT(dw, want, tol);

  const auto old = test::smooth_values<T>(n * k, seed + 2);
  dw = old;
  linear_weight_grad<T>(serial, c.view(), test::view_of(dz, test::shape_of(dz_dims)),
                        test::view_of(dw, {n, k}), grad_mode::accumulate);
  CHECK_GRADIENT(dw, plus(want, old), tol);

  if (c.layout().gamma == 0.0) {  // nothing dropped: the dense gradient of the input itself
    linear_weight_grad<T>(serial, c.view(), test::view_of(dz, test::shape_of(dz_dims)),
                          test::view_of(dw, {n, k}));
    CHECK_GRADIENT(dw, ref::linear_dw(a, dz, m, k, n), tol);
  }
}

// The convolution grid: every stride x padding x dilation x groups x kernel combination.
std::vector<ref::conv_shape> conv_grid() {
  std::vector<ref::conv_shape> grid;
  const std::int64_t kernels[][2] = {{1, 1}, {3, 3}, {5, 5}, {3, 2}, {1, 3}};
  for (std::int64_t stride : {1, 2, 3})
    for (std::int64_t pad : {0, 1, 2})
      for (std::int64_t dilation : {1, 2})
        for (std::int64_t groups : {1, 2, 4, 8})  // 8 = depthwise
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
            grid.push_back(g);
          }
  return grid;
}

dropit::shape dw_shape(const ref::conv_shape& g) {
  return {g.out_channels, g.in_channels / g.groups, g.kernel_h, g.kernel_w};
}

template <class T, class P>
void check_conv(const P& p, const ref::conv_shape& g, std::uint64_t seed) {
  const auto x = test::smooth_values<T>(g.x_numel(), seed);
  const auto dz = test::smooth_values<T>(g.dz_numel(), seed + 1);
  const dropit::shape x_shape{g.batch, g.in_channels, g.height, g.width};
  const dropit::shape dz_shape{g.batch, g.out_channels, g.out_h(), g.out_w()};
  const auto c = compress(serial, p, test::view_of(x, x_shape));
  const auto want = ref::conv2d_dw(test::gradient_operand(c), test::as_float(dz), g);
  const auto tol = test::tolerance_for<T>();

  std::vector<T> dw(static_cast<std::size_t>(g.dw_numel()), test::make<T>(-7.0));
  conv2d_weight_grad<T>(serial, c.view(), test::view_of(dz, dz_shape),
                        test::view_of(dw, dw_shape(g)), g.params());
  CHECK_GRADIENT(dw, want, tol);

  const auto old = test::smooth_values<T>(g.dw_numel(), seed + 2);
  dw = old;
  conv2d_weight_grad<T>(serial, c.view(), test::view_of(dz, dz_shape),
                        test::view_of(dw, dw_shape(g)), g.params(), grad_mode::accumulate);
  CHECK_GRADIENT(dw, plus(want, old), tol);

  if (c.layout().gamma == 0.0) {
    conv2d_weight_grad<T>(serial, c.view(), test::view_of(dz, dz_shape),
                          test::view_of(dw, dw_shape(g)), g.params());
    CHECK_GRADIENT(dw, ref::conv2d_dw(x, dz, g), tol);
  }
}

// Calls f with the `which`-th policy of test::for_each_policy (of 8), so a grid can rotate
// through them.
template <class F>
void with_policy(int which, double gamma, int axis, F&& f) {
  int index = 0;
  test::for_each_policy(gamma, axis, [&](const auto& p, const char* name) {
    if (index++ % 8 == which % 8) f(p, name);
  });
}

}  // namespace

TEST_CASE_TEMPLATE("linear dW equals dZ^T densify(cache) for every policy and shape", T, float,
                   half, bfloat16) {
  std::uint64_t seed = 1;
  for (const linear_case& lc : linear_cases)
    for (double gamma : {0.0, 0.7}) {
      CAPTURE(lc.a_dims.size());
      CAPTURE(lc.out_features);
      CAPTURE(gamma);
      test::for_each_policy(gamma, -1, [&](const auto& p, const char* name) {
        CAPTURE(name);
        check_linear<T>(p, lc, seed += 3);
      });
    }
}

TEST_CASE("conv2d dW equals the direct sum over densify(cache) on the parameter grid") {
  const auto grid = conv_grid();
  int valid = 0, combo = 0;
  for (const ref::conv_shape& g : grid) {
    ++combo;
    const std::string geometry = g.text();
    CAPTURE(geometry);
    if (g.out_h() <= 0 || g.out_w() <= 0) {  // e.g. a dilated 5x5 kernel over width 7, no padding
      const auto x = test::smooth_values<float>(g.x_numel(), 1);
      const auto c = compress(serial, policy<min_k_selection>{{0.5}},
                              test::view_of(x, {g.batch, g.in_channels, g.height, g.width}));
      std::vector<float> dz(g.batch * g.out_channels), dw(g.dw_numel());
      CHECK_ERROR(conv2d_weight_grad<float>(serial, c.view(),
                                            test::view_of(dz, {g.batch, g.out_channels, 1, 1}),
                                            test::view_of(dw, dw_shape(g)), g.params()),
                  "output", "<= 0");
      continue;
    }
    ++valid;
    with_policy(combo, 0.6, 1, [&](const auto& p, const char* name) {
      CAPTURE(name);
      check_conv<float>(p, g, static_cast<std::uint64_t>(combo) * 10);
    });
    check_conv<float>(policy<chunked_min_k_selection>{{0.0, 100}}, g, combo * 10 + 5);
  }
  CHECK(valid > 300);  // the grid really exercises the kernel, not just the error path
}

TEST_CASE_TEMPLATE("conv2d dW in 16-bit types", T, half, bfloat16) {
  const auto grid = conv_grid();
  for (std::size_t combo = 0; combo < grid.size(); combo += 7) {
    const ref::conv_shape& g = grid[combo];
    if (g.out_h() <= 0 || g.out_w() <= 0) continue;
    CAPTURE(combo);
    with_policy(static_cast<int>(combo / 7), 0.6, 1, [&](const auto& p, const char* name) {
      CAPTURE(name);
      check_conv<T>(p, g, combo);
    });
  }
}

TEST_CASE("conv2d dW: asymmetric parameters, depthwise multipliers, odd shapes") {
  std::vector<ref::conv_shape> cases;
  // Non-square stride / padding / dilation and a non-square input.
  cases.push_back({.batch = 3,
                   .in_channels = 6,
                   .height = 11,
                   .width = 8,
                   .out_channels = 4,
                   .kernel_h = 3,
                   .kernel_w = 2,
                   .stride_h = 1,
                   .stride_w = 2,
                   .pad_h = 2,
                   .pad_w = 0,
                   .dilation_h = 2,
                   .dilation_w = 1,
                   .groups = 2});
  // Depthwise with a channel multiplier of 2.
  cases.push_back({.batch = 2,
                   .in_channels = 4,
                   .height = 6,
                   .width = 6,
                   .out_channels = 8,
                   .kernel_h = 3,
                   .kernel_w = 3,
                   .stride_h = 2,
                   .stride_w = 1,
                   .pad_h = 1,
                   .pad_w = 1,
                   .groups = 4});
  // Kernel larger than the input, made valid by padding; a 1x1 input.
  cases.push_back({.batch = 1,
                   .in_channels = 2,
                   .height = 2,
                   .width = 3,
                   .out_channels = 3,
                   .kernel_h = 5,
                   .kernel_w = 4,
                   .pad_h = 2,
                   .pad_w = 1});
  cases.push_back({.batch = 4,
                   .in_channels = 3,
                   .height = 1,
                   .width = 1,
                   .out_channels = 5,
                   .kernel_h = 1,
                   .kernel_w = 1});
  // Larger, ResNet-like; and an empty batch (the gradient is zero).
  cases.push_back({.batch = 2,
                   .in_channels = 16,
                   .height = 16,
                   .width = 16,
                   .out_channels = 16,
                   .kernel_h = 3,
                   .kernel_w = 3,
                   .pad_h = 1,
                   .pad_w = 1});
  // One sample's dZ (40 x 48 pixels x 40 channels in float, 300 KiB) is more than a tile of the
  // CPU kernel, so the batch is walked in several tiles.
  cases.push_back({.batch = 3,
                   .in_channels = 3,
                   .height = 40,
                   .width = 48,
                   .out_channels = 40,
                   .kernel_h = 3,
                   .kernel_w = 3,
                   .pad_h = 1,
                   .pad_w = 1});
  CHECK(cases.back().out_h() * cases.back().out_w() * cases.back().out_channels *
            std::int64_t{sizeof(float)} >
        dropit::detail::cpu::conv2d_dz_tile_bytes);
  cases.push_back({.batch = 0,
                   .in_channels = 4,
                   .height = 5,
                   .width = 5,
                   .out_channels = 2,
                   .kernel_h = 3,
                   .kernel_w = 3});
  for (std::size_t i = 0; i < cases.size(); ++i) {
    CAPTURE(i);
    for (double gamma : {0.0, 0.8})
      test::for_each_policy(gamma, 1, [&](const auto& p, const char* name) {
        CAPTURE(name);
        check_conv<float>(p, cases[i], i * 100);
      });
  }
}

TEST_CASE_TEMPLATE("rescaled random: gradients use n/k times the kept value, unrounded", T, float,
                   half, bfloat16) {
  // n/k = 10/3 has no short binary expansion: rounding the scaled values to a 16-bit type (as
  // densify must) changes them by up to 2^-9 relative, far outside the summation tolerance. The
  // contract: densify rounds the float product once; the gradients use it unrounded.
  const std::int64_t m = 30, k = 7, n = 5;
  const std::vector<T> a = test::smooth_values<T>(m * k, 3);
  const std::vector<T> dz = test::smooth_values<T>(m * n, 4);
  for (const bool channels : {false, true}) {
    CAPTURE(channels);
    const random_selection s{.gamma = 0.7, .seed = 2, .chunk_size = 10, .rescale = true};
    const auto c = channels ? compress(serial, policy<random_selection, channel_granularity>{s, {-1}},
                                       test::view_of(a, {m, k}))
                            : compress(serial, policy<random_selection>{s}, test::view_of(a, {m, k}));
    const std::vector<float> operand = test::gradient_operand(c);
    const std::vector<T> dense = densify(serial, c);
    for (std::size_t i = 0; i < a.size(); ++i)
      CHECK(dropit::bits_of(dense[i]) == dropit::bits_of(dropit::from_float<T>(operand[i])));

    std::vector<T> dw(static_cast<std::size_t>(n * k));
    linear_weight_grad<T>(serial, c.view(), test::view_of(dz, {m, n}), test::view_of(dw, {n, k}));
    CHECK_GRADIENT(dw, ref::linear_dw(operand, test::as_float(dz), m, k, n),
                   test::tolerance_for<T>());
  }
}
