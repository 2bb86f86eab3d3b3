// The entry points and their dispatch: a backend is a tag type plus one specialisation of
// detail::backend_ops. A test backend that runs the CPU operations but lets a test refuse any
// pointer shows that every entry point checks where each operand lives before it dispatches, and
// that an operation reached through it computes what the CPU backend does.

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "helpers.hpp"

namespace {

using namespace dropit;

/// Runs the CPU operations; its `expect_accessible` records what it was asked about and refuses
/// `refused`.
struct checking_backend {
  const void* refused = nullptr;
  std::vector<std::string>* checked = nullptr;
  int* operations = nullptr;
};

}  // namespace

namespace dropit::detail {

template <>
struct backend_ops<checking_backend> {
  static constexpr const char* name = "checking";
  using cpu_ops = backend_ops<cpu_backend>;
  static constexpr cpu_backend cpu{1};

  static void expect_accessible(const checking_backend& b, const void* pointer, std::size_t,
                                const char* what) {
    b.checked->push_back(what);
    expect(pointer == nullptr || pointer != b.refused, what, " is not accessible");
  }

  template <storage_type T>
  static std::size_t compress_workspace_bytes(const checking_backend&, const cache_layout& l,
                                              const std::optional<channels_last_dims>& stored) {
    return cpu_ops::compress_workspace_bytes<T>(cpu, l, stored);
  }
  template <storage_type T>
  static void compress(const checking_backend& b, const T* input,
                       const std::optional<channels_last_dims>& stored, const cache_view<T>& out,
                       workspace memory) {
    ++*b.operations;
    cpu_ops::compress<T>(cpu, input, stored, out, memory);
  }
  template <storage_type T>
  static std::size_t densify_workspace_bytes(const checking_backend&, const cache_layout& l) {
    return cpu_ops::densify_workspace_bytes<T>(cpu, l);
  }
  template <storage_type T>
  static void densify(const checking_backend& b, const cache_view<const T>& cache, T* out,
                      workspace memory) {
    ++*b.operations;
    cpu_ops::densify<T>(cpu, cache, out, memory);
  }
  template <storage_type T>
  static std::size_t linear_weight_grad_workspace_bytes(const checking_backend&,
                                                        const cache_layout& a,
                                                        const linear_dims& d) {
    return cpu_ops::linear_weight_grad_workspace_bytes<T>(cpu, a, d);
  }
  template <storage_type T>
  static void linear_weight_grad(const checking_backend& b, const cache_view<const T>& a,
                                 const T* dz, T* dw, const linear_dims& d, grad_mode mode,
                                 workspace memory) {
    ++*b.operations;
    cpu_ops::linear_weight_grad<T>(cpu, a, dz, dw, d, mode, memory);
  }
  template <storage_type T>
  static std::size_t conv2d_weight_grad_workspace_bytes(const checking_backend&,
                                                        const cache_layout& x,
                                                        const conv2d_geometry& g) {
    return cpu_ops::conv2d_weight_grad_workspace_bytes<T>(cpu, x, g);
  }
  template <storage_type T>
  static void conv2d_weight_grad(const checking_backend& b, const cache_view<const T>& x,
                                 const T* dz, T* dw, const conv2d_geometry& g, grad_mode mode,
                                 workspace memory) {
    ++*b.operations;
    cpu_ops::conv2d_weight_grad<T>(cpu, x, dz, dw, g, mode, memory);
  }
  template <storage_type T>
  static void pack_relu_mask(const checking_backend& b, const T* x, T* y, std::int64_t n,
                             std::uint32_t* words) {
    ++*b.operations;
    cpu_ops::pack_relu_mask<T>(cpu, x, y, n, words);
  }
  template <storage_type T>
  static void apply_relu_mask(const checking_backend& b, const std::uint32_t* words, const T* dy,
                              T* dx, std::int64_t n) {
    ++*b.operations;
    cpu_ops::apply_relu_mask<T>(cpu, words, dy, dx, n);
  }
};

}  // namespace dropit::detail

static_assert(backend_type<cpu_backend>);
static_assert(backend_type<checking_backend>);
static_assert(!backend_type<int>);

namespace {

/// Every operand of every expert entry point on a [4, 8, 6, 5] input (conv: 8 -> 3 channels, 3x3;
/// linear: [192, 5] -> 7 features), and a call for each.
struct operands {
  std::vector<float> x = test::smooth_values<float>(4 * 8 * 6 * 5, 3);
  cache_layout layout = plan_cache<float>(policy<chunked_min_k_selection>{{0.5, 64}}, {4, 8, 6, 5});
  std::vector<float> values = std::vector<float>(static_cast<std::size_t>(layout.kept()));
  std::vector<std::uint32_t> positions =
      std::vector<std::uint32_t>((layout.position_bytes() + 3) / 4);
  std::vector<float> dense = std::vector<float>(x.size());
  std::vector<float> dz_linear = test::smooth_values<float>(192 * 7, 4);
  std::vector<float> dw_linear = std::vector<float>(7 * 5);
  std::vector<float> dz_conv = test::smooth_values<float>(4 * 3 * 4 * 3, 5);
  std::vector<float> dw_conv = std::vector<float>(3 * 8 * 3 * 3);
  std::vector<std::uint32_t> mask = std::vector<std::uint32_t>(relu_mask_words(960));
  std::vector<float> relu_out = std::vector<float>(x.size());
  std::vector<std::byte> memory = std::vector<std::byte>(1 << 20);

  cache_view<float> cache() { return {layout, values.data(), positions.data()}; }

  template <class B>
  void compress_with(const B& b) {
    dropit::compress<float>(b, test::view_of(x, layout.shape), cache(), memory);
  }
  template <class B>
  void densify_with(const B& b) {
    dropit::densify<float>(b, cache(), test::view_of(dense, layout.shape), memory);
  }
  template <class B>
  void linear_with(const B& b) {
    dropit::linear_weight_grad<float>(b, cache(), test::view_of(dz_linear, {192, 7}),
                                      test::view_of(dw_linear, {7, 5}), grad_mode::overwrite,
                                      memory);
  }
  template <class B>
  void conv_with(const B& b) {
    dropit::conv2d_weight_grad<float>(b, cache(), test::view_of(dz_conv, {4, 3, 4, 3}),
                                      test::view_of(dw_conv, {3, 8, 3, 3}), conv2d_params{},
                                      grad_mode::overwrite, memory);
  }
  template <class B>
  void relu_with(const B& b) {
    dropit::relu_with_mask<float>(b, test::view_of(x, {960}), test::view_of(relu_out, {960}),
                                  mask.data());
  }
  template <class B>
  void apply_with(const B& b) {
    dropit::apply_relu_mask<float>(b, mask.data(), test::view_of(x, {960}),
                                   test::view_of(relu_out, {960}));
  }
};

}  // namespace

TEST_CASE("a backend defined outside the library runs every entry point and matches the CPU's") {
  operands cpu_run, test_run;
  std::vector<std::string> checked;
  int operations = 0;
  const checking_backend backend{nullptr, &checked, &operations};
  const cpu_backend serial{1};

  cpu_run.compress_with(serial);
  cpu_run.densify_with(serial);
  cpu_run.linear_with(serial);
  cpu_run.conv_with(serial);
  cpu_run.relu_with(serial);
  cpu_run.apply_with(serial);
  test_run.compress_with(backend);
  test_run.densify_with(backend);
  test_run.linear_with(backend);
  test_run.conv_with(backend);
  test_run.relu_with(backend);
  test_run.apply_with(backend);

  CHECK(operations == 6);
  CHECK_BITS_EQUAL(test_run.values, cpu_run.values);
  CHECK(test_run.positions == cpu_run.positions);
  CHECK_BITS_EQUAL(test_run.dense, cpu_run.dense);
  CHECK_BITS_EQUAL(test_run.dw_linear, cpu_run.dw_linear);
  CHECK_BITS_EQUAL(test_run.dw_conv, cpu_run.dw_conv);
  CHECK(test_run.mask == cpu_run.mask);
  CHECK_BITS_EQUAL(test_run.relu_out, cpu_run.relu_out);
  // Not vacuous: the dense tensor holds the kept half of the input, the gradients are not zero.
  const auto nonzero = [](const std::vector<float>& v) {
    return std::count_if(v.begin(), v.end(), [](float f) { return f != 0.0f; });
  };
  CHECK(nonzero(test_run.dense) == test_run.layout.kept());
  CHECK(nonzero(test_run.dw_linear) > 0);
  CHECK(nonzero(test_run.dw_conv) > 0);
}

TEST_CASE("every entry point asks the backend about each operand before it dispatches") {
  // For each operation, refusing any one of its operands' memory stops the call with the
  // operand's name, and the backend's operation never runs.
  struct refusal {
    const char* operand;
    void (*call)(operands&, const checking_backend&);
    const void* (*pointer)(operands&);
  };
  const refusal refusals[] = {
      {"compress input", [](operands& o, const checking_backend& b) { o.compress_with(b); },
       [](operands& o) -> const void* { return o.x.data(); }},
      {"cache values buffer", [](operands& o, const checking_backend& b) { o.compress_with(b); },
       [](operands& o) -> const void* { return o.values.data(); }},
      {"cache positions buffer", [](operands& o, const checking_backend& b) { o.compress_with(b); },
       [](operands& o) -> const void* { return o.positions.data(); }},
      {"compress workspace", [](operands& o, const checking_backend& b) { o.compress_with(b); },
       [](operands& o) -> const void* { return o.memory.data(); }},
      {"densify output", [](operands& o, const checking_backend& b) { o.densify_with(b); },
       [](operands& o) -> const void* { return o.dense.data(); }},
      {"densify workspace", [](operands& o, const checking_backend& b) { o.densify_with(b); },
       [](operands& o) -> const void* { return o.memory.data(); }},
      {"cache values buffer", [](operands& o, const checking_backend& b) { o.linear_with(b); },
       [](operands& o) -> const void* { return o.values.data(); }},
      {"dZ", [](operands& o, const checking_backend& b) { o.linear_with(b); },
       [](operands& o) -> const void* { return o.dz_linear.data(); }},
      {"dW", [](operands& o, const checking_backend& b) { o.linear_with(b); },
       [](operands& o) -> const void* { return o.dw_linear.data(); }},
      {"linear_weight_grad workspace",
       [](operands& o, const checking_backend& b) { o.linear_with(b); },
       [](operands& o) -> const void* { return o.memory.data(); }},
      {"cache positions buffer", [](operands& o, const checking_backend& b) { o.conv_with(b); },
       [](operands& o) -> const void* { return o.positions.data(); }},
      {"dZ", [](operands& o, const checking_backend& b) { o.conv_with(b); },
       [](operands& o) -> const void* { return o.dz_conv.data(); }},
      {"dW", [](operands& o, const checking_backend& b) { o.conv_with(b); },
       [](operands& o) -> const void* { return o.dw_conv.data(); }},
      {"conv2d_weight_grad workspace",
       [](operands& o, const checking_backend& b) { o.conv_with(b); },
       [](operands& o) -> const void* { return o.memory.data(); }},
      {"ReLU input", [](operands& o, const checking_backend& b) { o.relu_with(b); },
       [](operands& o) -> const void* { return o.x.data(); }},
      {"ReLU output", [](operands& o, const checking_backend& b) { o.relu_with(b); },
       [](operands& o) -> const void* { return o.relu_out.data(); }},
      {"ReLU mask buffer", [](operands& o, const checking_backend& b) { o.relu_with(b); },
       [](operands& o) -> const void* { return o.mask.data(); }},
      {"ReLU dy", [](operands& o, const checking_backend& b) { o.apply_with(b); },
       [](operands& o) -> const void* { return o.x.data(); }},
      {"ReLU dx", [](operands& o, const checking_backend& b) { o.apply_with(b); },
       [](operands& o) -> const void* { return o.relu_out.data(); }},
      {"ReLU mask buffer", [](operands& o, const checking_backend& b) { o.apply_with(b); },
       [](operands& o) -> const void* { return o.mask.data(); }},
  };
  for (const refusal& r : refusals) {
    CAPTURE(r.operand);
    operands o;
    std::vector<std::string> checked;
    int operations = 0;
    const checking_backend backend{r.pointer(o), &checked, &operations};
    CHECK_ERROR(r.call(o, backend), r.operand, "not accessible");
    CHECK(operations == 0);
  }
}
