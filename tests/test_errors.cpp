// Bad input: every case throws dropit::error whose message names the offending value.

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "helpers.hpp"

namespace {

using dropit::bfloat16;
using dropit::half;
using namespace dropit;

using test::serial;

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

// ---------------------------------------------------------------------------------------------
// The table of bad inputs at the C++ entry points: one row per input, each must raise a
// dropit::error naming the value.

namespace {

struct bad_input {
  std::string what;
  std::function<void()> call;
  std::vector<std::string> named;  // what the message must contain
};

void check_table(const std::vector<bad_input>& table) {
  for (const bad_input& row : table) {
    CAPTURE(row.what);
    const std::string message = test::error_message(row.call);
    INFO("message: ", message);
    CHECK_MESSAGE(message.rfind("dropit: ", 0) == 0, "expected a dropit::error");
    for (const std::string& needle : row.named)
      CHECK_MESSAGE(message.find(needle) != std::string::npos, "message should name '", needle, "'");
  }
}

}  // namespace

TEST_CASE("bad input table: the C++ core") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::int64_t two31 = std::int64_t{1} << 31, two32 = std::int64_t{1} << 32,
                     two40 = std::int64_t{1} << 40, two62 = std::int64_t{1} << 62;
  // A linear input [6, 4] and its gradient operands dZ [6, 3], dW [3, 4].
  const std::vector<float> a(6 * 4, 1.0f), dz(6 * 3, 1.0f);
  std::vector<float> dw(3 * 4), big(64 * 64);
  const auto c = compress(serial, policy<min_k_selection>{{0.5}}, test::view_of(a, {6, 4}));
  // A conv2d input [2, 4, 5, 5] with dZ [2, 6, 3, 3] and dW [6, 4, 3, 3] (3x3, stride 1).
  const std::vector<float> x(2 * 4 * 5 * 5, 1.0f), conv_dz(2 * 6 * 5 * 5, 1.0f);
  std::vector<float> conv_dw(6 * 4 * 7 * 7);
  const auto xc = compress(serial, policy<min_k_selection>{{0.5}}, test::view_of(x, {2, 4, 5, 5}));
  const auto conv = [&](dropit::shape zs, dropit::shape ws, conv2d_params p = {}) {
    conv2d_weight_grad<float>(serial, xc.view(), test::view_of(conv_dz, zs),
                              test::view_of(conv_dw, ws), p);
  };
  const auto with = [](auto change) {
    conv2d_params p;
    change(p);
    return p;
  };
  const auto linear = [&](dropit::tensor_view<const float> z, dropit::tensor_view<float> w) {
    linear_weight_grad<float>(serial, c.view(), z, w);
  };
  // Expert compress into planned buffers with a workspace of `bytes`.
  const cache_layout planned = plan_cache<float>(policy<random_selection>{{.gamma = 0.5}}, {6, 4});
  std::vector<float> values(static_cast<std::size_t>(planned.kept()));
  std::vector<std::byte> memory(compress_workspace_bytes<float>(serial, planned));
  const auto compress_with = [&](const float* input, float* v, std::size_t bytes,
                                 dropit::shape s = {6, 4}) {
    compress<float>(serial, {input, s}, cache_view<float>{planned, v, nullptr},
                    workspace(memory.data(), bytes));
  };
  dropit::shape rank9;
  rank9.rank = 9;
  dropit::shape negative;
  negative.rank = 2;
  negative.extents = {3, -4};

  std::vector<bad_input> table{
      // Drop rate and chunk size.
      {"gamma NaN", [&] { plan_cache<float>(policy<chunked_min_k_selection>{{nan, 16}}, {8}); },
       {"gamma = nan", "[0, 1)"}},
      {"gamma negative", [&] { plan_cache<float>(policy<min_k_selection>{{-0.25}}, {8}); },
       {"gamma = -0.25"}},
      {"gamma 1", [&] { plan_cache<half>(policy<random_selection>{{.gamma = 1.0}}, {8}); },
       {"gamma = 1"}},
      {"chunk size 0", [&] { plan_cache<float>(policy<chunked_min_k_selection>{{0.5, 0}}, {8}); },
       {"D = 0", "[1, 65536]"}},
      {"chunk size 65537",
       [&] { plan_cache<float>(policy<random_selection>{{.chunk_size = 65537}}, {8}); },
       {"D = 65537"}},
      // Shapes and element types that disagree between the cache, dZ and dW.
      {"compress input of another shape",
       [&] { compress_with(a.data(), values.data(), memory.size(), {4, 6}); }, {"[4, 6]", "[6, 4]"}},
      {"densify output of another shape",
       [&] { densify<float>(serial, c.view(), test::view_of(big, {5, 4}), {}); }, {"[5, 4]", "[6, 4]"}},
      {"cache read as another element type",
       [&] {
         const cache_view<const half> as_half{c.layout(),
                                              reinterpret_cast<const half*>(c.values().data()),
                                              c.view().positions};
         densify(serial, as_half);
       },
       {"float32", "float16"}},
      {"dZ rows differ from the cache's", [&] { linear(test::view_of(dz, {5, 3}), test::view_of(dw, {3, 4})); },
       {"[5, 3]", "6 rows"}},
      {"dW of another shape", [&] { linear(test::view_of(dz, {6, 3}), test::view_of(big, {4, 3})); },
       {"[4, 3]", "[3, 4]"}},
      {"conv2d dZ of another shape", [&] { conv({2, 6, 4, 4}, {6, 4, 3, 3}); },
       {"[2, 6, 4, 4]", "[2, 6, 3, 3]"}},
      {"conv2d dW with the wrong input channels", [&] { conv({2, 6, 3, 3}, {6, 3, 3, 3}); },
       {"[6, 3, 3, 3]", "C_in/groups = 4"}},
      // Wrong rank.
      {"conv2d input of rank 2",
       [&] {
         conv2d_weight_grad<float>(serial, c.view(), test::view_of(conv_dz, {2, 6, 3, 3}),
                                   test::view_of(conv_dw, {6, 4, 3, 3}), conv2d_params{});
       },
       {"[N, C_in, H, W]", "[6, 4]"}},
      {"conv2d dZ of rank 3", [&] { conv({2, 6, 9}, {6, 4, 3, 3}); }, {"[2, 6, 9]"}},
      {"linear dZ of rank 0", [&] { linear(test::view_of(dz, {}), test::view_of(dw, {3, 4})); },
       {"dZ", "rank >= 1"}},
      // Convolution parameters.
      {"zero stride", [&] { conv({2, 6, 3, 3}, {6, 4, 3, 3}, with([](auto& p) { p.stride[1] = 0; })); },
       {"stride 0"}},
      {"groups not dividing the channels",
       [&] { conv({2, 6, 3, 3}, {6, 1, 3, 3}, with([](auto& p) { p.groups = 3; })); },
       {"groups 3", "input channels 4"}},
      {"output size <= 0", [&] { conv({2, 6, 1, 1}, {6, 4, 7, 7}); }, {"output height", "kernel 7"}},
      {"padding whose doubling overflows",
       [&] { conv({2, 6, 3, 3}, {6, 4, 3, 3}, with([&](auto& p) { p.padding[0] = two62; })); },
       {"padding", "overflows", std::to_string(two62)}},
      {"dilation whose reach overflows",
       [&] { conv({2, 6, 3, 3}, {6, 4, 3, 3}, with([&](auto& p) { p.dilation[1] = two62; })); },
       {"dilated kernel width", "overflows", std::to_string(two62)}},
      // Null and short buffers.
      {"null compress input", [&] { compress_with(nullptr, values.data(), memory.size()); },
       {"compress input", "null", "24 elements"}},
      {"null cache values", [&] { compress_with(a.data(), nullptr, memory.size()); },
       {"values", "null", std::to_string(planned.kept())}},
      {"null dZ", [&] { linear({nullptr, {6, 3}}, test::view_of(dw, {3, 4})); },
       {"dZ", "null", "18 elements"}},
      {"null dW", [&] { linear(test::view_of(dz, {6, 3}), {nullptr, {3, 4}}); },
       {"dW", "null", "12 elements"}},
      {"short compress workspace", [&] { compress_with(a.data(), values.data(), memory.size() - 1); },
       {"compress", std::to_string(memory.size() - 1), std::to_string(memory.size())}},
      {"short linear workspace",
       [&] {
         linear_weight_grad<float>(serial, c.view(), test::view_of(dz, {6, 3}),
                                   test::view_of(dw, {3, 4}), grad_mode::overwrite,
                                   workspace(memory.data(), 1));
       },
       {"linear_weight_grad", "workspace of 1 bytes"}},
      // Element counts that overflow, and shapes built by hand.
      {"2^32 x 2^32 elements", [&] { dropit::shape({two32, two32}); },
       {"[4294967296, 4294967296]", "overflows"}},
      {"2^40 x 2^40 plan",
       [&] { plan_cache<float>(policy<chunked_min_k_selection>{}, dropit::shape{two40, two40}); },
       {"[1099511627776, 1099511627776]", "overflows"}},
      {"2^31 x 2^31 x 2^31 shape", [&] { dropit::shape({two31, two31, two31}); },
       {"[2147483648, 2147483648]", "more than the 1152921504606846975 elements"}},
      {"2^63 elements", [&] { dropit::shape({2, two62}); }, {"[2, 4611686018427387904]", "overflows"}},
      {"conv2d dZ with 2^62 output channels", [&] { conv({2, two62, 3, 3}, {6, 4, 3, 3}); },
       {std::to_string(two62)}},
      {"dW of 2^40 x 2^40", [&] { linear(test::view_of(dz, {6, 3}), {dw.data(), {two40, two40}}); },
       {"overflows"}},
      {"conv2d workspace that overflows",
       [&] {
         const auto layout = plan_cache<float>(policy<chunked_min_k_selection>{}, {1, 1, two40, 1});
         conv2d_weight_grad_workspace_bytes<float>(serial, layout, {1, 1, 1, 1}, {1, 1, two40, 1},
                                                   conv2d_params{});
       },
       {"workspace size overflows"}},
      {"view of rank 9", [&] { densify<float>(serial, c.view(), {big.data(), rank9}, {}); },
       {"densify output rank 9", "[0, 8]"}},
      {"view with a negative extent", [&] { linear({dz.data(), negative}, test::view_of(dw, {3, 4})); },
       {"dZ extent -4", "dimension 1"}},
  };
#if defined(__SANITIZE_ADDRESS__)
  MESSAGE("skipped under AddressSanitizer, which aborts on allocations it cannot serve: a "
          "planned cache too large to allocate");
#else
  table.push_back({"a planned cache too large to allocate",
                   [&] {
                     dropit::cache<float>(plan_cache<float>(policy<random_selection>{{.gamma = 0.5}},
                                                            {two40, 1024}));
                   },
                   {"cannot allocate cache values", std::to_string(two40 * 512)}});
#endif
  check_table(table);
}

TEST_CASE("bad input table: cache layouts built or changed by hand") {
  // Valid caches of each encoding; each row changes one field of one of their layouts and reads
  // the cache through it. Every reader validates the whole layout first.
  const std::vector<float> x(4 * 6 * 5, 1.5f);
  const auto chunked =
      compress(serial, policy<chunked_min_k_selection>{{0.95, 16}}, test::view_of(x, {4, 6, 5}));
  const auto channels = compress(serial, policy<min_k_selection, channel_granularity>{{0.5}, {1}},
                                 test::view_of(x, {4, 6, 5}));
  const auto seeded =
      compress(serial, policy<random_selection>{{.gamma = 0.5, .chunk_size = 8}}, test::view_of(x, {120}));
  REQUIRE(chunked.layout().encoding == position_encoding::offsets);
  std::vector<float> out(x.size());
  // The cache is read through its own layout first: a layout just found valid must not be taken
  // for the changed one (validation remembers the last few valid layouts).
  const auto read_with = [&](const dropit::cache<float>& c, auto change) {
    (void)densify(serial, c.view());
    cache_layout layout = c.layout();
    change(layout);
    densify(serial, cache_view<const float>{layout, c.view().values, c.view().positions});
  };
  check_table({
      {"kept per chunk larger than the chunk",
       [&] { read_with(chunked, [](cache_layout& l) { l.kept_per_chunk = 17; }); },
       {"kept_per_chunk is 17", "has 1"}},
      {"kept per tail changed", [&] { read_with(chunked, [](cache_layout& l) { l.kept_per_tail = 0; }); },
       {"kept_per_tail is 0", "has 1"}},
      {"unknown encoding",
       [&] { read_with(chunked, [](cache_layout& l) { l.encoding = position_encoding{7}; }); },
       {"encoding 7", "unknown"}},
      {"unknown selection",
       [&] { read_with(chunked, [](cache_layout& l) { l.selection = selection_kind{5}; }); },
       {"selection 5", "unknown"}},
      {"unknown element type",
       [&] { read_with(chunked, [](cache_layout& l) { l.type = element_type{9}; }); },
       {"element type 9", "unknown"}},
      {"channel layout with a bitmask encoding",
       [&] { read_with(channels, [](cache_layout& l) { l.encoding = position_encoding::bitmask; }); },
       {"encoding is 0", "has 3"}},
      {"more kept channels than channels",
       [&] { read_with(channels, [](cache_layout& l) { l.kept_channels = 7; }); },
       {"kept_channels is 7", "has 3"}},
      {"offsets of 3 bytes", [&] { read_with(chunked, [](cache_layout& l) { l.offset_bytes = 3; }); },
       {"offset_bytes is 3", "has 2"}},
      {"channel axis beyond the rank",
       [&] { read_with(channels, [](cache_layout& l) { l.channel_axis = 5; }); },
       {"axis 5", "rank 3"}},
      {"layout shape of rank 9", [&] { read_with(chunked, [](cache_layout& l) { l.shape.rank = 9; }); },
       {"cache layout rank 9"}},
      {"layout of another tensor (shape changed)",
       [&] { read_with(chunked, [](cache_layout& l) { l.shape.extents[2] = 4; }); },
       {"kept_per_tail"}},
      {"chunk size 0 in a random layout",
       [&] { read_with(seeded, [](cache_layout& l) { l.chunk_size = 0; }); }, {"D = 0"}},
      {"gamma NaN in a layout",
       [&] { read_with(seeded, [](cache_layout& l) { l.gamma = std::nan(""); }); }, {"gamma = nan"}},
      {"min-k layout that rescales",
       [&] { read_with(channels, [](cache_layout& l) { l.rescale = true; }); },
       {"rescale is 1", "has 0"}},
  });
}

TEST_CASE("bad input table: stored positions that do not match their layout") {
  // Offsets (gamma 0.9: 2 per chunk), a bitmask (gamma 0.5) and a channel list over [4, 6, 5]: 7
  // chunks of 16 and a tail of 8. Each row corrupts a copy of the stored positions; every reader
  // refuses them.
  const std::vector<float> x = test::smooth_values<float>(4 * 6 * 5, 5);
  const auto offsets =
      compress(serial, policy<chunked_min_k_selection>{{0.9, 16}}, test::view_of(x, {4, 6, 5}));
  const auto bitmask =
      compress(serial, policy<chunked_min_k_selection>{{0.5, 16}}, test::view_of(x, {4, 6, 5}));
  const auto channels = compress(serial, policy<min_k_selection, channel_granularity>{{0.5}, {1}},
                                 test::view_of(x, {4, 6, 5}));
  REQUIRE(offsets.layout().encoding == position_encoding::offsets);
  REQUIRE(bitmask.layout().encoding == position_encoding::bitmask);
  std::vector<float> dz(4 * 6 * 2), dw(2 * 5);
  const auto corrupt = [&](const dropit::cache<float>& c, auto change, bool gradient) {
    std::vector<std::uint32_t> words((c.layout().position_bytes() + 3) / 4);
    std::memcpy(words.data(), c.view().positions, c.layout().position_bytes());
    change(words);
    const cache_view<const float> view{c.layout(), c.view().values, words.data()};
    if (gradient)
      linear_weight_grad<float>(serial, view, test::view_of(dz, {24, 2}), test::view_of(dw, {2, 5}));
    else
      densify(serial, view);
  };
  const auto set_offset = [](std::size_t j, std::uint16_t value) {
    return [=](std::vector<std::uint32_t>& w) {
      std::memcpy(reinterpret_cast<unsigned char*>(w.data()) + 2 * j, &value, 2);
    };
  };
  check_table({
      {"offset beyond its chunk", [&] { corrupt(offsets, set_offset(0, 16), false); },
       {"chunk 0", "below the chunk length 16"}},
      {"offsets out of order",
       [&] { corrupt(offsets, set_offset(1, 0), true); }, {"chunk 0", "ascending"}},
      {"bitmask bit beyond the tail",
       [&] { corrupt(bitmask, [](auto& w) { w[7] |= 1u << 9; }, false); },
       {"chunk 7", "chunk length 8"}},
      {"bitmask with a bit too few",
       [&] { corrupt(bitmask, [](auto& w) { w[2] &= w[2] - 1; }, true); }, {"chunk 2", "expected 8"}},
      {"channel list beyond the channels",
       [&] { corrupt(channels, [](auto& w) { w[2] = 6; }, false); }, {"channel 6", "below 6"}},
      {"channel list out of order",
       [&] { corrupt(channels, [](auto& w) { std::swap(w[0], w[1]); }, true); }, {"ascending"}},
  });
}

TEST_CASE("bad input: the one-chunk bitmask of min-k over a whole tensor, read by two threads") {
  // 40 001 elements: 1 251 mask words in three blocks, split into two runs (with OpenMP); one
  // element in the last word. A corrupt mask is refused before any value is read by it (which the
  // sanitized build would report).
  const std::int64_t n = 40001;
  const std::vector<float> x = test::smooth_values<float>(n, 9);
  const auto c = compress(serial, policy<min_k_selection>{{0.5}}, test::view_of(x, {n}));
  REQUIRE(c.layout().encoding == position_encoding::bitmask);
  REQUIRE(c.layout().chunk_count() == 1);
  const std::string kept = std::to_string(c.layout().kept());
  const auto* stored = static_cast<const std::uint32_t*>(c.view().positions);
  REQUIRE(stored[1000] != ~0u);  // a bit to add
  REQUIRE(stored[1100] != 0u);   // a bit to remove
  const auto densify_corrupted = [&](auto change) {
    std::vector<std::uint32_t> words((c.layout().position_bytes() + 3) / 4);
    std::memcpy(words.data(), c.view().positions, c.layout().position_bytes());
    change(words);
    densify(cpu_backend{2}, cache_view<const float>{c.layout(), c.view().values, words.data()});
  };
  CHECK_ERROR(densify_corrupted([](auto& w) { w[1000] |= ~w[1000] & (0u - ~w[1000]); }), "chunk 0",
              "expected " + kept);
  CHECK_ERROR(densify_corrupted([](auto& w) { w[1100] &= w[1100] - 1; }), "chunk 0",
              "expected " + kept);
  CHECK_ERROR(densify_corrupted([](auto& w) { w[1250] |= 1u << 5; }), "chunk 0",
              "chunk length 40001");
}

TEST_CASE_TEMPLATE("channel granularity over extents that multiply to zero keeps nothing", T, float,
                   half, bfloat16) {
  // [2, 3, 0]: no elements after the channel axis, so no buffer holds anything (they may be null).
  for (const dropit::shape& s : {dropit::shape{2, 3, 0}, dropit::shape{0, 3, 2}}) {
    CAPTURE(s);
    const std::vector<T> none;
    const auto min_k = compress(serial, policy<min_k_selection, channel_granularity>{{0.5}, {1}},
                                tensor_view<const T>{none.data(), s});
    const auto random =
        compress(serial, policy<random_selection, channel_granularity>{{.gamma = 0.5}, {1}},
                 tensor_view<const T>{none.data(), s});
    CHECK(min_k.layout().kept() == 0);
    CHECK(random.layout().kept() == 0);
    CHECK(densify(serial, min_k).empty());
    CHECK(densify(serial, random).empty());
  }
}
