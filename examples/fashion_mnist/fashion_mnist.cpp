// Trains a ResNet-style CNN or a small ViT on Fashion-MNIST, once dense and once per dropit
// variant, from the same initial weights and in the same data order, and compares test accuracy,
// peak training memory (measured at torch's allocator) and step time. After training it times the
// dense model's steps against each dropit model's, interleaved on one batch (--compare-steps).
//
//   dropit_fashion_mnist --demo       # CNN, 2 epochs on 20k images, dense vs dropit γ=0.9
//   dropit_fashion_mnist --model vit --epochs 5 --gamma 0.8,0.9
//   dropit_fashion_mnist --variants dropit --selection random,min_k --granularity element,channel
//   dropit_fashion_mnist --demo --budgets 0.5,0.3   # also the memory planner at two budgets
//   dropit_fashion_mnist --variants dense,dropit,dropit_only   # with and without recomputation
//
// Writes <out-dir>/settings.csv, epochs.csv (one row per variant and epoch), steps.csv (the
// training loss of every step), step_ratios.csv and curves.png (harness.hpp has the details).
// dropit's part is `convert` in `train`: the rest is an ordinary LibTorch training loop.

#include <dropit/torch.hpp>

#include <iostream>
#include <memory>
#include <sstream>
#include <vector>

#include "data.hpp"
#include "harness.hpp"
#include "models.hpp"
#include "threads.hpp"

namespace {

/// A model after training, with its optimizer (kept for the step comparison).
struct Trained {
  std::shared_ptr<fmnist::Classifier> model;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  fmnist::RunResult result;

  void step(const torch::Tensor& images, const torch::Tensor& labels) const {
    optimizer->zero_grad();
    torch::nn::functional::cross_entropy(model->forward(images), labels).backward();
    optimizer->step();
  }
};

/// SGD with Nesterov momentum for the CNN, AdamW for the ViT; `description` says which, as run.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const fmnist::Options& o,
                                                        fmnist::Classifier& model,
                                                        std::string* description = nullptr) {
  std::ostringstream text;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  if (o.model.kind == "cnn") {
    const auto options =
        torch::optim::SGDOptions(o.lr).momentum(0.9).nesterov(true).weight_decay(5e-4);
    text << "SGD, Nesterov momentum " << options.momentum() << ", weight decay "
         << options.weight_decay();
    optimizer = std::make_unique<torch::optim::SGD>(model.parameters(), options);
  } else {
    const auto options = torch::optim::AdamWOptions(o.lr).weight_decay(0.05);
    text << "AdamW, weight decay " << options.weight_decay();
    optimizer = std::make_unique<torch::optim::AdamW>(model.parameters(), options);
  }
  if (description) *description = text.str();
  return optimizer;
}

double evaluate(fmnist::Classifier& model, const fmnist::Split& test) {
  torch::NoGradGuard no_grad;
  model.eval();
  std::int64_t correct = 0;
  constexpr std::int64_t batch = 1000;
  for (std::int64_t start = 0; start < test.size(); start += batch) {
    const std::int64_t n = std::min(batch, test.size() - start);
    const torch::Tensor logits = model.forward(test.images.narrow(0, start, n));
    correct += logits.argmax(1).eq(test.labels.narrow(0, start, n)).sum().item<std::int64_t>();
  }
  model.train();
  return 100.0 * static_cast<double>(correct) / static_cast<double>(test.size());
}

Trained train(const fmnist::Options& o, const fmnist::Variant& variant,
              const fmnist::Classifier& reference, const fmnist::Dataset& data,
              fmnist::CsvWriter& csv) {
  dropit::torch::MemoryMeter meter;
  const std::int64_t live_before = meter.current();  // models trained before this one
  Trained run;
  run.model = fmnist::make_model(o.model);
  run.result.variant = variant;
  fmnist::copy_state(reference, *run.model);
  run.model->train();
  if (variant.dropit) {
    // The one dropit call: swap the model's Linear, Conv2d and ReLU layers for dropit's.
    const auto options =
        dropit::torch::ConvertOptions()
            .dropit(dropit::torch::DropitOptions()
                        .gamma(variant.gamma)
                        .selection(dropit::torch::selection_from_name(variant.selection))
                        .granularity(dropit::torch::granularity_from_name(variant.granularity))
                        .chunk_size(o.chunk_size)
                        .seed(o.seed)
                        .recompute(variant.recompute))
            .relu(o.relu_mask);
    if (variant.budget > 0) {
      // Or let the planner choose per block: keep, convert as above, recompute (convert, and
      // through one layer too) or checkpoint, measured on the first training batch.
      const std::int64_t batch = std::min(o.batch_size, data.train.size());
      const torch::Tensor images = data.train.images.narrow(0, 0, batch);
      const torch::Tensor labels = data.train.labels.narrow(0, 0, batch);
      const dropit::torch::MemoryPlan plan = dropit::torch::plan_memory(
          *run.model,
          [&] { return torch::nn::functional::cross_entropy(run.model->forward(images), labels); },
          dropit::torch::PlanOptions().budget(variant.budget).convert(options));
      std::cerr << variant.name() << ": " << plan << '\n';
    } else {
      const dropit::torch::ConvertReport report = dropit::torch::convert(*run.model, options);
      std::cerr << variant.name() << ": ";
      if (o.verbose) {
        std::cerr << report << '\n';
      } else {
        std::cerr << "converted " << report.converted.size() << " layers";
        for (const auto& [name, reason] : report.skipped)
          std::cerr << "; kept " << name << " (" << reason << ")";
        std::cerr << '\n';
      }
    }
  }
  run.optimizer = make_optimizer(o, *run.model);

  const std::int64_t n = data.train.size();
  const std::int64_t steps_per_epoch = (n + o.batch_size - 1) / o.batch_size;
  const std::int64_t total_steps = steps_per_epoch * o.epochs;
  std::int64_t global_step = 0;
  for (int epoch = 1; epoch <= o.epochs; ++epoch) {
    // The same permutation for every variant: it depends on the seed and the epoch only.
    torch::manual_seed(o.seed * 1000003 + static_cast<std::uint64_t>(epoch));
    const torch::Tensor order = torch::randperm(n, torch::kLong);
    fmnist::EpochLog log(run.result, epoch, steps_per_epoch);
    for (std::int64_t start = 0; start < n; start += o.batch_size, ++global_step) {
      const torch::Tensor index = order.narrow(0, start, std::min(o.batch_size, n - start));
      const torch::Tensor images = data.train.images.index_select(0, index);
      const torch::Tensor labels = data.train.labels.index_select(0, index);
      for (auto& group : run.optimizer->param_groups())
        group.options().set_lr(fmnist::learning_rate(o.lr, global_step, total_steps));

      const std::int64_t live = meter.current();
      std::int64_t peak = 0;
      double loss = 0;
      const double ms = fmnist::timed_step(meter, peak, [&] {
        run.optimizer->zero_grad();
        torch::Tensor batch_loss =
            torch::nn::functional::cross_entropy(run.model->forward(images), labels);
        batch_loss.backward();
        run.optimizer->step();
        loss = batch_loss.item<double>();
      });
      log.step(ms, loss, peak, live - live_before, index.size(0),
               /*measured=*/global_step > 0 || total_steps == 1);
      csv.step(variant, epoch, global_step, loss);
    }
    csv.flush();
    csv.epoch(o.model.kind, variant, log.finish(evaluate(*run.model, data.test)));
  }
  return run;
}

}  // namespace

int main(int argc, char** argv) {
  fmnist::ensure_passive_openmp_wait(argv);
  fmnist::Options o;
  if (const int status = fmnist::parse_options(argc, argv, o); status >= 0) return status;
  const std::vector<fmnist::Variant> variants = fmnist::variants_of(o);
  if (variants.empty()) {
    std::cerr << "nothing to train: --variants and the policy flags leave no variant\n";
    return 2;
  }

  try {
    fmnist::set_threads(o.threads);
    // Loaded before the first MemoryMeter exists, so the dataset is not counted as training memory.
    const fmnist::Dataset data = fmnist::load(o.data_dir, o.train_subset, o.test_subset);
    // Installs the counting allocator: every tensor from here on (weights included) is counted.
    dropit::torch::MemoryMeter meter;
    const std::filesystem::path out_dir = std::filesystem::absolute(o.out_dir);
    std::filesystem::create_directories(out_dir);
    fmnist::CsvWriter csv(out_dir);

    torch::manual_seed(o.seed);
    const std::shared_ptr<fmnist::Classifier> reference = fmnist::make_model(o.model);
    std::string optimizer;
    make_optimizer(o, *reference, &optimizer);
    csv.settings(o, data.train.size(), data.test.size(), optimizer);
    std::cout << "Fashion-MNIST " << o.model.kind << " (" << fmnist::parameter_count(*reference)
              << " parameters): " << o.epochs << " epoch(s) on " << data.train.size()
              << " training images, tested on " << data.test.size() << "; batch " << o.batch_size
              << ", " << optimizer << ", peak lr " << o.lr << ", " << o.threads
              << " thread(s), seed " << o.seed << '\n'
              << std::flush;

    std::vector<Trained> runs;
    for (const fmnist::Variant& variant : variants)
      runs.push_back(train(o, variant, *reference, data, csv));

    // Interleaved steps on the first training batch: dense against each dropit model.
    std::vector<fmnist::StepComparison> comparisons;
    const Trained* dense = runs.front().result.variant.dropit ? nullptr : &runs.front();
    const torch::Tensor images =
        data.train.images.narrow(0, 0, std::min(o.batch_size, data.train.size()));
    const torch::Tensor labels = data.train.labels.narrow(0, 0, images.size(0));
    for (const Trained& run : runs) {
      if (!dense || !run.result.variant.dropit || o.compare_steps == 0) continue;
      fmnist::StepComparison& c =
          comparisons.emplace_back(fmnist::StepComparison{run.result.variant, {}});
      for (int warm = 0; warm < 2; ++warm) {
        dense->step(images, labels);
        run.step(images, labels);
      }
      while (c.steps.pairs() < static_cast<std::size_t>(o.compare_steps))
        c.steps.pair(
            meter, [&] { dense->step(images, labels); }, [&] { run.step(images, labels); });
    }
    csv.comparisons(comparisons);

    std::vector<fmnist::RunResult> results;
    for (const Trained& run : runs) results.push_back(run.result);
    std::cout << '\n';
    fmnist::print_table(results, comparisons);
    std::cout << "wrote " << out_dir.string() << "/{settings,epochs,steps,step_ratios}.csv";
    if (o.plot && fmnist::plot(o, results, out_dir)) std::cout << " and curves.png";
    std::cout << '\n';
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << '\n';
    return 1;
  }
  return 0;
}
