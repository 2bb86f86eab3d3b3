// Trains a ResNet-style CNN or a small ViT on Fashion-MNIST, once dense and once per dropit
// variant, from the same initial weights and in the same data order, and compares test accuracy,
// peak training memory (measured at torch's allocator) and step time.
//
//   dropit_fashion_mnist --demo       # CNN, 2 epochs on 20k images, dense vs dropit γ=0.9
//   dropit_fashion_mnist --model vit --epochs 5 --gamma 0.8,0.9
//   dropit_fashion_mnist --variants dropit --selection random,min_k --granularity element,channel
//
// Writes <out-dir>/epochs.csv (one row per variant and epoch), <out-dir>/steps.csv (the training
// loss of every step) and <out-dir>/curves.png (gnuplot: loss and accuracy curves per variant).

#include <CLI/CLI.hpp>
#include <dropit/torch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "data.hpp"
#include "models.hpp"
#include "threads.hpp"

#ifndef DROPIT_FASHION_MNIST_DATA_DIR
#define DROPIT_FASHION_MNIST_DATA_DIR "data"
#endif

namespace {

using clock_type = std::chrono::steady_clock;

struct Options {
  fmnist::ModelConfig model;
  int epochs = 3;
  std::int64_t batch_size = 128;
  std::int64_t train_subset = 0;  // 0: all 60000
  std::int64_t test_subset = 0;   // 0: all 10000
  std::vector<std::string> variants{"dense", "dropit"};
  std::vector<double> gammas{0.9};
  std::vector<std::string> selections{"chunked_min_k"};
  std::vector<std::string> granularities{"element"};
  std::int64_t chunk_size = dropit::default_chunk_size;
  bool relu_mask = true;
  double lr = 0;  // 0: the model's default
  std::uint64_t seed = 0;
  int threads = 0;
  std::string data_dir = DROPIT_FASHION_MNIST_DATA_DIR;
  std::string out_dir = "fashion_mnist_results";
  bool plot = true;
  bool verbose = false;
};

/// One training run: the dense baseline or one dropit policy.
struct Variant {
  bool dropit = false;
  std::string selection = "-", granularity = "-";
  double gamma = 0;

  std::string name() const {
    if (!dropit) return "dense";
    std::ostringstream s;
    s << "dropit " << selection << (granularity == "channel" ? " channel" : "") << " g=" << gamma;
    return s.str();
  }
};

struct EpochResult {
  int epoch = 0;
  double train_loss = 0, test_accuracy = 0;
  std::int64_t peak_step_bytes = 0;   // allocated during a step above what was live before it
  std::int64_t persistent_bytes = 0;  // live before a step: weights, gradients, optimizer state
  double step_ms_mean = 0, step_ms_median = 0, images_per_s = 0;
};

struct RunResult {
  Variant variant;
  std::vector<EpochResult> epochs;
  std::vector<double> loss_curve;  // mean of the last few steps' losses, one entry per step
  std::int64_t peak_step_bytes = 0;
  double step_ms_median = 0;
};

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  const auto middle = values.begin() + static_cast<std::ptrdiff_t>(values.size() / 2);
  std::nth_element(values.begin(), middle, values.end());
  return *middle;
}

double mean(const std::vector<double>& values) {
  return values.empty() ? 0 : std::accumulate(values.begin(), values.end(), 0.0) / values.size();
}

double mib(std::int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

/// A one-line progress bar on stderr. On a terminal it redraws in place; otherwise (a log file) it
/// prints a line at each quarter of the epoch.
class Progress {
 public:
  Progress(std::string label, std::int64_t steps)
      : label_(std::move(label)), steps_(steps), tty_(isatty(STDERR_FILENO) != 0) {}

  void update(std::int64_t step, std::int64_t images, double loss, double seconds) {
    const bool last = step == steps_;
    if (tty_) {
      const auto now = clock_type::now();
      if (!last && now - drawn_ < std::chrono::milliseconds(100)) return;
      drawn_ = now;
    } else {
      const std::int64_t quarter = step * 4 / steps_;
      if (quarter == quarter_ && !last) return;
      quarter_ = quarter;
      if (quarter == 0) return;
    }
    constexpr int width = 24;
    const int filled = static_cast<int>(width * step / steps_);
    const double rate = seconds > 0 ? images / seconds : 0;
    const double eta = rate > 0 ? (steps_ - step) * (images / static_cast<double>(step)) / rate : 0;
    std::fprintf(stderr, "%s%-32s [%s%s] %4lld/%lld  loss %.4f  %6.0f img/s  eta %3.0fs%s",
                 tty_ ? "\r" : "", label_.c_str(), std::string(filled, '#').c_str(),
                 std::string(width - filled, '.').c_str(), static_cast<long long>(step),
                 static_cast<long long>(steps_), loss, rate, eta, tty_ && !last ? "" : "\n");
    std::fflush(stderr);
  }

 private:
  std::string label_;
  std::int64_t steps_;
  bool tty_;
  clock_type::time_point drawn_{};
  std::int64_t quarter_ = 0;
};

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

/// Learning rate at `step` of `total`: linear warm-up over the first 3 %, then cosine to zero.
double learning_rate(double peak, std::int64_t step, std::int64_t total) {
  const double warmup = std::max<double>(1.0, 0.03 * static_cast<double>(total));
  const double progress =
      static_cast<double>(step) / static_cast<double>(std::max<std::int64_t>(total, 1));
  return peak * std::min(1.0, (step + 1) / warmup) * 0.5 * (1.0 + std::cos(M_PI * progress));
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const Options& o,
                                                        fmnist::Classifier& model) {
  if (o.model.kind == "cnn")
    return std::make_unique<torch::optim::SGD>(
        model.parameters(),
        torch::optim::SGDOptions(o.lr).momentum(0.9).nesterov(true).weight_decay(5e-4));
  return std::make_unique<torch::optim::AdamW>(model.parameters(),
                                               torch::optim::AdamWOptions(o.lr).weight_decay(0.05));
}

class CsvWriter {
 public:
  explicit CsvWriter(const std::filesystem::path& directory)
      : epochs_(directory / "epochs.csv"), steps_(directory / "steps.csv") {
    if (!epochs_ || !steps_)
      throw std::runtime_error("cannot write CSV files in " + directory.string());
    epochs_ << "model,variant,selection,granularity,gamma,epoch,train_loss,test_accuracy,"
               "peak_step_bytes,persistent_bytes,step_ms_mean,step_ms_median,images_per_s\n";
    steps_ << "variant,epoch,step,loss\n";
  }

  void epoch(const std::string& model, const Variant& v, const EpochResult& r) {
    epochs_ << model << ',' << v.name() << ',' << v.selection << ',' << v.granularity << ','
            << v.gamma << ',' << r.epoch << ',' << std::setprecision(6) << r.train_loss << ','
            << r.test_accuracy << ',' << r.peak_step_bytes << ',' << r.persistent_bytes << ','
            << r.step_ms_mean << ',' << r.step_ms_median << ',' << r.images_per_s << '\n'
            << std::flush;
  }

  void step(const Variant& v, int epoch, std::int64_t step, double loss) {
    steps_ << v.name() << ',' << epoch << ',' << step << ',' << loss << '\n';
  }

  void flush() { steps_.flush(); }

 private:
  std::ofstream epochs_, steps_;
};

RunResult train(const Options& o, const Variant& variant, const fmnist::Classifier& reference,
                const fmnist::Dataset& data, CsvWriter& csv) {
  torch::manual_seed(o.seed);
  std::shared_ptr<fmnist::Classifier> model = fmnist::make_model(o.model);
  fmnist::copy_state(reference, *model);
  model->train();
  if (variant.dropit) {
    const auto options =
        dropit::torch::ConvertOptions()
            .dropit(dropit::torch::DropitOptions()
                        .gamma(variant.gamma)
                        .selection(dropit::torch::selection_from_name(variant.selection))
                        .granularity(dropit::torch::granularity_from_name(variant.granularity))
                        .chunk_size(o.chunk_size)
                        .seed(o.seed))
            .relu(o.relu_mask);
    const dropit::torch::ConvertReport report = dropit::torch::convert(*model, options);
    if (o.verbose) {
      std::cerr << variant.name() << ": " << report << '\n';
    } else {
      std::cerr << variant.name() << ": converted " << report.converted.size() << " layers";
      for (const auto& [name, reason] : report.skipped)
        std::cerr << "; kept " << name << " (" << reason << ")";
      std::cerr << '\n';
    }
  }
  auto optimizer = make_optimizer(o, *model);

  RunResult result;
  result.variant = variant;
  dropit::torch::MemoryMeter meter;
  const std::int64_t n = data.train.size();
  const std::int64_t steps_per_epoch = (n + o.batch_size - 1) / o.batch_size;
  const std::int64_t total_steps = steps_per_epoch * o.epochs;
  std::vector<double> all_step_ms;
  std::vector<double> recent_losses;
  std::int64_t global_step = 0;

  for (int epoch = 1; epoch <= o.epochs; ++epoch) {
    // The same permutation for every variant: it depends on the seed and the epoch only.
    torch::manual_seed(o.seed * 1000003 + static_cast<std::uint64_t>(epoch));
    const torch::Tensor order = torch::randperm(n, torch::kLong);
    Progress progress(variant.name() + " ep " + std::to_string(epoch), steps_per_epoch);
    EpochResult r;
    r.epoch = epoch;
    std::vector<double> step_ms, losses;
    const auto epoch_start = clock_type::now();
    for (std::int64_t step = 0; step < steps_per_epoch; ++step, ++global_step) {
      const std::int64_t start = step * o.batch_size;
      const torch::Tensor index = order.narrow(0, start, std::min(o.batch_size, n - start));
      const torch::Tensor images = data.train.images.index_select(0, index);
      const torch::Tensor labels = data.train.labels.index_select(0, index);
      for (auto& group : optimizer->param_groups())
        group.options().set_lr(learning_rate(o.lr, global_step, total_steps));

      const std::int64_t live = meter.current();
      meter.reset_peak();
      const auto t0 = clock_type::now();
      optimizer->zero_grad();
      torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(images), labels);
      loss.backward();
      optimizer->step();
      const auto t1 = clock_type::now();
      const double loss_value = loss.item<double>();
      loss = torch::Tensor();

      // The first step of a run allocates the gradients and the optimizer state; it is left out of
      // the peak and the timings so that they describe the steady state.
      if (global_step > 0 || total_steps == 1) {
        r.peak_step_bytes = std::max(r.peak_step_bytes, meter.peak() - live);
        r.persistent_bytes = std::max(r.persistent_bytes, live);
        step_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      }
      losses.push_back(loss_value);
      recent_losses.push_back(loss_value);
      if (recent_losses.size() > 25) recent_losses.erase(recent_losses.begin());
      result.loss_curve.push_back(mean(recent_losses));
      csv.step(variant, epoch, global_step, loss_value);
      if (!std::isfinite(loss_value))
        std::cerr << variant.name() << ": loss is " << loss_value << " at step " << global_step
                  << '\n';
      const double seconds = std::chrono::duration<double>(clock_type::now() - epoch_start).count();
      progress.update(step + 1, start + index.size(0), mean(losses), seconds);
    }
    const double seconds = std::chrono::duration<double>(clock_type::now() - epoch_start).count();
    csv.flush();
    r.train_loss = mean(losses);
    r.step_ms_mean = mean(step_ms);
    r.step_ms_median = median(step_ms);
    r.images_per_s = static_cast<double>(n) / seconds;
    r.test_accuracy = evaluate(*model, data.test);
    std::cerr << "  epoch " << epoch << ": train loss " << std::fixed << std::setprecision(4)
              << r.train_loss << ", test accuracy " << std::setprecision(2) << r.test_accuracy
              << " %, peak step memory " << mib(r.peak_step_bytes) << " MiB, step "
              << std::setprecision(1) << r.step_ms_median << " ms" << std::defaultfloat << '\n';
    csv.epoch(o.model.kind, variant, r);
    result.peak_step_bytes = std::max(result.peak_step_bytes, r.peak_step_bytes);
    all_step_ms.insert(all_step_ms.end(), step_ms.begin(), step_ms.end());
    result.epochs.push_back(r);
  }
  result.step_ms_median = median(all_step_ms);
  return result;
}

std::string quote(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

/// curves.png: training loss per step (left) and test accuracy per epoch (right), one line per
/// variant. Returns false when gnuplot is missing or fails.
bool plot(const Options& o, const std::vector<RunResult>& runs, const std::filesystem::path& dir) {
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) {
    std::cerr << "gnuplot not found (Debian: gnuplot-nox): no plot\n";
    return false;
  }
  const auto data_path = dir / "curves.dat";
  const auto script_path = dir / "curves.gp";
  {
    std::ofstream data(data_path);
    for (const RunResult& run : runs) {  // index 2i: loss per step; 2i+1: accuracy per epoch
      data << "# " << run.variant.name() << ": step, mean loss of the last 25 steps\n";
      for (std::size_t i = 0; i < run.loss_curve.size(); ++i)
        data << i + 1 << ' ' << run.loss_curve[i] << '\n';
      data << "\n\n# " << run.variant.name() << ": epoch, test accuracy\n";
      for (const EpochResult& e : run.epochs) data << e.epoch << ' ' << e.test_accuracy << '\n';
      data << "\n\n";
    }
  }
  std::ofstream gp(script_path);
  gp << "set terminal pngcairo size 1400,560 noenhanced font ',10'\n"
     << "set output " << quote((dir / "curves.png").string()) << "\n"
     << "set datafile commentschars '#'\nset grid\n"
     << "set multiplot layout 1,2 title "
     << quote("Fashion-MNIST, " + o.model.kind + ": dense vs dropit") << "\n"
     << "set xlabel 'training step'\nset ylabel 'training loss (mean of the last 25 steps)'\n"
     << "set key top right\n"
     << "plot ";
  for (std::size_t i = 0; i < runs.size(); ++i)
    gp << (i ? ", \\\n     " : "") << quote(data_path.string()) << " index " << 2 * i
       << " using 1:2 with lines lw 2 title " << quote(runs[i].variant.name());
  gp << "\nset xlabel 'epoch'\nset ylabel 'test accuracy (%)'\nset key bottom right\n"
     << "set xrange [0.5:" << o.epochs + 0.5 << "]\nset xtics 1\n"
     << "plot ";
  for (std::size_t i = 0; i < runs.size(); ++i)
    gp << (i ? ", \\\n     " : "") << quote(data_path.string()) << " index " << 2 * i + 1
       << " using 1:2 with linespoints lw 2 pt 7 title " << quote(runs[i].variant.name());
  gp << "\nunset multiplot\n";
  gp.close();
  const std::string command = "gnuplot " + quote(script_path.string());
  if (std::system(command.c_str()) != 0) {
    std::cerr << "gnuplot failed on " << script_path << '\n';
    return false;
  }
  return true;
}

void print_table(const std::vector<RunResult>& runs) {
  const RunResult* dense = nullptr;
  for (const RunResult& run : runs)
    if (!run.variant.dropit) dense = &run;
  std::size_t name_width = 7;
  for (const RunResult& run : runs) name_width = std::max(name_width, run.variant.name().size());
  auto ratio = [&](double value, double base) {
    std::ostringstream s;
    if (dense && base > 0)
      s << std::fixed << std::setprecision(2) << value / base << "x";
    else
      s << "-";
    return s.str();
  };
  std::cout << "| " << std::left << std::setw(static_cast<int>(name_width)) << "variant"
            << " | test acc | peak train memory (MiB) | vs dense | step time (ms) | vs dense |\n"
            << "|" << std::string(name_width + 2, '-')
            << "|---------:|------------------------:|---------:|---------------:|---------:|\n";
  for (const RunResult& run : runs) {
    const EpochResult& last = run.epochs.back();
    std::cout << "| " << std::left << std::setw(static_cast<int>(name_width)) << run.variant.name()
              << " | " << std::right << std::fixed << std::setprecision(2) << std::setw(6)
              << last.test_accuracy << " % | " << std::setw(23) << mib(run.peak_step_bytes) << " | "
              << std::setw(8)
              << ratio(static_cast<double>(run.peak_step_bytes),
                       dense ? static_cast<double>(dense->peak_step_bytes) : 0)
              << " | " << std::setw(14) << std::setprecision(1) << run.step_ms_median << " | "
              << std::setw(8) << ratio(run.step_ms_median, dense ? dense->step_ms_median : 0)
              << " |\n";
  }
  std::cout << std::defaultfloat;
}

}  // namespace

int main(int argc, char** argv) {
  fmnist::ensure_passive_openmp_wait(argv);
  Options o;
  bool demo = false, no_plot = false;
  CLI::App app{
      "Train a CNN or a ViT on Fashion-MNIST, dense and with dropit, from the same initial weights "
      "and data order; compare test accuracy, measured peak training memory and step time."};
  app.add_flag("--demo", demo,
               "Short demo (1-2 minutes on 2 cores): CNN, 2 epochs on 20000 training images, "
               "all 10000 test images, dense vs dropit gamma 0.9 (explicit flags still apply)");
  app.add_option("--model", o.model.kind, "Model")
      ->check(CLI::IsMember({"cnn", "vit"}))
      ->capture_default_str();
  app.add_option("--epochs", o.epochs, "Training epochs")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--batch-size", o.batch_size, "Images per step")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--train-subset", o.train_subset, "Train on the first N images (0: all 60000)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--test-subset", o.test_subset, "Test on the first N images (0: all 10000)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--variants", o.variants, "Comma-separated: dense, dropit")
      ->delimiter(',')
      ->check(CLI::IsMember({"dense", "dropit"}))
      ->capture_default_str();
  app.add_option("--gamma", o.gammas,
                 "Drop rates of the dropit variants, comma-separated, in [0, 1)")
      ->delimiter(',')
      ->check(CLI::Range(0.0, 0.999999))
      ->capture_default_str();
  app.add_option("--selection", o.selections,
                 "Selections of the dropit variants, comma-separated: chunked_min_k, min_k, random")
      ->delimiter(',')
      ->check(CLI::IsMember({"chunked_min_k", "min_k", "random"}))
      ->capture_default_str();
  app.add_option("--granularity", o.granularities,
                 "Granularities, comma-separated: element, channel (not with chunked_min_k)")
      ->delimiter(',')
      ->check(CLI::IsMember({"element", "channel"}))
      ->capture_default_str();
  app.add_option("--chunk-size", o.chunk_size, "Chunk length D of chunked_min_k and random")
      ->check(CLI::Range(std::int64_t{1}, dropit::max_chunk_size))
      ->capture_default_str();
  app.add_flag("--relu-mask,!--dense-relu", o.relu_mask,
               "dropit variants: replace ReLU by the 1-bit-mask ReLU (default), or keep torch's");
  app.add_option(
      "--lr", o.lr,
      "Peak learning rate (default: SGD 0.2 for cnn, 0.05 without BatchNorm; AdamW 1e-3 for vit)");
  app.add_option("--seed", o.seed, "Seed of weights, data order and random selection")
      ->capture_default_str();
  app.add_option("--threads", o.threads,
                 "Threads for torch, OpenBLAS and dropit (default: all cores)")
      ->check(CLI::PositiveNumber);
  app.add_option("--width", o.model.width, "CNN: channels of the first stage")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_flag("--batchnorm,!--no-batchnorm", o.model.batchnorm,
               "CNN: BatchNorm after every convolution (default), or none");
  app.add_option("--dim", o.model.dim, "ViT: embedding size")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--depth", o.model.depth, "ViT: transformer blocks")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--heads", o.model.heads, "ViT: attention heads")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--data-dir", o.data_dir, "Directory of the unpacked Fashion-MNIST idx files")
      ->capture_default_str();
  app.add_option("--out-dir", o.out_dir, "Where the CSV files and the plot go")
      ->capture_default_str();
  app.add_flag("--no-plot", no_plot, "Do not call gnuplot");
  app.add_flag("--verbose", o.verbose, "Print every converted layer");
  CLI11_PARSE(app, argc, argv);

  if (demo) {
    auto given = [&](const char* flag) { return app.get_option(flag)->count() > 0; };
    if (!given("--model")) o.model.kind = "cnn";
    if (!given("--epochs")) o.epochs = 2;
    if (!given("--train-subset")) o.train_subset = 20000;
    if (!given("--test-subset")) o.test_subset = 0;
    if (!given("--variants")) o.variants = {"dense", "dropit"};
    if (!given("--gamma")) o.gammas = {0.9};
    if (!given("--selection")) o.selections = {"chunked_min_k"};
    if (!given("--granularity")) o.granularities = {"element"};
  }
  o.plot = !no_plot;
  if (o.lr == 0) o.lr = o.model.kind == "vit" ? 1e-3 : o.model.batchnorm ? 0.2 : 0.05;
  if (o.threads == 0)
    o.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));

  std::vector<Variant> variants;
  const auto wants = [&](const char* v) {
    return std::find(o.variants.begin(), o.variants.end(), v) != o.variants.end();
  };
  if (wants("dense")) variants.push_back({});
  if (wants("dropit")) {
    for (const auto& selection : o.selections)
      for (const auto& granularity : o.granularities) {
        if (selection == "chunked_min_k" && granularity == "channel") {
          std::cerr << "note: chunked_min_k selects elements; skipping chunked_min_k x channel\n";
          continue;
        }
        for (double gamma : o.gammas) variants.push_back({true, selection, granularity, gamma});
      }
  }
  if (variants.empty()) {
    std::cerr << "nothing to train: --variants and the policy flags leave no variant\n";
    return 2;
  }

  try {
    fmnist::set_threads(o.threads);
    // Loaded before the first MemoryMeter exists, so the dataset is not counted as training memory.
    const fmnist::Dataset data = fmnist::load(o.data_dir, o.train_subset, o.test_subset);
    // Installs the counting allocator: every tensor from here on (weights included) is counted.
    const dropit::torch::MemoryMeter installed;
    const std::filesystem::path out_dir = std::filesystem::absolute(o.out_dir);
    std::filesystem::create_directories(out_dir);
    CsvWriter csv(out_dir);

    torch::manual_seed(o.seed);
    const std::shared_ptr<fmnist::Classifier> reference = fmnist::make_model(o.model);
    std::cout << "Fashion-MNIST " << o.model.kind << " (" << fmnist::parameter_count(*reference)
              << " parameters): " << o.epochs << " epoch(s) on " << data.train.size()
              << " training images, tested on " << data.test.size() << "; batch " << o.batch_size
              << ", " << o.threads << " thread(s), seed " << o.seed << '\n'
              << std::flush;

    std::vector<RunResult> runs;
    for (const Variant& variant : variants)
      runs.push_back(train(o, variant, *reference, data, csv));

    std::cout << '\n';
    print_table(runs);
    std::cout << "\npeak train memory: bytes allocated during a training step (forward, backward, "
                 "optimizer) above what was live before it (weights, gradients, optimizer state), "
                 "measured at torch's allocator; step time: median.\n";
    std::cout << "wrote " << (out_dir / "epochs.csv").string() << " and "
              << (out_dir / "steps.csv").string();
    if (o.plot && plot(o, runs, out_dir)) std::cout << " and " << (out_dir / "curves.png").string();
    std::cout << '\n';
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << '\n';
    return 1;
  }
  return 0;
}
