// dropit::torch::convert on torch::nn models, and the errors bad options and bad inputs give.

#include <algorithm>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "torch_helpers.hpp"

namespace {

using namespace torch_test;
using dropit::selection_kind;
using dt::ConvertOptions;
using dt::DropitOptions;
using dt::granularity_kind;
namespace nn = ::torch::nn;

/// A Sequential that can sit inside another: torch's AnyModule needs a non-template forward.
struct BlockImpl : nn::SequentialImpl {
  using nn::SequentialImpl::SequentialImpl;
  at::Tensor forward(const at::Tensor& x) { return nn::SequentialImpl::forward(x); }
};
TORCH_MODULE(Block);

/// A small CNN with a nested Sequential and a bias-free Linear. Children by qualified name:
///   0 Conv2d   1 ReLU   2 Conv2d   3 ReLU   4 Sequential{4.0 Conv2d, 4.1 ReLU}   5 Flatten
///   6 Linear   7 ReLU   8 Linear (without bias if asked)
nn::Sequential make_model(bool last_bias = true) {
  return nn::Sequential(
      nn::Conv2d(nn::Conv2dOptions(3, 8, 3).padding(1)), nn::ReLU(),
      nn::Conv2d(nn::Conv2dOptions(8, 8, 3).padding(1)), nn::ReLU(),
      Block(nn::Conv2d(nn::Conv2dOptions(8, 8, 3).padding(1).stride(2)), nn::ReLU()), nn::Flatten(),
      nn::Linear(8 * 4 * 4, 32), nn::ReLU(), nn::Linear(nn::LinearOptions(32, 10).bias(last_bias)));
}

const std::vector<std::string> conv_and_linear = {"0", "2", "4.0", "6", "8"};
const std::vector<std::string> relus = {"1", "3", "4.1", "7"};

/// The module at a qualified name ("4.0").
std::shared_ptr<nn::Module> child(const nn::Module& root, const std::string& name) {
  for (const auto& item : root.named_modules())
    if (item.key() == name) return item.value();
  return nullptr;
}

template <class Impl>
bool is(const nn::Module& root, const std::string& name) {
  return std::dynamic_pointer_cast<Impl>(child(root, name)) != nullptr;
}

std::vector<std::string> sorted(std::vector<std::string> v) {
  std::sort(v.begin(), v.end());
  return v;
}

std::vector<std::string> skipped_names(const dt::ConvertReport& report) {
  std::vector<std::string> names;
  for (const auto& [name, reason] : report.skipped) names.push_back(name);
  return sorted(names);
}

std::string reason_for(const dt::ConvertReport& report, const std::string& name) {
  for (const auto& [n, reason] : report.skipped)
    if (n == name) return reason;
  return "<not skipped>";
}

/// Names, shapes and values of all parameters.
void check_same_parameters(const nn::Module& a, const nn::Module& b) {
  const auto pa = a.named_parameters(), pb = b.named_parameters();
  REQUIRE(pa.size() == pb.size());
  for (std::size_t i = 0; i < pa.size(); ++i) {
    CAPTURE(pa[i].key());
    CHECK(pa[i].key() == pb[i].key());
    CHECK(same_values(pa[i].value(), pb[i].value()));
  }
}

}  // namespace

TEST_CASE("torch: convert replaces Linear and Conv2d held by Sequentials, skipping the first") {
  ::torch::manual_seed(1);
  nn::Sequential model = make_model();
  const auto report = dt::convert(model);  // ModuleHolder overload
  std::ostringstream text;
  text << report;
  MESSAGE(text.str());
  CHECK(sorted(report.converted) == std::vector<std::string>{"2", "4.0", "6", "8"});
  CHECK(skipped_names(report) == std::vector<std::string>{"0"});
  CHECK(reason_for(report, "0").find("first") != std::string::npos);
  // The first layer caches nothing: a dropit layer keeping its input (the data) as torch's does.
  REQUIRE(is<dt::Conv2dImpl>(*model, "0"));
  CHECK(std::dynamic_pointer_cast<dt::Conv2dImpl>(child(*model, "0"))->dropit.keep_input());
  CHECK(is<dt::Conv2dImpl>(*model, "2"));
  CHECK(is<dt::Conv2dImpl>(*model, "4.0"));
  CHECK(is<dt::LinearImpl>(*model, "6"));
  CHECK(is<dt::LinearImpl>(*model, "8"));
  for (const auto& name : relus) CHECK(is<nn::ReLUImpl>(*model, name));
  // The converted layers carry the requested options.
  CHECK(std::dynamic_pointer_cast<dt::LinearImpl>(child(*model, "6"))->dropit.gamma() == 0.9);
  // The Sequential really calls the replacements: the output comes from dropit's node.
  const at::Tensor y = model->forward(::torch::randn({2, 3, 8, 8}));
  CHECK(grad_fn_name(y).find("dropit") != std::string::npos);
}

TEST_CASE("torch: convert options relu, skip_first and exclude") {
  ::torch::manual_seed(2);
  SUBCASE("relu and no skip_first") {
    nn::Sequential model = make_model();
    const auto report = dt::convert(*model, ConvertOptions().relu(true).skip_first(false));
    std::vector<std::string> all = conv_and_linear;
    all.insert(all.end(), relus.begin(), relus.end());
    CHECK(sorted(report.converted) == sorted(all));
    CHECK(report.skipped.empty());
    for (const auto& name : relus) CHECK(is<dt::ReLUImpl>(*model, name));
    CHECK(is<dt::Conv2dImpl>(*model, "0"));
  }
  SUBCASE("a convolution dropit's Conv2d cannot stand in for stays torch's, with the reason") {
    const auto reflecting = [](std::int64_t in, std::int64_t out) {
      return nn::Conv2d(nn::Conv2dOptions(in, out, 3).padding(1).padding_mode(::torch::kReflect));
    };
    nn::Sequential model(reflecting(3, 4), nn::ReLU(), reflecting(4, 4), nn::ReLU(),
                         nn::Conv2d(4, 2, 3));
    const auto report = dt::convert(model);
    CHECK(skipped_names(report) == std::vector<std::string>{"0", "2"});
    CHECK(reason_for(report, "0").find("first") != std::string::npos);
    CHECK(reason_for(report, "2").find("zeros") != std::string::npos);
    CHECK(report.converted == std::vector<std::string>{"4"});
    CHECK(is<nn::Conv2dImpl>(*model, "0"));
    CHECK(is<nn::Conv2dImpl>(*model, "2"));
    CHECK(is<dt::Conv2dImpl>(*model, "4"));
    model->forward(::torch::randn({2, 3, 8, 8})).sum().backward();
  }
  SUBCASE("an excluded first layer stays torch's, and is still the first") {
    nn::Sequential model = make_model();
    const auto report = dt::convert(model, ConvertOptions().exclude("^0$"));
    CHECK(reason_for(report, "0").find("exclude") != std::string::npos);
    CHECK(is<nn::Conv2dImpl>(*model, "0"));
    CHECK(sorted(report.converted) == std::vector<std::string>{"2", "4.0", "6", "8"});
  }
  SUBCASE("exclude by regular expression, applied to ReLUs too") {
    nn::Sequential model = make_model();
    const auto report = dt::convert(model, ConvertOptions().relu(true).exclude("^4\\.|^6$"));
    CHECK(sorted(report.converted) == std::vector<std::string>{"1", "2", "3", "7", "8"});
    CHECK(skipped_names(report) == std::vector<std::string>{"0", "4.0", "4.1", "6"});
    CHECK(reason_for(report, "6").find("exclude") != std::string::npos);
    CHECK(is<nn::Conv2dImpl>(*model, "4.0"));
    CHECK(is<nn::ReLUImpl>(*model, "4.1"));
    CHECK(is<nn::LinearImpl>(*model, "6"));
  }
  SUBCASE("the dropit options reach every converted layer") {
    nn::Sequential model = make_model();
    const auto options = DropitOptions().gamma(0.5).selection(selection_kind::min_k);
    dt::convert(model, ConvertOptions().dropit(options));
    auto conv = std::dynamic_pointer_cast<dt::Conv2dImpl>(child(*model, "4.0"));
    REQUIRE(conv);
    CHECK(conv->dropit.gamma() == 0.5);
    CHECK(conv->dropit.selection() == selection_kind::min_k);
  }
}

TEST_CASE("torch: convert shares parameters and keeps eval outputs and training mode") {
  ::torch::manual_seed(3);
  nn::Sequential model = make_model();
  const at::Tensor x = ::torch::randn({4, 3, 8, 8});
  model->eval();
  const at::Tensor before = model->forward(x);
  std::vector<std::pair<std::string, const void*>> pointers;
  for (const auto& p : model->named_parameters())
    pointers.emplace_back(p.key(), p.value().data_ptr());

  dt::convert(model, ConvertOptions().relu(true).skip_first(false));
  std::vector<std::pair<std::string, const void*>> after;
  for (const auto& p : model->named_parameters()) after.emplace_back(p.key(), p.value().data_ptr());
  CHECK(after == pointers);  // same names, same order, same storage
  for (const auto& name : conv_and_linear) {
    CAPTURE(name);
    CHECK(!child(*model, name)->is_training());  // eval mode carried over
  }
  CHECK(same_values(model->forward(x), before));
  {
    ::torch::NoGradGuard no_grad;
    model->train();
    CHECK(same_values(model->forward(x), before));  // no-grad: dense too
  }
  // Training with gradients goes through dropit, and the shared parameters receive gradients.
  model->train();
  model->forward(x).sum().backward();
  for (const auto& p : model->named_parameters()) {
    CAPTURE(p.key());
    CHECK(p.value().grad().defined());
  }
}

TEST_CASE("torch: state dicts round-trip between converted and dense models") {
  // The last Linear has no bias: an undefined parameter must round-trip as absent.
  ::torch::manual_seed(4);
  nn::Sequential converted = make_model(/*last_bias=*/false);
  dt::convert(converted, ConvertOptions().relu(true));
  REQUIRE(is<dt::LinearImpl>(*converted, "8"));
  ::torch::manual_seed(5);  // different initial values
  nn::Sequential dense = make_model(/*last_bias=*/false);
  CHECK(converted->named_parameters().size() == dense->named_parameters().size());

  SUBCASE("converted -> dense") {
    CHECK(!same_values(dense->parameters()[0], converted->parameters()[0]));
    std::stringstream stream;
    ::torch::save(converted, stream);
    ::torch::load(dense, stream);
    check_same_parameters(*dense, *converted);
  }
  SUBCASE("dense -> converted") {
    CHECK(!same_values(dense->parameters()[0], converted->parameters()[0]));
    std::stringstream stream;
    ::torch::save(dense, stream);
    ::torch::load(converted, stream);
    check_same_parameters(*converted, *dense);
    // The converted layers now compute with the loaded values (they were loaded in place).
    converted->eval();
    dense->eval();
    const at::Tensor x = ::torch::randn({2, 3, 8, 8});
    CHECK(same_values(converted->forward(x), dense->forward(x)));
  }
}

namespace {

/// A custom module holding a layer through a C++ member: convert cannot rebind it.
struct NetImpl : nn::Module {
  NetImpl()
      : body(register_module("body",
                             nn::Sequential(nn::Linear(4, 8), nn::ReLU(), nn::Linear(8, 8)))),
        head(register_module("head", nn::Linear(8, 2))) {}
  at::Tensor forward(const at::Tensor& x) { return head(body->forward(x)); }
  nn::Sequential body;
  nn::Linear head;
};
TORCH_MODULE(Net);

}  // namespace

TEST_CASE("torch: convert reports a layer held by a C++ member as skipped, with the reason") {
  Net net;
  const auto report = dt::convert(net, ConvertOptions().relu(true));
  std::ostringstream text;
  text << report;
  MESSAGE(text.str());
  CHECK(sorted(report.converted) == std::vector<std::string>{"body.1", "body.2"});
  CHECK(skipped_names(report) == std::vector<std::string>{"body.0", "head"});
  const std::string reason = reason_for(report, "head");
  CHECK(reason.find("C++ member") != std::string::npos);
  CHECK(reason.find("Sequential") != std::string::npos);
  CHECK(is<nn::LinearImpl>(*net, "head"));
  CHECK(net->head.ptr() == std::dynamic_pointer_cast<nn::LinearImpl>(child(*net, "head")));
  CHECK(text.str().find("head") != std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// Errors: every one a dropit::error whose message names the bad value.

TEST_CASE("torch: bad gamma is rejected when a layer is built, naming the value") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  nn::Linear dense_linear(4, 4);
  nn::Conv2d dense_conv(nn::Conv2dOptions(2, 2, 3));
  for (const double gamma : {-0.1, 1.0, 1.5, nan}) {
    CAPTURE(gamma);
    const std::string named = std::isnan(gamma) ? "nan"
                              : gamma == -0.1   ? "-0.1"
                              : gamma == 1.0    ? "gamma = 1"
                                                : "1.5";
    const auto options = DropitOptions().gamma(gamma);
    CHECK_DROPIT_ERROR(dt::Linear(nn::LinearOptions(4, 4), options), named, "[0, 1)");
    CHECK_DROPIT_ERROR(dt::Linear(*dense_linear, options), named);
    CHECK_DROPIT_ERROR(dt::Conv2d(nn::Conv2dOptions(2, 2, 3), options), named);
    CHECK_DROPIT_ERROR(dt::Conv2d(*dense_conv, options), named);
    nn::Sequential model(nn::Linear(4, 4), nn::Linear(4, 4));
    CHECK_DROPIT_ERROR(dt::convert(model, ConvertOptions().dropit(options)), named);
    CHECK(is<nn::LinearImpl>(*model, "1"));  // nothing converted
  }
}

TEST_CASE("torch: bad policy options are rejected when a layer is built") {
  nn::Linear dense(4, 4);
  CHECK_DROPIT_ERROR(dt::Linear(*dense, DropitOptions().granularity(granularity_kind::channel)),
                     "chunked_min_k", "channel granularity");
  for (const std::int64_t d : {std::int64_t{0}, std::int64_t{65537}}) {
    CAPTURE(d);
    CHECK_DROPIT_ERROR(dt::Linear(*dense, DropitOptions().chunk_size(d)), std::to_string(d),
                       "[1, 65536]");
  }
  CHECK_DROPIT_ERROR(
      dt::Conv2d(nn::Conv2dOptions(2, 2, 3).padding(::torch::kSame), DropitOptions()), "'same'");
  CHECK_DROPIT_ERROR(
      dt::Conv2d(nn::Conv2dOptions(2, 2, 3).padding_mode(::torch::kReflect), DropitOptions()),
      "zeros");
}

TEST_CASE("torch: unsupported dtypes are rejected, naming the dtype") {
  nn::Linear linear_d(4, 3);
  linear_d->to(at::kDouble);
  dt::Linear linear(*linear_d, DropitOptions().gamma(0.5));
  CHECK_DROPIT_ERROR(linear(::torch::randn({2, 4}, at::kDouble)), "Double", "float32");
  CHECK_DROPIT_ERROR(linear(::torch::ones({2, 4}, at::kInt)), "Int", "float32");
  nn::Conv2d conv_d(nn::Conv2dOptions(2, 2, 3));
  conv_d->to(at::kDouble);
  dt::Conv2d conv(*conv_d, DropitOptions().gamma(0.5));
  CHECK_DROPIT_ERROR(conv(::torch::randn({1, 2, 5, 5}, at::kDouble)), "Double");
  CHECK_DROPIT_ERROR(dt::ReLU()(::torch::randn({8}, at::kDouble).requires_grad_()), "Double");
  CHECK_DROPIT_ERROR(dt::compress(::torch::randn({8}, at::kDouble), DropitOptions().spec(0, 0)),
                     "Double");
}

TEST_CASE("torch: non-contiguous, wrong-rank and mismatched layer inputs are rejected") {
  dt::Linear linear(nn::LinearOptions(4, 3), DropitOptions().gamma(0.5));
  dt::Conv2d conv(nn::Conv2dOptions(2, 2, 3), DropitOptions().gamma(0.5));
  const at::Tensor transposed = ::torch::randn({4, 6}).t();  // [6, 4], not contiguous
  CHECK_DROPIT_ERROR(linear(transposed), "neither contiguous nor channels-last", "[6, 4]");
  // ReLU, elementwise, reads any strides (through a contiguous copy unless channels-last).
  const at::Tensor relu_input = ::torch::randn({4, 6}).requires_grad_();
  CHECK(same_values(dt::ReLU()(relu_input.t()), at::relu(relu_input.t())));
  // A convolution reads contiguous and channels-last inputs; other strides are refused.
  CHECK_DROPIT_ERROR(conv(::torch::randn({1, 2, 5, 5}).transpose(2, 3)),
                     "neither contiguous nor channels-last");
  CHECK_DROPIT_ERROR(conv(::torch::randn({2, 5, 5})), "[N, C, H, W]", "[2, 5, 5]");
  CHECK_DROPIT_ERROR(linear(::torch::randn({2, 5})), "[2, 5]", "4 features");
  // A channel mismatch in conv2d is torch's own check; it must still throw, not crash.
  CHECK_THROWS(conv(::torch::randn({1, 3, 5, 5})));
  // The dense paths (eval, no-grad) leave the checks to torch and accept non-contiguous input.
  linear->eval();
  CHECK(same_values(linear(transposed),
                    ::torch::nn::functional::linear(transposed, linear->weight, linear->bias)));
}
