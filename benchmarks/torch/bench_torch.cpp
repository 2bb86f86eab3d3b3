// dropit_bench_torch, against what a LibTorch user already runs:
// - train_step/<model>/dense_vs_<variant>/...: full training steps (forward, loss, backward,
//   optimizer step) of the two Fashion-MNIST example models, dense against one variant,
//   interleaved step by step on the same batch. Variants: dropit (convert: γ = 0.9, chunked min-k,
//   1-bit ReLU, exact recomputation after LayerNorm, GELU and BatchNorm -> ReLU), dropit_only (the
//   same without recomputation: DropIT caches only), recompute_only (recomputation where exact,
//   every other input kept as torch keeps it: DropitOptions::cache(false)), checkpoint (every
//   block checkpointed), plan (plan_memory at a budget). Counters: median step times, the median
//   of per-step time ratios, the bytes held after forward and the peak bytes a step allocates
//   above what was live before it (measured at torch's allocator by MemoryMeter).
// - weight_grad/<layer>/<variant>/gamma:<γ>: one weight gradient of each conv2d and linear layer of
//   the example models: LibTorch's own kernel on the dense input (torch_dense), dropit's sparse
//   kernel on the cache (dropit_sparse), densify + LibTorch's kernel (dropit_densify). The cost
//   model of dropit::torch::sparse_weight_grad_crossover is fitted to these.
// benchmarks/torch/report.py turns the JSON output into the tables of
// benchmarks/results/torch-<machine>.md.
//
// Environment: DROPIT_BENCH_THREADS (default: every core) sets torch's, OpenBLAS's and dropit's
// thread count; DROPIT_BENCH_BATCH (128); DROPIT_BENCH_STEPS (interleaved step pairs, 60);
// DROPIT_FASHION_MNIST_DATA_DIR (the unpacked idx files; random images when absent).

#include <benchmark/benchmark.h>

#include <dropit/torch.hpp>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "bench_context.hpp"
#include "data.hpp"
#include "models.hpp"
#include "step_timing.hpp"
#include "threads.hpp"

#ifndef DROPIT_BENCH_FASHION_MNIST_DIR
#define DROPIT_BENCH_FASHION_MNIST_DIR ""
#endif

namespace {

int env_int(const char* name, int fallback) {
  const char* value = std::getenv(name);
  const int parsed = value ? std::atoi(value) : 0;
  return parsed > 0 ? parsed : fallback;
}

struct Batch {
  torch::Tensor images, labels;
  std::string source;
};

/// The first `size` Fashion-MNIST training images when the data are there, random ones otherwise.
Batch make_batch(std::int64_t size) {
  const char* env = std::getenv("DROPIT_FASHION_MNIST_DATA_DIR");
  const std::string directory = env ? env : DROPIT_BENCH_FASHION_MNIST_DIR;
  try {
    fmnist::expect_files(directory);
    fmnist::Split split = fmnist::load_split(directory, /*train=*/true, size);
    if (split.size() == size) return {split.images, split.labels, "Fashion-MNIST training images"};
  } catch (const std::exception&) {
  }
  torch::manual_seed(1);
  return {torch::randn({size, 1, 28, 28}), torch::randint(0, 10, {size}, torch::kLong),
          "random normal images (Fashion-MNIST not found)"};
}

const Batch& batch() {
  static const Batch b = make_batch(env_int("DROPIT_BENCH_BATCH", 128));
  return b;
}

/// How a variant treats the model: dense, dropit (convert), dropit_only, recompute_only,
/// checkpoint (every block), plan.
struct Variant {
  std::string name;
  double budget = 0.0;  // plan
};

/// An example model, dense or as a variant, with its optimizer and one training step.
struct Trainer {
  std::shared_ptr<fmnist::Classifier> model;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  dropit::torch::MemoryPlan plan;

  Trainer(const std::string& kind, const Variant& variant, const Batch& data) {
    namespace dt = dropit::torch;
    fmnist::ModelConfig config;
    config.kind = kind;
    torch::manual_seed(0);
    model = fmnist::make_model(config);
    model->train();
    const dt::ConvertOptions convert =
        dt::ConvertOptions()
            .dropit(dt::DropitOptions().gamma(0.9).selection(dropit::selection_kind::chunked_min_k))
            .relu(true);
    if (variant.name == "dropit") dt::convert(*model, convert);
    if (variant.name == "dropit_only")  // DropIT caches everywhere, no recomputation
      dt::convert(*model, dt::ConvertOptions(convert).dropit(
                              dt::DropitOptions(convert.dropit()).recompute(false)));
    if (variant.name == "recompute_only")  // exact: recomputation, torch's saving elsewhere
      dt::convert(*model, dt::ConvertOptions(convert).dropit(
                              dt::DropitOptions(convert.dropit()).cache(false)));
    if (variant.name == "checkpoint")
      dt::checkpoint_each(*model->named_children()["blocks"]->as<torch::nn::Sequential>());
    if (variant.name == "plan") {
      plan = dt::plan_memory(
          *model, [&] { return loss(data); },
          dt::PlanOptions().budget(variant.budget).convert(convert));
      std::cerr << kind << ": " << plan << "\n";
    }
    // The optimizers of the training example: SGD with momentum for the CNN, AdamW for the ViT.
    if (kind == "cnn")
      optimizer = std::make_unique<torch::optim::SGD>(
          model->parameters(),
          torch::optim::SGDOptions(0.01).momentum(0.9).nesterov(true).weight_decay(5e-4));
    else
      optimizer = std::make_unique<torch::optim::AdamW>(
          model->parameters(), torch::optim::AdamWOptions(1e-4).weight_decay(0.05));
  }

  torch::Tensor loss(const Batch& data) {
    return torch::nn::functional::cross_entropy(model->forward(data.images), data.labels);
  }

  void step(const Batch& data) {
    optimizer->zero_grad();
    loss(data).backward();
    optimizer->step();
  }

  /// Bytes the graph holds after forward (the loss excluded), measured at the allocator.
  std::int64_t held_after_forward(const Batch& data) {
    optimizer->zero_grad();
    dropit::torch::MemoryMeter meter;
    const std::int64_t base = meter.current();
    torch::Tensor value = loss(data);
    const std::int64_t held = meter.current() - base - static_cast<std::int64_t>(value.nbytes());
    value.backward();
    optimizer->zero_grad();
    return held;
  }
};

/// One trainer per model and variant for the whole run: a plan is made once, not once per
/// repetition.
Trainer& trainer(const std::string& kind, const Variant& variant) {
  static std::map<std::string, std::unique_ptr<Trainer>> trainers;
  auto& slot = trainers[kind + "/" + variant.name + "/" + std::to_string(variant.budget)];
  if (!slot) slot = std::make_unique<Trainer>(kind, variant, batch());
  return *slot;
}

/// Dense and variant training steps of one model, interleaved on the same batch (step_timing.hpp,
/// shared with the training example). Each iteration is one step of each; the counters are medians
/// over the iterations, the time ratio the median of per-iteration ratios.
void train_step(benchmark::State& state, const std::string& kind, const Variant& variant) {
  Trainer& dense = trainer(kind, {"dense"});
  Trainer& dropit = trainer(kind, variant);
  const Batch& data = batch();
  dropit::torch::MemoryMeter meter;
  for (int warm = 0; warm < 2; ++warm) {  // allocates the gradients and the optimizer state
    dense.step(data);
    dropit.step(data);
  }
  fmnist::InterleavedSteps steps;
  for (auto _ : state) {
    steps.pair(
        meter, [&] { dense.step(data); }, [&] { dropit.step(data); });
    state.SetIterationTime(steps.last_pair_ms() / 1e3);
  }
  state.counters["dense_ms"] = steps.dense_ms();
  state.counters["dropit_ms"] = steps.dropit_ms();
  state.counters["time_ratio"] = steps.time_ratio();
  state.counters["dense_peak_bytes"] = static_cast<double>(steps.dense_peak());
  state.counters["dropit_peak_bytes"] = static_cast<double>(steps.dropit_peak());
  state.counters["peak_ratio"] = steps.peak_ratio();
  state.counters["parameters"] = static_cast<double>(fmnist::parameter_count(*dense.model));
  const std::int64_t dense_held = dense.held_after_forward(data);
  const std::int64_t held = dropit.held_after_forward(data);
  state.counters["dense_held_bytes"] = static_cast<double>(dense_held);
  state.counters["dropit_held_bytes"] = static_cast<double>(held);
  state.counters["held_ratio"] = static_cast<double>(held) / static_cast<double>(dense_held);
  if (variant.name == "plan") {
    std::array<std::int64_t, dropit::block_tool_count> tools{};
    for (const auto& block : dropit.plan.blocks) ++tools[static_cast<std::size_t>(block.tool)];
    const auto count = [&](dropit::block_tool tool) {
      return static_cast<double>(tools[static_cast<std::size_t>(tool)]);
    };
    state.counters["plan_kept"] = count(dropit::block_tool::keep);
    state.counters["plan_converted"] = count(dropit::block_tool::convert);
    state.counters["plan_recomputed"] = count(dropit::block_tool::recompute);
    state.counters["plan_checkpointed"] = count(dropit::block_tool::checkpoint);
    state.counters["plan_met"] = dropit.plan.met ? 1.0 : 0.0;
  }
}

// --- One layer's weight gradient: dropit's two paths against LibTorch's own kernel ---------------

/// A conv2d or linear layer of the example models, at the benchmark's batch.
struct Layer {
  std::string name;
  std::vector<std::int64_t> input, weight;  // conv2d: NCHW and [C_out, C_in, KH, KW]
  std::int64_t stride = 1, padding = 0;
  bool conv = true;
};

std::vector<Layer> example_layers(std::int64_t batch) {
  const std::int64_t tokens = batch * 17;  // the ViT: 16 patches and a class token per image
  return {
      {"cnn_conv_16x16_k3_28", {batch, 16, 28, 28}, {16, 16, 3, 3}, 1, 1},
      {"cnn_conv_16x32_k3_s2_28", {batch, 16, 28, 28}, {32, 16, 3, 3}, 2, 1},
      {"cnn_shortcut_16x32_k1_s2_28", {batch, 16, 28, 28}, {32, 16, 1, 1}, 2, 0},
      {"cnn_conv_32x32_k3_14", {batch, 32, 14, 14}, {32, 32, 3, 3}, 1, 1},
      {"cnn_conv_32x64_k3_s2_14", {batch, 32, 14, 14}, {64, 32, 3, 3}, 2, 1},
      {"cnn_conv_64x64_k3_7", {batch, 64, 7, 7}, {64, 64, 3, 3}, 1, 1},
      {"vit_qkv_96x288", {tokens, 96}, {288, 96}, 1, 0, false},
      {"vit_proj_96x96", {tokens, 96}, {96, 96}, 1, 0, false},
      {"vit_mlp_96x192", {tokens, 96}, {192, 96}, 1, 0, false},
      {"vit_mlp_192x96", {tokens, 192}, {96, 192}, 1, 0, false},
  };
}

enum class GradVariant { torch_dense, dropit_sparse, dropit_densify };

void weight_grad(benchmark::State& state, const Layer& layer, double gamma, GradVariant variant) {
  namespace dt = dropit::torch;
  torch::manual_seed(3);
  // Post-ReLU activations, as the example models' layers see them.
  const at::Tensor x = torch::relu(torch::randn(layer.input));
  const at::Tensor w = torch::randn(layer.weight);
  const dropit::conv2d_params params =
      dt::conv2d_params_of({layer.stride, layer.stride}, {layer.padding, layer.padding}, {1, 1}, 1);
  const at::Tensor dz =
      torch::randn_like(layer.conv ? at::conv2d(x, w, {}, dt::torch_pair(params.stride),
                                                dt::torch_pair(params.padding))
                                   : at::linear(x, w));
  const dt::saved_cache cache =
      dt::compress(x, dt::DropitOptions().gamma(gamma).spec(layer.conv ? 1 : -1, 0));
  const dt::weight_grad_path path = variant == GradVariant::dropit_sparse
                                        ? dt::weight_grad_path::sparse
                                        : dt::weight_grad_path::densify;
  auto run = [&] {
    if (variant == GradVariant::torch_dense)
      return layer.conv
                 ? std::get<1>(dt::dense_conv2d_backward(dz, x, w, params, {false, true, false}))
                 : at::mm(dz.t(), x);
    return layer.conv ? dt::conv2d_weight_grad(cache, dz, w.sizes(), params, path)
                      : dt::linear_weight_grad(cache, dz, path);
  };
  for (auto _ : state) {
    at::Tensor dw = run();
    benchmark::DoNotOptimize(dw.data_ptr());
  }
  const auto taps = layer.conv ? layer.weight[2] * layer.weight[3] : 1;
  state.counters["row_width"] = static_cast<double>(layer.weight[0]);
  state.counters["kept_fraction"] =
      static_cast<double>(cache.layout.kept()) / static_cast<double>(x.numel());
  state.counters["taps"] = static_cast<double>(taps);
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

  const int threads =
      env_int("DROPIT_BENCH_THREADS", static_cast<int>(std::thread::hardware_concurrency()));
  fmnist::set_threads(threads);
  const std::string count = std::to_string(threads);
  bench::add_common_context(threads,
                            "at::set_num_threads(" + count + ") (reads back " +
                                std::to_string(at::get_num_threads()) +
                                "): torch's intra-op pool and dropit's CPU backend; OpenBLAS " +
                                (openblas_set_num_threads ? count : std::string("not found")),
                            "OpenBLAS in the dense ViT step (2x)");
  benchmark::AddCustomContext("torch_version", TORCH_VERSION);
  benchmark::AddCustomContext("inputs", batch().source);
  benchmark::AddCustomContext("batch", std::to_string(batch().images.size(0)));

  const std::string b = "/B:" + std::to_string(batch().images.size(0));
  const std::pair<const char*, GradVariant> variants[] = {
      {"torch_dense", GradVariant::torch_dense},
      {"dropit_sparse", GradVariant::dropit_sparse},
      {"dropit_densify", GradVariant::dropit_densify}};
  for (const Layer& layer : example_layers(batch().images.size(0)))
    for (const double gamma : {0.9, 0.95, 0.97, 0.99})
      for (const auto& [variant_name, variant] : variants) {
        if (variant == GradVariant::torch_dense && gamma != 0.9) continue;  // γ does not apply
        const std::string name =
            "weight_grad/" + layer.name + "/" + variant_name +
            (variant == GradVariant::torch_dense ? std::string()
                                                 : "/gamma:" + std::to_string(gamma).substr(0, 4)) +
            b;
        benchmark::RegisterBenchmark(name.c_str(),
                                     [layer, gamma, variant](benchmark::State& state) {
                                       weight_grad(state, layer, gamma, variant);
                                     })
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
      }
  const int steps = env_int("DROPIT_BENCH_STEPS", 60);
  const std::pair<std::string, Variant> step_variants[] = {
      {"dense_vs_dropit_chunked_min_k/gamma:0.9", {"dropit"}},
      {"dense_vs_dropit_only/gamma:0.9", {"dropit_only"}},
      {"dense_vs_recompute_only", {"recompute_only"}},
      {"dense_vs_checkpoint", {"checkpoint"}},
      {"dense_vs_plan/budget:0.5", {"plan", 0.5}},
      {"dense_vs_plan/budget:0.3", {"plan", 0.3}}};
  for (const std::string kind : {"cnn", "vit"})
    for (const auto& [variant_name, variant] : step_variants) {
      const std::string name = "train_step/" + kind + "/" + variant_name + b;
      benchmark::RegisterBenchmark(
          name.c_str(),
          [kind, variant](benchmark::State& state) { train_step(state, kind, variant); })
          ->Unit(benchmark::kMillisecond)
          ->Iterations(steps)
          ->UseManualTime();
    }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
