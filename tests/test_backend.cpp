// The CPU backend: results identical bit for bit whatever the thread count, and the expert
// overloads working in exactly the workspace their size queries report.

#include <chrono>
#include <mutex>
#include <set>
#include <thread>

#include <dropit/detail/common/index_walk.hpp>

#include "helpers.hpp"

namespace {

using dropit::bfloat16;
using dropit::half;
using namespace dropit;

// Compress, densify, linear dW and conv2d dW of one input on `backend`, as raw bits.
struct run_result {
  std::vector<std::uint32_t> values, dense, linear_dw, conv_dw;
  std::vector<unsigned char> positions;
};

template <class T, class P>
run_result run_everything(const cpu_backend& backend, const P& p, const std::vector<T>& x,
                          const std::vector<T>& dz_linear, const std::vector<T>& dz_conv) {
  // x is [6, 40, 12, 10]: NCHW for conv (40 -> 16 channels, 3x3, padding 1), [2880, 10] for linear.
  const auto c = compress(backend, p, test::view_of(x, {6, 40, 12, 10}));
  run_result r{test::bits_of(test::values_of(c)), test::bits_of(densify(backend, c)), {}, {}, {}};
  r.positions = test::position_bytes(c);
  std::vector<T> dw(20 * 10);
  linear_weight_grad<T>(backend, c.view(), test::view_of(dz_linear, {2880, 20}),
                        test::view_of(dw, {20, 10}));
  r.linear_dw = test::bits_of(dw);
  dw.assign(16 * 40 * 3 * 3, T{});
  conv2d_params params;
  params.padding[0] = params.padding[1] = 1;
  conv2d_weight_grad<T>(backend, c.view(), test::view_of(dz_conv, {6, 16, 12, 10}),
                        test::view_of(dw, {16, 40, 3, 3}), params);
  r.conv_dw = test::bits_of(dw);
  return r;
}

}  // namespace

TEST_CASE("the backend runs on the thread count it was given") {
#if defined(DROPIT_TESTS_EXPECT_OPENMP) && !defined(_OPENMP)
  FAIL("this test executable should be built with OpenMP");
#endif
  // The threads that really ran the items: their numbers and the size of their team. Each item
  // takes a millisecond, so that every thread of the team gets some.
  for (const int requested : {1, 3}) {
    CAPTURE(requested);
    std::mutex mutex;
    std::set<int> threads_seen;
    int team_size = 1;
    dropit::detail::cpu::parallel_for(cpu_backend{requested}, 48, [&](std::int64_t, int thread) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      const std::lock_guard<std::mutex> lock(mutex);
      threads_seen.insert(thread);
#if defined(_OPENMP)
      team_size = omp_get_num_threads();
#endif
    });
#if defined(_OPENMP)
    CHECK(team_size == requested);
    CHECK(threads_seen.size() == static_cast<std::size_t>(requested));
    CHECK(*threads_seen.rbegin() == requested - 1);
#else
    // Without OpenMP everything runs serially.
    CHECK(team_size == 1);
    CHECK(threads_seen == std::set<int>{0});
#endif
  }
}

TEST_CASE_TEMPLATE("results are identical bit for bit with 1, 2, 3 or 4 threads", T, float, half,
                   bfloat16) {
  const auto x = test::smooth_values<T>(6 * 40 * 12 * 10, 1);
  const auto dz_linear = test::smooth_values<T>(2880 * 20, 2);
  const auto dz_conv = test::smooth_values<T>(6 * 16 * 12 * 10, 3);
  const auto check_policy = [&](const auto& p, const char* name) {
    CAPTURE(name);
    const run_result one = run_everything(cpu_backend{1}, p, x, dz_linear, dz_conv);
    for (int threads : {2, 3, 4}) {
      CAPTURE(threads);
      const run_result many = run_everything(cpu_backend{threads}, p, x, dz_linear, dz_conv);
      CHECK(many.values == one.values);
      CHECK(many.positions == one.positions);
      CHECK(many.dense == one.dense);
      CHECK(many.linear_dw == one.linear_dw);
      CHECK(many.conv_dw == one.conv_dw);
    }
  };
  test::for_each_policy(0.8, 1, check_policy);
  check_policy(policy<chunked_min_k_selection>{{0.9, 100}}, "chunked min-k, D = 100");
  check_policy(policy<random_selection>{{.gamma = 0.9, .seed = 5, .chunk_size = 100}},
               "random, D = 100");
}

TEST_CASE_TEMPLATE("expert overloads work in exactly the queried workspace", T, float, half,
                   bfloat16) {
  const cpu_backend backend{3};
  const dropit::shape x_shape{4, 12, 6, 5}, a_linear_shape{288, 5};
  const dropit::shape dz_linear_shape{288, 7}, dw_linear_shape{7, 5};
  const dropit::shape dz_conv_shape{4, 6, 4, 3}, dw_conv_shape{6, 12, 3, 3};
  const auto x = test::smooth_values<T>(x_shape.numel(), 4);
  const auto dz_linear = test::smooth_values<T>(dz_linear_shape.numel(), 5);
  const auto dz_conv = test::smooth_values<T>(dz_conv_shape.numel(), 6);
  const conv2d_params params{};

  test::for_each_policy(0.9, 1, [&](const auto& p, const char* name) {
    CAPTURE(name);
    const auto owned = compress(backend, p, test::view_of(x, x_shape));

    // compress into caller-owned buffers sized from the plan.
    const cache_layout layout = plan_cache<T>(p, x_shape);
    std::vector<T> values(static_cast<std::size_t>(layout.kept()));
    std::vector<std::uint32_t> positions((layout.position_bytes() + 3) / 4);
    const cache_view<T> out{layout, values.data(), positions.data()};
    const std::size_t compress_bytes = compress_workspace_bytes<T>(backend, layout);
    std::vector<std::byte> memory(compress_bytes);
    compress<T>(backend, test::view_of(x, x_shape), out, workspace(memory.data(), compress_bytes));
    CHECK_BITS_EQUAL(values, test::values_of(owned));
    CHECK(std::vector<unsigned char>(reinterpret_cast<unsigned char*>(positions.data()),
                                     reinterpret_cast<unsigned char*>(positions.data()) +
                                         layout.position_bytes()) == test::position_bytes(owned));
    if (compress_bytes > 0) {
      CHECK_ERROR(compress<T>(backend, test::view_of(x, x_shape), out,
                              workspace(memory.data(), compress_bytes - 1)),
                  "compress", std::to_string(compress_bytes - 1), std::to_string(compress_bytes));
      CHECK_ERROR(compress<T>(backend, test::view_of(x, x_shape), out, workspace{}), "compress",
                  "workspace is null", std::to_string(compress_bytes));
    }

    // densify.
    const cache_view<const T> in = out;
    const std::size_t densify_bytes = densify_workspace_bytes<T>(backend, layout);
    memory.assign(densify_bytes, std::byte{});
    std::vector<T> dense(x.size(), test::make<T>(7.0));  // densify writes its zeros too
    densify<T>(backend, in, test::view_of(dense, x_shape), workspace(memory.data(), densify_bytes));
    CHECK_BITS_EQUAL(dense, densify(backend, owned));
    if (densify_bytes > 0)
      CHECK_ERROR(densify<T>(backend, in, test::view_of(dense, x_shape),
                             workspace(memory.data(), densify_bytes - 1)),
                  "densify", std::to_string(densify_bytes - 1), std::to_string(densify_bytes));

    // linear dW, from the same input viewed as [288, 5].
    const auto matrix = compress(backend, p, test::view_of(x, a_linear_shape));
    std::vector<T> dw_convenience(static_cast<std::size_t>(dw_linear_shape.numel()));
    std::vector<T> dw_expert(dw_convenience.size());
    linear_weight_grad<T>(backend, matrix.view(), test::view_of(dz_linear, dz_linear_shape),
                          test::view_of(dw_convenience, dw_linear_shape));
    const std::size_t linear_bytes = linear_weight_grad_workspace_bytes<T>(
        backend, matrix.layout(), dz_linear_shape, dw_linear_shape);
    memory.assign(linear_bytes, std::byte{});
    linear_weight_grad<T>(backend, matrix.view(), test::view_of(dz_linear, dz_linear_shape),
                          test::view_of(dw_expert, dw_linear_shape), grad_mode::overwrite,
                          workspace(memory.data(), linear_bytes));
    CHECK_BITS_EQUAL(dw_expert, dw_convenience);
    REQUIRE(linear_bytes > 0);
    CHECK_ERROR(
        linear_weight_grad<T>(backend, matrix.view(), test::view_of(dz_linear, dz_linear_shape),
                              test::view_of(dw_expert, dw_linear_shape), grad_mode::overwrite,
                              workspace(memory.data(), linear_bytes - 1)),
        "linear_weight_grad", std::to_string(linear_bytes - 1), std::to_string(linear_bytes));

    // conv2d dW.
    dw_convenience.assign(static_cast<std::size_t>(dw_conv_shape.numel()), T{});
    dw_expert = dw_convenience;
    conv2d_weight_grad<T>(backend, in, test::view_of(dz_conv, dz_conv_shape),
                          test::view_of(dw_convenience, dw_conv_shape), params);
    const std::size_t conv_bytes = conv2d_weight_grad_workspace_bytes<T>(
        backend, layout, dz_conv_shape, dw_conv_shape, params);
    memory.assign(conv_bytes, std::byte{});
    conv2d_weight_grad<T>(backend, in, test::view_of(dz_conv, dz_conv_shape),
                          test::view_of(dw_expert, dw_conv_shape), params, grad_mode::overwrite,
                          workspace(memory.data(), conv_bytes));
    CHECK_BITS_EQUAL(dw_expert, dw_convenience);
    REQUIRE(conv_bytes > 0);
    CHECK_ERROR(
        conv2d_weight_grad<T>(backend, in, test::view_of(dz_conv, dz_conv_shape),
                              test::view_of(dw_expert, dw_conv_shape), params, grad_mode::overwrite,
                              workspace(memory.data(), conv_bytes - 1)),
        "conv2d_weight_grad", std::to_string(conv_bytes - 1), std::to_string(conv_bytes));
    CHECK_ERROR(conv2d_weight_grad<T>(backend, in, test::view_of(dz_conv, dz_conv_shape),
                                      test::view_of(dw_expert, dw_conv_shape), params,
                                      grad_mode::overwrite, workspace{}),
                "workspace is null");
  });
}

TEST_CASE("a zero-byte workspace query accepts an empty workspace") {
  // Densifying a bitmask cache needs no scratch at all.
  const auto x = test::smooth_values<float>(1000, 1);
  const auto c = compress(cpu_backend{2}, policy<chunked_min_k_selection>{{0.5, 100}},
                          test::view_of(x, {1000}));
  REQUIRE(c.layout().encoding == position_encoding::bitmask);
  REQUIRE(densify_workspace_bytes<float>(cpu_backend{2}, c.layout()) == 0);
  std::vector<float> dense(1000);
  densify<float>(cpu_backend{2}, c.view(), test::view_of(dense, {1000}), workspace{});
  CHECK_BITS_EQUAL(dense, densify(cpu_backend{1}, c));
}

TEST_CASE("a workspace at any address works: the size query covers the alignment slack") {
  const std::vector<float> a = test::smooth_values<float>(300 * 20, 5);
  const std::vector<float> dz = test::smooth_values<float>(300 * 7, 6);
  const policy<random_selection> p{{0.7, 3, 64}};
  const auto c = compress(cpu_backend{1}, p, test::view_of(a, {300, 20}));
  std::vector<float> expected(7 * 20), got(7 * 20);
  linear_weight_grad<float>(cpu_backend{1}, c.view(), test::view_of(dz, {300, 7}),
                            test::view_of(expected, {7, 20}));
  const std::size_t bytes =
      linear_weight_grad_workspace_bytes<float>(cpu_backend{1}, c.layout(), {300, 7}, {7, 20});
  std::vector<std::byte> memory(bytes + 64);
  for (std::size_t shift : {1, 3, 8, 17, 63}) {
    CAPTURE(shift);
    std::fill(got.begin(), got.end(), 0.0f);
    linear_weight_grad<float>(cpu_backend{1}, c.view(), test::view_of(dz, {300, 7}),
                              test::view_of(got, {7, 20}), grad_mode::overwrite,
                              workspace(memory.data() + shift, bytes));
    CHECK_BITS_EQUAL(got, expected);
  }
}

TEST_CASE("the CPU loops run the instruction set DROPIT_CPU_ISA allows, at most") {
  using dropit::detail::cpu::cpu_isa;
  const cpu_isa active = dropit::detail::cpu::active_cpu_isa();
  const char* cap = std::getenv("DROPIT_CPU_ISA");
  CAPTURE(dropit::detail::cpu::name_of(active));
  CAPTURE((cap ? cap : "(unset)"));
  const std::string_view requested = cap ? cap : "";
  if (requested == "generic") CHECK(active == cpu_isa::generic);
  if (requested == "avx2") CHECK(active != cpu_isa::avx512);
#if defined(__GNUC__) && defined(__x86_64__)
  // Without a cap, the widest set this processor has (checked independently of the detection).
  if (requested.empty()) {
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") &&
                        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                        __builtin_cpu_supports("avx512dq");
    CHECK(active == (avx512 ? cpu_isa::avx512 : avx2 ? cpu_isa::avx2 : cpu_isa::generic));
  }
#endif
}

namespace {

/// Walks `steps` steps of `walk` from `start` by `stride` and checks its coordinates against those
/// the divisions give.
template <int Rank>
bool walk_matches_divisions(std::int64_t start, std::int64_t stride,
                            const std::int64_t (&inner_extents)[Rank - 1], int steps) {
  dropit::detail::index_walk<Rank> at(start, stride, inner_extents);
  for (std::int64_t flat = start; steps > 0; --steps, flat += stride, at.advance()) {
    std::int64_t rest = flat;
    for (int d = Rank - 1; d >= 1; --d) {
      if (at[d] != rest % inner_extents[d - 1]) return false;
      rest /= inner_extents[d - 1];
    }
    if (at[0] != rest) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("index_walk keeps the coordinates the divisions give, step after step") {
  // The CUDA kernels' division-free walks (channels, offsets, im2col), against flat / extent and
  // the remainders.
  for (const std::int64_t stride : {1, 5, 256, 65536, 1 << 20, 132 * 256 * 8})
    for (const std::int64_t start : {0, 1, 255, 4097}) {
      CAPTURE(stride);
      CAPTURE(start);
      for (const std::int64_t inner : {1, 2, 49, 3136}) {
        CAPTURE(inner);
        CHECK(walk_matches_divisions<2>(start, stride, {inner}, 300));
        for (const std::int64_t channels : {1, 3, 7, 256}) {
          CAPTURE(channels);
          CHECK(walk_matches_divisions<3>(start, stride, {channels, inner}, 300));
        }
      }
      // The im2col walk (c, kh, kw, s, oh, ow): 1x7, 3x5 and 7x1 kernels over small and odd
      // outputs, one sample and several.
      for (const std::int64_t kernel : {1, 3, 7})
        for (const std::int64_t samples : {1, 5, 32})
          for (const std::int64_t out : {1, 7, 56}) {
            CAPTURE(kernel);
            CAPTURE(samples);
            CAPTURE(out);
            CHECK(walk_matches_divisions<6>(start, stride,
                                            {kernel, 8 - kernel, samples, out, out + 1}, 300));
          }
    }
}
