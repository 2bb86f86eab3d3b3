// The memory planner: the model it leaves holds no more than the budget (measured here at the
// allocator, independently of the planner's own numbers), trains to the dense gradients where its
// tools are exact, restores the running statistics it disturbed, and rejects bad requests clearly.

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "torch_helpers.hpp"

namespace {

using namespace torch_test;
using dt::block_tool;
using dt::ConvertOptions;
using dt::DropitOptions;
using dt::PlanOptions;
namespace nn = ::torch::nn;

nn::Conv2d conv3x3(std::int64_t in, std::int64_t out) {
  return nn::Conv2d(nn::Conv2dOptions(in, out, 3).padding(1).bias(false));
}

/// (conv -> BatchNorm -> ReLU) twice, in a module of its own: LibTorch cannot hold a Sequential in
/// a Sequential.
struct ConvBlockImpl : nn::Module {
  ConvBlockImpl(std::int64_t in, std::int64_t out)
      : layers(register_module(
            "layers", nn::Sequential(conv3x3(in, out), nn::BatchNorm2d(out), nn::ReLU(),
                                     conv3x3(out, out), nn::BatchNorm2d(out), nn::ReLU()))) {}
  at::Tensor forward(const at::Tensor& x) { return layers->forward(x); }
  nn::Sequential layers;
};
TORCH_MODULE(ConvBlock);

/// Four blocks and a 1x1 head, each a child of the root Sequential.
nn::Sequential make_blocks(std::uint64_t seed) {
  ::torch::manual_seed(seed);
  return nn::Sequential(ConvBlock(3, 16), ConvBlock(16, 16), ConvBlock(16, 16), ConvBlock(16, 16),
                        nn::Conv2d(16, 4, 1));
}

/// Bytes the graph holds after forward (the loss excluded); then backward.
std::int64_t held_after_step(nn::Sequential& model, const at::Tensor& x) {
  model->zero_grad(/*set_to_none=*/true);
  dt::MemoryMeter meter;
  const std::int64_t base = meter.current();
  at::Tensor loss = model->forward(x).square().sum();
  const std::int64_t held = meter.current() - base - static_cast<std::int64_t>(loss.nbytes());
  loss.backward();
  return held;
}

/// x + attention(LayerNorm(x)), the attention softmax(q kᵀ / √d) v on the heads of one fused
/// projection: a SoftmaxAttention that recomputes its probabilities only through the projection.
struct AttentionBlockImpl : nn::Module {
  static constexpr std::int64_t dim = 16, heads = 2;
  AttentionBlockImpl()
      : norm(register_module("norm", nn::Sequential(nn::LayerNorm(nn::LayerNormOptions({dim}))))),
        qkv(register_module("qkv", nn::Sequential(nn::Linear(dim, 3 * dim)))),
        attention(register_module(
            "attention",
            nn::Sequential(dt::SoftmaxAttention(
                dt::SoftmaxAttentionOptions().recompute(false).only_through_layers(true))))) {}
  at::Tensor forward(const at::Tensor& x) {
    const std::int64_t batch = x.size(0), tokens = x.size(1);
    const at::Tensor parts = qkv->forward(norm->forward(x))
                                 .reshape({batch, tokens, 3, heads, dim / heads})
                                 .permute({2, 0, 3, 1, 4});
    const at::Tensor mixed = attention->begin()->forward<at::Tensor>(parts[0], parts[1], parts[2]);
    return x + mixed.transpose(1, 2).reshape(x.sizes());
  }
  nn::Sequential norm, qkv, attention;
};
TORCH_MODULE(AttentionBlock);

std::vector<at::Tensor> buffers_of(nn::Module& model) {
  std::vector<at::Tensor> copies;
  for (const auto& buffer : model.buffers()) copies.push_back(buffer.clone());
  return copies;
}

/// The gradients of `model` equal those of `reference` (the same weights, dense) on `x`, up to
/// `tolerance` of each gradient's largest magnitude.
void check_gradients_match(nn::Sequential& model, nn::Sequential& reference, const at::Tensor& x,
                           double tolerance) {
  const auto got = gradients(*model, x, [&](const at::Tensor& t) { return model->forward(t); });
  const auto want =
      gradients(*reference, x, [&](const at::Tensor& t) { return reference->forward(t); });
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    CHECK(max_abs_diff(got[i], want[i]) <= tolerance * want[i].abs().max().item<double>());
  }
}

}  // namespace

TEST_CASE("torch: plan_memory meets its budget, and the model it leaves trains as dense") {
  const at::Tensor x = ::torch::randn({8, 3, 20, 20});
  nn::Sequential dense = make_blocks(1);
  const std::int64_t dense_held = held_after_step(dense, x);

  for (const double budget : {0.6, 0.3}) {
    CAPTURE(budget);
    nn::Sequential model = make_blocks(1);
    nn::Sequential reference = make_blocks(1);
    // gamma 0: the DropIT caches of converted layers keep every value, so that the gradients
    // must match dense up to rounding whatever the plan (recomputation and checkpoints are exact).
    const PlanOptions options = PlanOptions().budget(budget).convert(
        ConvertOptions().relu(true).dropit(DropitOptions().gamma(0.0)));
    const dt::MemoryPlan plan = dt::plan_memory(
        model, [&] { return model->forward(x).square().sum(); }, options);
    std::ostringstream printed;
    printed << plan;
    MESSAGE(printed.str());

    CHECK(plan.met);
    CHECK(plan.dense_held == dense_held);
    CHECK(static_cast<double>(plan.planned_held) <= budget * static_cast<double>(dense_held));
    REQUIRE(plan.blocks.size() == 5);
    CHECK(plan.blocks[0].name == "0");
    CHECK(printed.str().find("4: ") != std::string::npos);
    // The head's 1x1 convolution reads a recomputable ReLU output; the first block's convolution
    // reads the data (skip_first), but its BatchNorm and ReLU convert.
    for (const auto& block : plan.blocks) CHECK(block.available[1]);
    // Recomputing through layers applies to the four blocks, whose second BatchNorm follows a
    // convolution with a recomputed input, and not to the head, a lone convolution.
    const auto recompute = static_cast<std::size_t>(block_tool::recompute);
    for (std::size_t b = 0; b < 4; ++b) {
      CAPTURE(b);
      CHECK(plan.blocks[b].available[recompute]);
    }
    CHECK_FALSE(plan.blocks[4].available[recompute]);

    // Measured here, on the model as the planner left it.
    const std::int64_t held = held_after_step(model, x);
    CHECK(held == plan.planned_held);
    CHECK(static_cast<double>(held) <= budget * static_cast<double>(dense_held));

    // The running statistics are as before planning; then one step moves them as torch's do.
    const std::vector<at::Tensor> buffers_after = buffers_of(*model);
    // held_after_step above ran one step: compare against a fresh copy's single step.
    held_after_step(reference, x);
    check_equal(buffers_after, buffers_of(*reference));

    check_gradients_match(model, reference, x, 1e-4);
  }
}

TEST_CASE(
    "torch: plan_memory reports the attention that recomputes only through layers, per block") {
  const at::Tensor x = ::torch::randn({4, 9, AttentionBlockImpl::dim});
  const auto make = [] {
    ::torch::manual_seed(6);
    return nn::Sequential(AttentionBlock(), AttentionBlock(), AttentionBlock());
  };
  nn::Sequential model = make(), reference = make();
  const dt::MemoryPlan plan = dt::plan_memory(
      model, [&] { return model->forward(x).square().sum(); },
      PlanOptions().budget(0.3).timing_rounds(1));
  std::ostringstream printed;
  printed << plan;
  MESSAGE(printed.str());
  CHECK(plan.met);
  CHECK(plan.converted.attention.empty());
  for (std::size_t b = 0; b < plan.blocks.size(); ++b) {
    CAPTURE(b);
    const bool converted =
        plan.blocks[b].tool == block_tool::convert || plan.blocks[b].tool == block_tool::recompute;
    const std::string name = std::to_string(b) + ".attention.0";
    const auto& listed = plan.converted.attention_through_layers;
    CHECK((std::find(listed.begin(), listed.end(), name) != listed.end()) == converted);
    if (converted)
      CHECK(printed.str().find("~ " + name + ": attention, its probabilities kept unless") !=
            std::string::npos);
  }
  // Kept blocks list no attention.
  nn::Sequential kept = make();
  CHECK(dt::plan_memory(
            kept, [&] { return kept->forward(x).square().sum(); },
            PlanOptions().budget(1.0).timing_rounds(1))
            .converted.attention_through_layers.empty());
  // Every tool is exact here: the gradients are dense's.
  check_gradients_match(model, reference, x, 1e-5);
}

TEST_CASE("torch: plan_memory keeps everything at budget 1 and reports a budget it cannot meet") {
  const at::Tensor x = ::torch::randn({4, 3, 16, 16});
  nn::Sequential model = make_blocks(2);
  const auto loss = [&] { return model->forward(x).square().sum(); };
  const dt::MemoryPlan all =
      dt::plan_memory(model, loss, PlanOptions().budget(1.0).timing_rounds(1));
  CHECK(all.met);
  CHECK(all.planned_held == all.dense_held);
  for (const auto& block : all.blocks) CHECK(block.tool == block_tool::keep);

  // A budget below what checkpointing every block holds: the most frugal plan, flagged.
  const dt::MemoryPlan tight =
      dt::plan_memory(model, loss, PlanOptions().budget(0.001).timing_rounds(1));
  CHECK_FALSE(tight.met);
  CHECK(tight.planned_held < tight.dense_held);
  std::ostringstream printed;
  printed << tight;
  CHECK(printed.str().find("budget NOT met") != std::string::npos);
}

TEST_CASE("torch: plan_memory measures bytes by forwards alone and reports what planning cost") {
  const at::Tensor x = ::torch::randn({4, 3, 16, 16});
  nn::Sequential model = make_blocks(4);
  int forwards = 0, backwards = 0;
  const auto loss = [&] {
    ++forwards;
    at::Tensor value = model->forward(x).square().sum();
    value.register_hook([&](const at::Tensor& grad) {
      ++backwards;
      return grad;
    });
    return value;
  };
  const auto plan_at = [&](double budget) {
    forwards = backwards = 0;
    const dt::MemoryPlan plan =
        dt::plan_memory(model, loss, PlanOptions().budget(budget).timing_rounds(2));
    CHECK(plan.planning_steps == backwards);
    CHECK(plan.planning_forwards == forwards - backwards);
    CHECK(plan.planning_seconds > 0.0);
    std::ostringstream printed;
    printed << plan;
    CHECK(printed.str().find(std::to_string(plan.planning_forwards) + " forwards, " +
                             std::to_string(plan.planning_steps) + " steps") != std::string::npos);
    return plan;
  };
  const dt::MemoryPlan loose = plan_at(1.0);
  const dt::MemoryPlan tight = plan_at(0.3);
  // A tighter budget tries more configurations, each measured by a forward alone; the steps
  // (forward and backward) are the timing's only: one to warm up, two a round of each comparison.
  CHECK(tight.planning_forwards > loose.planning_forwards);
  CHECK(tight.planning_steps == loose.planning_steps);
  CHECK(loose.planning_steps <= 1 + 6 * 2);
}

TEST_CASE("torch: checkpoint_each wraps every block: dense gradients and statistics, inputs held") {
  const at::Tensor x = ::torch::randn({4, 3, 16, 16});
  nn::Sequential dense = make_blocks(3), model = make_blocks(3);
  dt::checkpoint_each(*model);
  for (const auto& child : model->children())
    CHECK(std::dynamic_pointer_cast<dt::CheckpointImpl>(child) != nullptr);
  const std::int64_t dense_held = held_after_step(dense, x);
  const std::int64_t held = held_after_step(model, x);
  // The inputs of blocks 1-3 and of the head (block 0's is the data), 16 channels each; the
  // model's output, which the loss keeps; each checkpoint's random generator state (5 KiB).
  const std::int64_t activation = 4 * 16 * 16 * 16 * 4;
  CHECK(held >= 4 * activation + activation / 4);
  CHECK(held <= 4 * activation + activation / 4 + 5 * 5200);
  CHECK(held < dense_held * 3 / 10);
  check_equal(buffers_of(*model), buffers_of(*dense));
  check_equal(gradients(*model, x, [&](const at::Tensor& t) { return model->forward(t); }),
              gradients(*dense, x, [&](const at::Tensor& t) { return dense->forward(t); }));
}

namespace {

/// Blocks held by a C++ member and by a Sequential, for the containers option.
struct TwoPartsImpl : nn::Module {
  TwoPartsImpl()
      : stem(register_module("stem", nn::Conv2d(3, 8, 3))),
        body(register_module(
            "body", nn::Sequential(nn::BatchNorm2d(8), nn::ReLU(), nn::Conv2d(8, 8, 3)))) {}
  at::Tensor forward(const at::Tensor& x) { return body->forward(stem->forward(x)); }
  nn::Conv2d stem;
  nn::Sequential body;
};
TORCH_MODULE(TwoParts);

}  // namespace

TEST_CASE("torch: plan_memory finds the Sequentials holding the blocks, or names what is wrong") {
  const at::Tensor x = ::torch::randn({2, 3, 12, 12});
  TwoParts net;
  const auto loss = [&] { return net->forward(x).sum(); };
  const dt::MemoryPlan plan = dt::plan_memory(net, loss, PlanOptions().timing_rounds(1));
  REQUIRE(plan.blocks.size() == 3);  // body's children; the stem is no Sequential's child
  CHECK(plan.blocks[0].name == "body.0");

  CHECK(error_message([&] {
          dt::plan_memory(net, loss, PlanOptions().budget(0.0));
        }).find("budget 0 is outside (0, 1]") != std::string::npos);
  CHECK(error_message([&] {
          dt::plan_memory(net, loss, PlanOptions().budget(1.5));
        }).find("budget 1.5 is outside (0, 1]") != std::string::npos);
  CHECK(error_message([&] {
          dt::plan_memory(net, loss, PlanOptions().containers({"head"}));
        }).find("no module 'head'") != std::string::npos);
  CHECK(error_message([&] {
          dt::plan_memory(net, loss, PlanOptions().containers({"stem"}));
        }).find("'stem' is a torch::nn::Conv2dImpl, not a torch::nn::Sequential") !=
        std::string::npos);
  CHECK(error_message([&] {
          dt::plan_memory(
              net, [&] { return net->forward(x).sum().detach(); }, PlanOptions().timing_rounds(1));
        }).find("requires no gradient") != std::string::npos);
  CHECK(error_message([&] {
          dt::plan_memory(
              net, [&] { return net->forward(x); }, PlanOptions().timing_rounds(1));
        }).find("expected a scalar") != std::string::npos);
  net->eval();
  CHECK(error_message([&] { dt::plan_memory(net, loss); }).find("eval mode") != std::string::npos);
}
