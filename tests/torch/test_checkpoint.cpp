// dropit::torch::checkpoint and Checkpoint against the same blocks run plainly: gradients equal
// (dropout replayed), nesting, dropit's layers inside, the bytes a forward keeps, bad blocks.

#include "torch_helpers.hpp"

namespace {

using namespace torch_test;
namespace nn = ::torch::nn;
using ::torch::autograd::variable_list;

/// Linear -> ReLU -> Dropout -> Linear -> GELU, four times.
nn::Sequential block_with_dropout(std::int64_t width) {
  nn::Sequential block;
  for (int i = 0; i < 4; ++i) {
    block->push_back(nn::Linear(width, width));
    block->push_back(nn::ReLU());
    block->push_back(nn::Dropout(0.3));
    block->push_back(nn::Linear(width, width));
    block->push_back(nn::GELU());
  }
  return block;
}

}  // namespace

TEST_CASE("torch: checkpoint gives the plain block's gradients, dropout replayed") {
  ::torch::manual_seed(0);
  auto block = block_with_dropout(32);
  const at::Tensor x = ::torch::randn({16, 32});
  ::torch::manual_seed(7);
  const auto plain = gradients(*block, x, [&](const at::Tensor& t) { return block->forward(t); });
  ::torch::manual_seed(7);
  const auto checkpointed = gradients(*block, x, [&](const at::Tensor& t) {
    return dt::checkpoint(
        [&](const variable_list& in) { return variable_list{block->forward(in[0])}; }, {t},
        block->parameters())[0];
  });
  check_equal(checkpointed, plain);
  // The generators continue where the plain run left them: the second run replayed, then put
  // them back.
  ::torch::manual_seed(7);
  (void)block->forward(x);
  const at::Tensor after_plain = ::torch::rand({4});
  ::torch::manual_seed(7);
  dt::checkpoint([&](const variable_list& in) { return variable_list{block->forward(in[0])}; },
                 {x.requires_grad_(true)}, block->parameters())[0]
      .sum()
      .backward();
  CHECK(same_values(::torch::rand({4}), after_plain));
}

TEST_CASE("torch: a checkpointed block fed by data that needs no gradient still trains") {
  ::torch::manual_seed(0);
  nn::Linear layer(8, 4);
  const at::Tensor x = ::torch::randn({5, 8});  // requires no gradient
  layer->forward(x).square().sum().backward();
  const at::Tensor plain = layer->weight.grad().clone();
  layer->zero_grad();
  dt::checkpoint([&](const variable_list& in) { return variable_list{layer->forward(in[0])}; }, {x},
                 layer->parameters())[0]
      .square()
      .sum()
      .backward();
  REQUIRE(layer->weight.grad().defined());
  CHECK(same_values(layer->weight.grad(), plain));
}

TEST_CASE("torch: checkpoints nest, and the Checkpoint module wraps dropit's layers") {
  ::torch::manual_seed(0);
  nn::Sequential inner(nn::Linear(16, 16), nn::ReLU(), nn::Linear(16, 16));
  nn::GELU gelu;
  nn::Sequential dense(dt::Checkpoint(inner), gelu, nn::Linear(16, 16));
  dt::convert(dense, dt::ConvertOptions().skip_first(false).dropit(
                         dt::DropitOptions().gamma(0.0)));  // exact: gradients as dense
  REQUIRE(dense->ptr<dt::LinearImpl>(2) != nullptr);
  REQUIRE(inner->ptr<dt::LinearImpl>(0) != nullptr);  // converted inside the checkpoint too
  const auto last = dense->ptr<dt::LinearImpl>(2);
  dt::Checkpoint outer(dense);
  const at::Tensor x = ::torch::randn({6, 16});
  // The same modules, run plainly; the parameters are the same tensors either way.
  const auto plain = gradients(*dense, x, [&](const at::Tensor& t) {
    return last->forward(gelu->forward(inner->forward(t)));
  });
  const auto checkpointed =
      gradients(*dense, x, [&](const at::Tensor& t) { return outer->forward(t); });
  REQUIRE(plain.size() == checkpointed.size());
  for (std::size_t i = 0; i < plain.size(); ++i)
    check_close(checkpointed[i], plain[i], plain[i].abs(), 1e-5, "gradient " + std::to_string(i));
  // The module's parameters are its block's, by the block's names.
  CHECK(outer->named_parameters().contains("block.0.block.0.weight"));
  // In eval mode it is the block.
  outer->eval();
  CHECK(same_values(outer->forward(x), dense->forward(x)));
}

TEST_CASE("torch: a checkpointed forward keeps its input and output only") {
  ::torch::manual_seed(0);
  auto block = block_with_dropout(256);
  const at::Tensor x = ::torch::randn({512, 256}).requires_grad_(true);
  auto held = [&](const std::function<at::Tensor()>& forward) {
    dt::MemoryMeter meter;
    const std::int64_t before = meter.current();
    const at::Tensor y = forward();
    const std::int64_t kept = meter.current() - before - y.numel() * 4;
    y.sum().backward();
    return kept;
  };
  const std::int64_t plain = held([&] { return block->forward(x); });
  const std::int64_t checkpointed = held([&] {
    return dt::checkpoint(
        [&](const variable_list& in) { return variable_list{block->forward(in[0])}; }, {x},
        block->parameters())[0];
  });
  MESSAGE("held after forward: plain ", plain, " B, checkpointed ", checkpointed, " B");
  CHECK(plain > 10 * x.numel() * 4);        // every layer's input and the dropout masks
  CHECK(checkpointed < x.numel() * 4 / 8);  // not even a copy of the input: the input is shared
}

TEST_CASE("torch: the Checkpoint module updates BatchNorm's running statistics once per step") {
  const auto make = [] {
    ::torch::manual_seed(4);
    return ::torch::nn::Sequential(::torch::nn::Conv2d(3, 8, 3), ::torch::nn::BatchNorm2d(8),
                                   ::torch::nn::ReLU());
  };
  ::torch::nn::Sequential plain = make(), block = make();
  dt::Checkpoint wrapped(block);
  const at::Tensor x = ::torch::randn({4, 3, 10, 10});
  for (int step = 0; step < 2; ++step) {
    plain->forward(x).square().sum().backward();
    wrapped->forward(x).square().sum().backward();
  }
  const auto want = plain->named_buffers();
  for (const auto& buffer : block->named_buffers()) {
    INFO(buffer.key());
    CHECK(same_values(buffer.value(), want[buffer.key()]));
  }
  for (const auto& parameter : block->named_parameters()) {
    INFO(parameter.key());
    CHECK(same_values(parameter.value().grad(), plain->named_parameters()[parameter.key()].grad()));
  }
}

TEST_CASE("torch: checkpoint refuses an empty block and a block that returns nothing") {
  CHECK_DROPIT_ERROR(dt::checkpoint(dt::block_function{}, {::torch::ones({2})}), "block is empty");
  CHECK_DROPIT_ERROR(dt::checkpoint([](const variable_list&) { return variable_list{}; },
                                    {::torch::ones({2}).requires_grad_(true)}),
                     "returned no tensor");
  CHECK_DROPIT_ERROR(
      dt::checkpoint([](const variable_list&) { return variable_list{at::Tensor()}; },
                     {::torch::ones({2}).requires_grad_(true)}),
      "output 0 is undefined");
}
