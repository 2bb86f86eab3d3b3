// Bad input: every case throws dropit::error whose message names the offending value.

#include <cmath>
#include <limits>

#include "helpers.hpp"

namespace {

using dropit::bfloat16;
using dropit::half;
using namespace dropit;

const cpu_backend serial{1};

}  // namespace

TEST_CASE("gamma below 0, at or above 1, or NaN") {
  const dropit::shape s{100};
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (double gamma : {-0.1, 1.0, 1.5, nan}) {
    CAPTURE(gamma);
    const std::string named = std::isnan(gamma) ? "nan"
                              : gamma == -0.1   ? "-0.1"
                              : gamma == 1.0    ? "gamma = 1"
                                                : "1.5";
    CHECK_ERROR(plan_cache<float>(policy<min_k_selection>{{gamma}}, s), named, "[0, 1)");
    CHECK_ERROR(plan_cache<half>(policy<chunked_min_k_selection>{{gamma, 10}}, s), named);
    CHECK_ERROR(plan_cache<float>(policy<random_selection>{{.gamma = gamma}}, s), named);
    CHECK_ERROR(plan_cache<float>(policy<min_k_selection, channel_granularity>{{gamma}, {0}}, s),
                named);
    CHECK_ERROR(plan_cache<bfloat16>(
                    policy<random_selection, channel_granularity>{{.gamma = gamma}, {0}}, s),
                named);
    const std::vector<float> x(100, 1.0f);
    CHECK_ERROR(compress(serial, policy<min_k_selection>{{gamma}}, test::view_of(x, s)), named);
  }
}

TEST_CASE("chunk size below 1 or above 65536") {
  const dropit::shape s{100};
  for (std::int64_t d :
       {std::int64_t{0}, std::int64_t{-5}, std::int64_t{65537}, std::int64_t{1} << 40}) {
    CAPTURE(d);
    const std::string named = "D = " + std::to_string(d);
    CHECK_ERROR(plan_cache<float>(policy<chunked_min_k_selection>{{0.5, d}}, s), named, "65536");
    CHECK_ERROR(plan_cache<float>(policy<random_selection>{{.gamma = 0.5, .chunk_size = d}}, s),
                named);
  }
  // The bounds themselves are valid.
  CHECK_NOTHROW(plan_cache<float>(policy<chunked_min_k_selection>{{0.5, 1}}, s));
  CHECK_NOTHROW(plan_cache<float>(policy<chunked_min_k_selection>{{0.5, 65536}}, s));
}

TEST_CASE("shapes: negative extents, too many dimensions, channel axis out of range") {
  CHECK_ERROR(dropit::shape({2, -3}), "-3", "dimension 1");
  CHECK_ERROR(dropit::shape(std::vector<std::int64_t>{4, -1, 2}), "-1");
  CHECK_ERROR(dropit::shape({1, 1, 1, 1, 1, 1, 1, 1, 1}), "rank 9", "8");
  const dropit::shape s{4, 5};
  CHECK_ERROR(plan_cache<float>(policy<min_k_selection, channel_granularity>{{0.5}, {2}}, s),
              "axis 2", "rank 2");
  CHECK_ERROR(plan_cache<float>(policy<random_selection, channel_granularity>{{}, {-3}}, s),
              "axis -3");
  CHECK_ERROR(
      plan_cache<float>(policy<min_k_selection, channel_granularity>{{0.5}, {0}}, dropit::shape{}),
      "rank >= 1");
}

TEST_CASE("tensors larger than the index type can address") {
  // Planning allocates nothing, so these huge shapes cost nothing.
  const std::int64_t beyond = (std::int64_t{1} << 32) + 1;
  CHECK_ERROR(plan_cache<float>(policy<min_k_selection>{{0.9}}, {beyond}), "4294967297",
              "4294967295");
  CHECK_ERROR(plan_cache<half>(policy<min_k_selection>{{0.9}}, {65536, 65536}), "4294967296");
  CHECK_NOTHROW(plan_cache<float>(policy<min_k_selection>{{0.9}}, {beyond - 2}));
  CHECK_NOTHROW(plan_cache<float>(policy<chunked_min_k_selection>{{0.9}}, {beyond}));
  CHECK_ERROR(plan_cache<float>(policy<min_k_selection, channel_granularity>{{0.5}, {1}},
                                {1, std::int64_t{1} << 31, 1}),
              "2147483648");
}

TEST_CASE("linear: shapes of the cache, dZ and dW must agree") {
  const std::vector<float> a(6 * 4, 1.0f), dz(6 * 3, 1.0f), bad_dz(5 * 3, 1.0f);
  const auto c = compress(serial, policy<min_k_selection>{{0.5}}, test::view_of(a, {6, 4}));
  std::vector<float> dw(3 * 4), bad_dw(3 * 5);
  const auto grad = [&](const std::vector<float>& z, dropit::shape zs, std::vector<float>& w,
                        dropit::shape ws) {
    linear_weight_grad<float>(serial, c.view(), test::view_of(z, zs), test::view_of(w, ws));
  };
  CHECK_NOTHROW(grad(dz, {6, 3}, dw, {3, 4}));
  CHECK_ERROR(grad(bad_dz, {5, 3}, dw, {3, 4}), "[5, 3]", "6 rows");
  CHECK_ERROR(grad(dz, {6, 3}, bad_dw, {3, 5}), "[3, 5]", "[3, 4]");
  CHECK_ERROR(grad(dz, {6, 3}, bad_dw, {5, 3}), "[5, 3]", "[3, 4]");
  CHECK_ERROR(grad(dz, {6, 3}, dw, {12}), "[12]");
  CHECK_ERROR(grad(dz, {}, dw, {3, 4}), "dZ", "rank");
  // A rank-3 input [2, 3, 4]: dZ may be [6, 3] or keep the leading dims, [2, 3, 3].
  const auto c3 = compress(serial, policy<min_k_selection>{{0.5}}, test::view_of(a, {2, 3, 4}));
  CHECK_NOTHROW(linear_weight_grad<float>(serial, c3.view(), test::view_of(dz, {6, 3}),
                                          test::view_of(dw, {3, 4})));
  CHECK_NOTHROW(linear_weight_grad<float>(serial, c3.view(), test::view_of(dz, {2, 3, 3}),
                                          test::view_of(dw, {3, 4})));
  CHECK_ERROR(linear_weight_grad<float>(serial, c3.view(), test::view_of(bad_dz, {5, 3}),
                                        test::view_of(dw, {3, 4})),
              "[5, 3]", "[2, 3, 4]");
  // Leading dimensions that only multiply to M are a different layout, not a reshaped dZ.
  CHECK_ERROR(linear_weight_grad<float>(serial, c3.view(), test::view_of(dz, {3, 2, 3}),
                                        test::view_of(dw, {3, 4})),
              "[3, 2, 3]", "[2, 3, 4]");
  // A scalar (rank 0) input has no feature axis.
  const auto scalar = compress(serial, policy<min_k_selection>{{0.0}}, test::view_of(a, {}));
  CHECK_ERROR(linear_weight_grad<float>(serial, scalar.view(), test::view_of(dz, {1, 3}),
                                        test::view_of(dw, {3, 1})),
              "rank >= 1");
}

TEST_CASE("conv2d: shapes and parameters must be valid") {
  // X [2, 4, 5, 5], dW [6, 4, 3, 3] -> dZ [2, 6, 3, 3] with the default parameters.
  const std::vector<float> x(2 * 4 * 5 * 5, 1.0f), dz(2 * 6 * 5 * 5, 1.0f);
  const auto c = compress(serial, policy<min_k_selection>{{0.5}}, test::view_of(x, {2, 4, 5, 5}));
  std::vector<float> dw(6 * 4 * 7 * 7);
  const auto grad = [&](dropit::shape zs, dropit::shape ws, conv2d_params p = {}) {
    conv2d_weight_grad<float>(serial, c.view(), test::view_of(dz, zs), test::view_of(dw, ws), p);
  };
  CHECK_NOTHROW(grad({2, 6, 3, 3}, {6, 4, 3, 3}));
  CHECK_ERROR(grad({2, 6, 4, 4}, {6, 4, 3, 3}), "[2, 6, 4, 4]", "[2, 6, 3, 3]");
  CHECK_ERROR(grad({2, 6, 3, 3}, {6, 3, 3, 3}), "[6, 3, 3, 3]", "C_in/groups = 4");
  CHECK_ERROR(grad({2, 6, 9}, {6, 4, 3, 3}), "[2, 6, 9]");
  CHECK_ERROR(grad({2, 6, 3, 3}, {6, 4, 9}), "[6, 4, 9]");
  CHECK_ERROR(grad({2, 6, 3, 3}, {6, 4, 0, 3}), "kernel 0x3");

  conv2d_params p;
  p.stride[1] = 0;
  CHECK_ERROR(grad({2, 6, 3, 3}, {6, 4, 3, 3}, p), "stride 0");
  p = {};
  p.stride[0] = -2;
  CHECK_ERROR(grad({2, 6, 3, 3}, {6, 4, 3, 3}, p), "stride -2");
  p = {};
  p.padding[0] = -1;
  CHECK_ERROR(grad({2, 6, 3, 3}, {6, 4, 3, 3}, p), "padding -1");
  p = {};
  p.dilation[1] = 0;
  CHECK_ERROR(grad({2, 6, 3, 3}, {6, 4, 3, 3}, p), "dilation 0");
  p = {};
  p.groups = 0;
  CHECK_ERROR(grad({2, 6, 3, 3}, {6, 4, 3, 3}, p), "groups 0");
  p.groups = 3;  // does not divide C_in = 4
  CHECK_ERROR(grad({2, 6, 3, 3}, {6, 1, 3, 3}, p), "groups 3", "input channels 4");
  p.groups = 4;  // divides C_in = 4 but not C_out = 6
  CHECK_ERROR(grad({2, 6, 3, 3}, {6, 1, 3, 3}, p), "groups 4", "output channels 6");
  p = {};
  // Output size <= 0: a 7x7 kernel over 5x5, and a dilated 3x3 (span 5) over 5x5 with stride.
  CHECK_ERROR(grad({2, 6, 1, 1}, {6, 4, 7, 7}), "output", "kernel 7");
  p.dilation[0] = p.dilation[1] = 3;
  CHECK_ERROR(grad({2, 6, 1, 1}, {6, 4, 3, 3}, p), "output", "dilation 3");
  // The cached input must be [N, C, H, W].
  const auto flat = compress(serial, policy<min_k_selection>{{0.5}}, test::view_of(x, {8, 25}));
  CHECK_ERROR(conv2d_weight_grad<float>(serial, flat.view(), test::view_of(dz, {2, 6, 3, 3}),
                                        test::view_of(dw, {6, 4, 3, 3}), conv2d_params{}),
              "[8, 25]");
}

TEST_CASE("element type mismatch between a cache and its reader") {
  const std::vector<float> x(64, 1.0f);
  const auto c =
      compress(serial, policy<chunked_min_k_selection>{{0.5, 16}}, test::view_of(x, {8, 8}));
  // A float cache reinterpreted as half through a view built by hand.
  const cache_view<const half> as_half{c.layout(), reinterpret_cast<const half*>(c.values().data()),
                                       c.view().positions};
  std::vector<half> out(64), dz(8 * 2), dw(2 * 8);
  CHECK_ERROR(densify<half>(serial, as_half, test::view_of(out, {8, 8}), workspace{}), "float32",
              "float16");
  CHECK_ERROR(densify(serial, as_half), "float32", "float16");
  CHECK_ERROR(densify_workspace_bytes<half>(serial, c.layout()), "float32", "float16");
  CHECK_ERROR(compress_workspace_bytes<bfloat16>(serial, c.layout()), "float32", "bfloat16");
  CHECK_ERROR(linear_weight_grad<half>(serial, as_half, test::view_of(dz, {8, 2}),
                                       test::view_of(dw, {2, 8})),
              "float32", "float16");
  CHECK_ERROR(dropit::cache<half>(c.layout()), "float32", "float16");
  std::vector<half> values(static_cast<std::size_t>(c.layout().kept()));
  std::vector<std::uint32_t> positions(c.layout().position_bytes() / 4 + 1);
  const std::vector<half> hx(64);
  CHECK_ERROR(
      compress<half>(serial, test::view_of(hx, {8, 8}),
                     cache_view<half>{c.layout(), values.data(), positions.data()}, workspace{}),
      "float32", "float16");
  // A 4-D half cache read by conv2d as bfloat16.
  const std::vector<half> hx4(1 * 2 * 3 * 3);
  const auto hc =
      compress(serial, policy<min_k_selection>{{0.5}}, test::view_of(hx4, {1, 2, 3, 3}));
  const cache_view<const bfloat16> as_bf16{
      hc.layout(), reinterpret_cast<const bfloat16*>(hc.values().data()), hc.view().positions};
  std::vector<bfloat16> bdz(1 * 1 * 1 * 1), bdw(1 * 2 * 3 * 3);
  CHECK_ERROR(conv2d_weight_grad<bfloat16>(serial, as_bf16, test::view_of(bdz, {1, 1, 1, 1}),
                                           test::view_of(bdw, {1, 2, 3, 3}), conv2d_params{}),
              "float16", "bfloat16");
}

TEST_CASE("compress and densify: shape mismatches with the planned layout") {
  const std::vector<float> x(12, 1.0f);
  const cache_layout layout = plan_cache<float>(policy<min_k_selection>{{0.5}}, {10});
  std::vector<float> values(static_cast<std::size_t>(layout.kept()));
  std::vector<std::uint32_t> positions(4);
  const cache_view<float> out{layout, values.data(), positions.data()};
  std::vector<std::byte> memory(compress_workspace_bytes<float>(serial, layout));
  CHECK_ERROR(compress<float>(serial, test::view_of(x, {11}), out, memory), "[11]", "[10]");
  compress<float>(serial, test::view_of(x, {10}), out, memory);
  std::vector<float> dense(12);
  CHECK_ERROR(densify<float>(serial, out, test::view_of(dense, {3, 4}), workspace{}), "[3, 4]",
              "[10]");
}

TEST_CASE("null buffers") {
  const std::vector<float> x(100, 1.0f);
  const cache_layout layout = plan_cache<float>(policy<min_k_selection>{{0.5}}, {100});
  REQUIRE(layout.position_bytes() > 0);
  std::vector<float> values(static_cast<std::size_t>(layout.kept()));
  std::vector<std::uint32_t> positions((layout.position_bytes() + 3) / 4);
  std::vector<std::byte> memory(compress_workspace_bytes<float>(serial, layout));
  const auto compress_into = [&](const float* input, float* v, void* pos) {
    compress<float>(serial, {input, dropit::shape{100}}, cache_view<float>{layout, v, pos}, memory);
  };
  CHECK_ERROR(compress_into(nullptr, values.data(), positions.data()), "compress input", "null",
              "100 elements");
  CHECK_ERROR(compress_into(x.data(), nullptr, positions.data()), "values", "null",
              std::to_string(layout.kept()));
  CHECK_ERROR(compress_into(x.data(), values.data(), nullptr), "positions", "null",
              std::to_string(layout.position_bytes()));
  // A misaligned positions buffer is refused too.
  CHECK_ERROR(compress_into(x.data(), values.data(),
                            reinterpret_cast<unsigned char*>(positions.data()) + 1),
              "4-byte aligned");
  compress_into(x.data(), values.data(), positions.data());

  const cache_view<const float> c{layout, values.data(), positions.data()};
  CHECK_ERROR(densify<float>(serial, c, {nullptr, dropit::shape{100}}, workspace{}),
              "densify output", "null");
  std::vector<float> dense(100);
  CHECK_ERROR(densify<float>(serial, cache_view<const float>{layout, nullptr, positions.data()},
                             test::view_of(dense, {100}), workspace{}),
              "values", "null");

  const auto matrix = compress(serial, policy<min_k_selection>{{0.5}}, test::view_of(x, {20, 5}));
  std::vector<float> dz(20 * 3), dw(3 * 5);
  CHECK_ERROR(linear_weight_grad<float>(serial, matrix.view(), {nullptr, dropit::shape{20, 3}},
                                        test::view_of(dw, {3, 5})),
              "dZ", "null", "60 elements");
  CHECK_ERROR(linear_weight_grad<float>(serial, matrix.view(), test::view_of(dz, {20, 3}),
                                        {nullptr, dropit::shape{3, 5}}),
              "dW", "null", "15 elements");
  const auto image =
      compress(serial, policy<min_k_selection>{{0.5}}, test::view_of(x, {1, 4, 5, 5}));
  std::vector<float> conv_dw(2 * 4 * 3 * 3);
  CHECK_ERROR(conv2d_weight_grad<float>(serial, image.view(), {nullptr, dropit::shape{1, 2, 3, 3}},
                                        test::view_of(conv_dw, {2, 4, 3, 3}), conv2d_params{}),
              "dZ", "null");
}
