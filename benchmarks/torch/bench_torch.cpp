// dropit_bench_torch: one full training step (forward, loss, backward, optimizer step) of the two
// Fashion-MNIST example models, dense and converted to dropit (γ = 0.9, chunked min-k, 1-bit ReLU),
// on the same batch, in the same run. Time per step is the benchmark's time; the peak bytes a step
// allocates above what was live before it (measured at torch's allocator by MemoryMeter) are the
// counters. benchmarks/torch/report.py turns the JSON output into the dropit/dense ratio table.
//
// Names: train_step/<model>/<variant>/B:<batch>, variant = dense | dropit_chunked_min_k_gamma:0.9.
// Environment: DROPIT_BENCH_THREADS (default: every core) sets torch's, OpenBLAS's and dropit's
// thread count; DROPIT_BENCH_BATCH (128); DROPIT_FASHION_MNIST_DATA_DIR (the unpacked idx files;
// random images when absent).

#include <benchmark/benchmark.h>

#include <dropit/torch.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "data.hpp"
#include "models.hpp"
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

void train_step(benchmark::State& state, const std::string& kind, bool use_dropit) {
  fmnist::ModelConfig config;
  config.kind = kind;
  torch::manual_seed(0);
  std::shared_ptr<fmnist::Classifier> model = fmnist::make_model(config);
  model->train();
  if (use_dropit) {
    dropit::torch::convert(*model, dropit::torch::ConvertOptions()
                                       .dropit(dropit::torch::DropitOptions().gamma(0.9).selection(
                                           dropit::selection_kind::chunked_min_k))
                                       .relu(true));
  }
  // The optimizers of the training example: SGD with momentum for the CNN, AdamW for the ViT.
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  if (kind == "cnn")
    optimizer = std::make_unique<torch::optim::SGD>(
        model->parameters(),
        torch::optim::SGDOptions(0.01).momentum(0.9).nesterov(true).weight_decay(5e-4));
  else
    optimizer = std::make_unique<torch::optim::AdamW>(
        model->parameters(), torch::optim::AdamWOptions(1e-4).weight_decay(0.05));

  const Batch& data = batch();
  auto step = [&] {
    optimizer->zero_grad();
    torch::Tensor loss =
        torch::nn::functional::cross_entropy(model->forward(data.images), data.labels);
    loss.backward();
    optimizer->step();
  };
  dropit::torch::MemoryMeter meter;
  step();  // allocates the gradients and the optimizer state
  step();

  std::int64_t peak = 0, live = 0;
  for (auto _ : state) {
    live = meter.current();
    meter.reset_peak();
    step();
    peak = std::max(peak, meter.peak() - live);
  }
  state.counters["peak_step_bytes"] = static_cast<double>(peak);
  state.counters["peak_step_MiB"] = static_cast<double>(peak) / (1024.0 * 1024.0);
  state.counters["persistent_bytes"] = static_cast<double>(live);
  state.counters["images_per_s"] = benchmark::Counter(
      static_cast<double>(data.images.size(0)) * static_cast<double>(state.iterations()),
      benchmark::Counter::kIsRate);
  state.counters["parameters"] = static_cast<double>(fmnist::parameter_count(*model));
}

std::string cpu_model() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);)
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(" \t", colon + 1));
    }
  return "unknown";
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

  const int threads =
      env_int("DROPIT_BENCH_THREADS", static_cast<int>(std::thread::hardware_concurrency()));
  fmnist::set_threads(threads);
  const std::string count = std::to_string(threads);
  benchmark::AddCustomContext("cpu_model", cpu_model());
  benchmark::AddCustomContext("threads", count);
  benchmark::AddCustomContext("threading",
                              "at::set_num_threads(" + count + ") (reads back " +
                                  std::to_string(at::get_num_threads()) +
                                  "): torch's intra-op pool and dropit's CPU backend; OpenBLAS " +
                                  (openblas_set_num_threads ? count : std::string("not found")));
  benchmark::AddCustomContext("torch_version", TORCH_VERSION);
  benchmark::AddCustomContext("inputs", batch().source);
  benchmark::AddCustomContext("batch", std::to_string(batch().images.size(0)));
  const char* wait_policy = std::getenv("OMP_WAIT_POLICY");
  benchmark::AddCustomContext("omp_wait_policy", wait_policy ? wait_policy : "unset");
  if (wait_policy == nullptr && std::getenv("GOMP_SPINCOUNT") == nullptr)
    std::fprintf(stderr,
                 "warning: OMP_WAIT_POLICY is unset; spinning OpenMP threads slow OpenBLAS (the "
                 "ViT's dense step ran 2x slower). benchmarks/torch/run.sh sets it to passive.\n");
#if defined(__VERSION__)
  benchmark::AddCustomContext("compiler", __VERSION__);
#endif
#if defined(DROPIT_BENCH_BUILD_TYPE)
  benchmark::AddCustomContext("build", std::string(DROPIT_BENCH_BUILD_TYPE) + ", -O3" +
                                           (DROPIT_BENCH_NATIVE ? " -march=native" : ""));
#endif

  const std::string b = "/B:" + std::to_string(batch().images.size(0));
  for (const std::string kind : {"cnn", "vit"}) {
    for (const bool use_dropit : {false, true}) {
      const std::string name = "train_step/" + kind + "/" +
                               (use_dropit ? "dropit_chunked_min_k/gamma:0.9" : "dense") + b;
      benchmark::RegisterBenchmark(
          name.c_str(),
          [kind, use_dropit](benchmark::State& state) { train_step(state, kind, use_dropit); })
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
