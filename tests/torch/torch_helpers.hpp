#pragma once
// Plumbing shared by the LibTorch adapter tests: gradients through torch's autograd, tolerances
// derived from the magnitude of the summed terms, and the dropit::error message check.

// LibTorch before doctest: LibTorch pulls in glog, whose CHECK and CHECK_EQ ... macros would
// otherwise replace doctest's (and abort on failure instead of reporting).
#include <dropit/torch.hpp>

#undef CHECK
#undef CHECK_EQ
#undef CHECK_NE
#undef CHECK_LT
#undef CHECK_LE
#undef CHECK_GT
#undef CHECK_GE
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace torch_test {

namespace dt = dropit::torch;

/// Gradients of sum(f(inputs) * upstream) with respect to `inputs` (undefined where an input
/// needs no gradient), and the output itself.
struct forward_backward {
  at::Tensor output;
  std::vector<at::Tensor> grads;
};

inline forward_backward run(const std::function<at::Tensor()>& f, const at::Tensor& upstream,
                            const std::vector<at::Tensor>& inputs) {
  forward_backward r;
  r.output = f();
  std::vector<at::Tensor> wanted;
  for (const auto& t : inputs)
    if (t.defined() && t.requires_grad()) wanted.push_back(t);
  const auto got = torch::autograd::grad({(r.output * upstream).sum()}, wanted);
  std::size_t next = 0;
  for (const auto& t : inputs)
    r.grads.push_back(t.defined() && t.requires_grad() ? got[next++] : at::Tensor());
  return r;
}

/// Largest |a - b| (a and b compared in float32; NaN counts as infinite).
inline double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor d = (a.to(at::kFloat) - b.to(at::kFloat)).abs();
  if (d.numel() == 0) return 0.0;
  if (d.isnan().any().item<bool>()) return INFINITY;
  return d.max().item<double>();
}

/// Checks |got - want| <= rel * bound + out_rel * |want| elementwise, where `bound` is the sum of
/// |terms| that formed `want` (the same computation on absolute values): a float sum of n terms in
/// any order is off by at most about n·eps of that, and rounding the result to a 16-bit type adds
/// up to half an ulp, 2^-8 of |want| for bfloat16.
inline void check_close(const at::Tensor& got, const at::Tensor& want, const at::Tensor& bound,
                        double rel, const std::string& what, double out_rel = 0.0) {
  INFO(what);
  REQUIRE(got.defined());
  REQUIRE(want.defined());
  CHECK(got.sizes().vec() == want.sizes().vec());
  CHECK(std::string(c10::toString(got.scalar_type())) == c10::toString(want.scalar_type()));
  if (got.sizes() != want.sizes()) return;
  const at::Tensor g = got.to(at::kFloat), w = want.to(at::kFloat);
  const at::Tensor excess =
      (g - w).abs() - (rel * bound.to(at::kFloat).abs() + out_rel * w.abs() + 1e-30);
  const bool ok = !excess.isnan().any().item<bool>() && (excess <= 0).all().item<bool>();
  CHECK_MESSAGE(ok, what, ": max |got - want| = ", max_abs_diff(g, w),
                ", max |want| = ", w.abs().max().item<double>(), ", rel = ", rel,
                ", out_rel = ", out_rel);
}

/// Bitwise-equal values (NaN matches NaN), same shape and dtype.
inline bool same_values(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) return false;
  const at::Tensor both_nan = a.isnan() & b.isnan();
  return (both_nan | (a == b)).all().item<bool>();
}

/// Gradients of the parameters and of the input, after one backward of sum(y²).
inline std::vector<at::Tensor> gradients(
    ::torch::nn::Module& model, const at::Tensor& input,
    const std::function<at::Tensor(const at::Tensor&)>& forward) {
  model.zero_grad();
  const at::Tensor x = input.detach().requires_grad_(true);
  forward(x).square().sum().backward();
  std::vector<at::Tensor> grads{x.grad().clone()};
  for (const auto& p : model.parameters()) grads.push_back(p.grad().clone());
  return grads;
}

inline void check_equal(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("gradient ", i);
    CHECK(same_values(got[i], want[i]));
  }
}

/// As check_equal, except for the gradients at `recomputed` (weights of layers whose input a
/// BatchNorm's output recomputed from its statistics, whatever such a gradient flows into, and
/// sums torch forms in another order): torch's kernel rounds the forward's normalisation in its
/// own order, so these agree within `rel` of their largest magnitude, not bit for bit. An empty
/// `recomputed` compares every gradient so.
inline void check_equal_but_recomputed(const std::vector<at::Tensor>& got,
                                       const std::vector<at::Tensor>& want,
                                       const std::vector<std::size_t>& recomputed,
                                       double rel = 1e-5) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("gradient ", i);
    const bool close_only = recomputed.empty() ||
                            std::find(recomputed.begin(), recomputed.end(), i) != recomputed.end();
    if (!close_only) {
      CHECK(same_values(got[i], want[i]));
      continue;
    }
    REQUIRE(got[i].sizes() == want[i].sizes());
    const double scale = want[i].abs().max().item<double>();
    CHECK(scale > 0.0);
    CHECK(max_abs_diff(got[i], want[i]) <= rel * scale);
  }
}

/// CPU autocast to bfloat16 for the lifetime of the object.
struct cpu_autocast_bfloat16 {
  cpu_autocast_bfloat16() { enable(true); }
  ~cpu_autocast_bfloat16() {
    enable(false);
    at::autocast::clear_cache();
  }
  cpu_autocast_bfloat16(const cpu_autocast_bfloat16&) = delete;
  cpu_autocast_bfloat16& operator=(const cpu_autocast_bfloat16&) = delete;
  static void enable(bool on) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
    at::autocast::set_autocast_enabled(at::kCPU, on);
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
#else
    at::autocast::set_cpu_enabled(on);
    at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
#endif
  }
};

/// Name of the autograd node that produced `t` ("" for none).
inline std::string grad_fn_name(const at::Tensor& t) {
  return t.grad_fn() ? t.grad_fn()->name() : std::string();
}

template <class F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const dropit::error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("<not a dropit::error: ") + e.what() + ">";
  }
  return "<no exception>";
}

}  // namespace torch_test

/// The call must throw dropit::error whose message names every `needles` entry.
#define CHECK_DROPIT_ERROR(expr, ...)                                                              \
  do {                                                                                             \
    const std::string message_ = ::torch_test::error_message([&] { (void)(expr); });               \
    INFO("call: " #expr);                                                                          \
    INFO("message: ", message_);                                                                   \
    CHECK_MESSAGE(message_.rfind("dropit: ", 0) == 0, "expected a dropit::error");                 \
    for (const std::string& needle_ : std::initializer_list<std::string>{__VA_ARGS__})             \
      CHECK_MESSAGE(message_.find(needle_) != std::string::npos, "message should name '", needle_, \
                    "'");                                                                          \
  } while (0)
