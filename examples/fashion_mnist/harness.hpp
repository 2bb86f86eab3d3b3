#pragma once
// What the training example needs besides training: its command line, the list of variants, the
// learning-rate schedule, a progress bar, the CSV files, the plot and the summary tables. The
// example itself (fashion_mnist.cpp) holds the model, the conversion to dropit and the training
// loop.

#include <CLI/CLI.hpp>
#include <dropit/torch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <numeric>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "models.hpp"
#include "step_timing.hpp"

#ifndef DROPIT_FASHION_MNIST_DATA_DIR
#define DROPIT_FASHION_MNIST_DATA_DIR "data"
#endif

namespace fmnist {

struct Options {
  ModelConfig model;
  int epochs = 3;
  std::int64_t batch_size = 128;
  std::int64_t train_subset = 0;  // 0: all 60000
  std::int64_t test_subset = 0;   // 0: all 10000
  std::vector<std::string> variants{"dense", "dropit"};
  std::vector<double> gammas{0.9};
  std::vector<double> budgets;  // memory planner variants
  std::vector<std::string> selections{"chunked_min_k"};
  std::vector<std::string> granularities{"element"};
  std::int64_t chunk_size = dropit::default_chunk_size;
  bool relu_mask = true;
  double lr = 0;  // 0: the model's default
  int compare_steps = 50;
  std::uint64_t seed = 0;
  int threads = 0;
  std::string data_dir = DROPIT_FASHION_MNIST_DATA_DIR;
  std::string out_dir = "fashion_mnist_results";
  bool plot = true;
  bool verbose = false;
  std::string command_line;
};

/// One training run: the dense baseline or one dropit policy.
struct Variant {
  bool dropit = false;
  std::string selection = "-", granularity = "-";
  double gamma = 0;
  /// Above 0: plan_memory at this budget, converting blocks with the policy above.
  double budget = 0;
  /// Exact recomputation of inputs a producer gives again (DropitOptions::recompute); off: DropIT
  /// caches every converted layer's input.
  bool recompute = true;

  std::string name() const {
    if (!dropit) return "dense";
    std::ostringstream s;
    if (budget > 0) s << "plan " << budget << " (";
    s << "dropit " << selection << (granularity == "channel" ? " channel" : "") << " g=" << gamma;
    if (!recompute) s << " no recompute";
    if (budget > 0) s << ")";
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
  std::vector<double> step_ms;     // every measured step of every epoch
  std::int64_t peak_step_bytes = 0;
  double step_ms_median = 0;
};

/// A dropit variant's steps timed against the dense model's, interleaved, after both trained.
struct StepComparison {
  Variant variant;
  InterleavedSteps steps;
};

inline double mean(const std::vector<double>& values) {
  return values.empty() ? 0 : std::accumulate(values.begin(), values.end(), 0.0) / values.size();
}

inline double mib(std::int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

/// Parses the command line into `o`. Returns the exit status when the program should stop (help,
/// a bad flag), or -1 to go on.
inline int parse_options(int argc, char** argv, Options& o) {
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
  app.add_option("--variants", o.variants,
                 "Comma-separated: dense, dropit, dropit_only (dropit without exact "
                 "recomputation: DropIT caches only)")
      ->delimiter(',')
      ->check(CLI::IsMember({"dense", "dropit", "dropit_only"}))
      ->capture_default_str();
  app.add_option("--budgets", o.budgets,
                 "Also train the memory planner's model at each budget (a fraction of dense "
                 "activation bytes, in (0, 1]), converting blocks with the first policy")
      ->delimiter(',')
      ->check([](const std::string& value) {
        const double budget = std::strtod(value.c_str(), nullptr);
        return budget > 0.0 && budget <= 1.0 ? std::string()
                                             : "budget " + value + " is outside (0, 1]";
      });
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
  app.add_option("--compare-steps", o.compare_steps,
                 "After training, time this many step pairs of the dense model against each "
                 "dropit model, interleaved on one batch, and print the median ratio (0: skip)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
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
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

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
  for (int i = 0; i < argc; ++i) o.command_line += (i ? " " : "") + std::string(argv[i]);
  return -1;
}

/// The dense baseline (when asked for) first, then every dropit policy the flags name.
inline std::vector<Variant> variants_of(const Options& o) {
  std::vector<Variant> variants;
  const auto wants = [&](const char* v) {
    return std::find(o.variants.begin(), o.variants.end(), v) != o.variants.end();
  };
  if (wants("dense")) variants.push_back({});
  std::vector<Variant> policies;
  for (const auto& selection : o.selections)
    for (const auto& granularity : o.granularities) {
      if (selection == "chunked_min_k" && granularity == "channel") {
        std::cerr << "note: chunked_min_k selects elements; skipping chunked_min_k x channel\n";
        continue;
      }
      for (double gamma : o.gammas) policies.push_back({true, selection, granularity, gamma});
    }
  if (wants("dropit") && !policies.empty()) {
    variants.insert(variants.end(), policies.begin(), policies.end());
    for (double budget : o.budgets) {
      Variant plan = policies.back();
      plan.budget = budget;
      variants.push_back(plan);
    }
  }
  if (wants("dropit_only"))
    for (Variant policy : policies) {
      policy.recompute = false;
      variants.push_back(policy);
    }
  return variants;
}

/// The learning-rate schedule, in words for settings.csv.
inline constexpr const char* schedule_description =
    "linear warm-up over the first 3% of steps, then cosine decay to zero";

/// Learning rate at `step` of `total`: linear warm-up over the first 3 %, then cosine to zero.
inline double learning_rate(double peak, std::int64_t step, std::int64_t total) {
  const double warmup = std::max<double>(1.0, 0.03 * static_cast<double>(total));
  const double progress =
      static_cast<double>(step) / static_cast<double>(std::max<std::int64_t>(total, 1));
  return peak * std::min(1.0, (step + 1) / warmup) * 0.5 * (1.0 + std::cos(M_PI * progress));
}

/// A one-line progress bar on stderr. On a terminal it redraws in place; otherwise (a log file) it
/// prints a line at each quarter of the epoch.
class Progress {
 public:
  using clock_type = std::chrono::steady_clock;

  Progress(std::string label, std::int64_t steps)
      : label_(std::move(label)), steps_(steps), tty_(isatty(STDERR_FILENO) != 0) {}

  void update(std::int64_t step, std::int64_t images, double loss) {
    const bool last = step == steps_;
    const auto now = clock_type::now();
    if (tty_) {
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
    const double seconds = std::chrono::duration<double>(now - start_).count();
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
  clock_type::time_point start_ = clock_type::now(), drawn_{};
  std::int64_t quarter_ = 0;
};

/// Gathers one epoch's steps (time, loss, peak) into an EpochResult and the run's loss curve.
class EpochLog {
 public:
  EpochLog(RunResult& run, int epoch, std::int64_t steps)
      : run_(run), progress_(run.variant.name() + " ep " + std::to_string(epoch), steps) {
    result_.epoch = epoch;
  }

  /// A step of `images` images. `measured`: whether its time and peak count (the first step of a
  /// run allocates the gradients and the optimizer state, so it is left out of the steady state).
  void step(double ms, double loss, std::int64_t peak, std::int64_t persistent, std::int64_t images,
            bool measured) {
    if (measured) {
      result_.peak_step_bytes = std::max(result_.peak_step_bytes, peak);
      result_.persistent_bytes = std::max(result_.persistent_bytes, persistent);
      step_ms_.push_back(ms);
    }
    losses_.push_back(loss);
    recent_.push_back(loss);
    if (recent_.size() > 25) recent_.erase(recent_.begin());
    run_.loss_curve.push_back(mean(recent_));
    if (!std::isfinite(loss))
      std::cerr << run_.variant.name() << ": loss is " << loss << " at step "
                << run_.loss_curve.size() << '\n';
    images_ += images;
    progress_.update(static_cast<std::int64_t>(losses_.size()), images_, mean(losses_));
  }

  /// Closes the epoch with its test accuracy; the result joins the run.
  const EpochResult& finish(double test_accuracy) {
    const double seconds =
        std::chrono::duration<double>(Progress::clock_type::now() - start_).count();
    result_.train_loss = mean(losses_);
    result_.step_ms_mean = mean(step_ms_);
    result_.step_ms_median = median(step_ms_);
    result_.images_per_s = static_cast<double>(images_) / seconds;
    result_.test_accuracy = test_accuracy;
    std::cerr << "  epoch " << result_.epoch << ": train loss " << std::fixed
              << std::setprecision(4) << result_.train_loss << ", test accuracy "
              << std::setprecision(2) << result_.test_accuracy << " %, peak step memory "
              << mib(result_.peak_step_bytes) << " MiB, step " << std::setprecision(1)
              << result_.step_ms_median << " ms" << std::defaultfloat << '\n';
    run_.peak_step_bytes = std::max(run_.peak_step_bytes, result_.peak_step_bytes);
    run_.epochs.push_back(result_);
    run_.step_ms.insert(run_.step_ms.end(), step_ms_.begin(), step_ms_.end());
    run_.step_ms_median = median(run_.step_ms);
    return run_.epochs.back();
  }

 private:
  RunResult& run_;
  Progress progress_;
  EpochResult result_;
  std::vector<double> step_ms_, losses_, recent_;
  std::int64_t images_ = 0;
  Progress::clock_type::time_point start_ = Progress::clock_type::now();
};

/// The files of a run under --out-dir: settings.csv (what ran), epochs.csv (one row per variant and
/// epoch), steps.csv (every step's loss) and, after the comparison, step_ratios.csv.
class CsvWriter {
 public:
  explicit CsvWriter(const std::filesystem::path& directory)
      : directory_(directory), epochs_(directory / "epochs.csv"), steps_(directory / "steps.csv") {
    if (!epochs_ || !steps_)
      throw std::runtime_error("cannot write CSV files in " + directory.string());
    epochs_ << "model,variant,selection,granularity,gamma,epoch,train_loss,test_accuracy,"
               "peak_step_bytes,persistent_bytes,step_ms_mean,step_ms_median,images_per_s\n";
    steps_ << "variant,epoch,step,loss\n";
  }

  /// The resolved settings of the run, as the program used them (not as a reader would guess them
  /// from the flags), so that reports quote the run rather than the defaults.
  void settings(const Options& o, std::int64_t train_images, std::int64_t test_images,
                const std::string& optimizer) {
    std::ofstream out(directory_ / "settings.csv");
    out << "key,value\n"
        << "model," << o.model.kind << '\n'
        << "epochs," << o.epochs << '\n'
        << "batch_size," << o.batch_size << '\n'
        << "train_images," << train_images << '\n'
        << "test_images," << test_images << '\n'
        << "optimizer,\"" << optimizer << "\"\n"
        << "peak_lr," << o.lr << '\n'
        << "schedule,\"" << schedule_description << "\"\n"
        << "chunk_size," << o.chunk_size << '\n'
        << "relu," << (o.relu_mask ? "1-bit mask" : "torch") << '\n'
        << "seed," << o.seed << '\n'
        << "threads," << o.threads << '\n'
        << "compare_steps," << o.compare_steps << '\n'
        << "cpu_isa," << dropit::detail::cpu::name_of(dropit::detail::cpu::active_cpu_isa()) << '\n'
        << "command,\"" << o.command_line << "\"\n";
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

  void comparisons(const std::vector<StepComparison>& comparisons) {
    std::ofstream out(directory_ / "step_ratios.csv");
    out << "variant,pairs,dense_ms_median,dropit_ms_median,time_ratio,dense_peak_bytes,"
           "dropit_peak_bytes,peak_ratio\n";
    for (const StepComparison& c : comparisons)
      out << c.variant.name() << ',' << c.steps.pairs() << ',' << c.steps.dense_ms() << ','
          << c.steps.dropit_ms() << ',' << c.steps.time_ratio() << ',' << c.steps.dense_peak()
          << ',' << c.steps.dropit_peak() << ',' << c.steps.peak_ratio() << '\n';
  }

 private:
  std::filesystem::path directory_;
  std::ofstream epochs_, steps_;
};

inline std::string quote(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

/// curves.png: training loss per step (left) and test accuracy per epoch (right), one line per
/// variant. Returns false when gnuplot is missing or fails.
inline bool plot(const Options& o, const std::vector<RunResult>& runs,
                 const std::filesystem::path& dir) {
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

/// The results table: per variant, final accuracy, peak memory and step time, each against dense
/// where there is a dense run. Time and memory ratios come from the interleaved comparison where
/// it ran (the fair one: both models' steps alternate on the same batch), from the training
/// epochs otherwise.
inline void print_table(const std::vector<RunResult>& runs,
                        const std::vector<StepComparison>& comparisons) {
  const RunResult* dense = nullptr;
  for (const RunResult& run : runs)
    if (!run.variant.dropit) dense = &run;
  std::size_t name_width = 7;
  for (const RunResult& run : runs) name_width = std::max(name_width, run.variant.name().size());
  const auto format = [](double value, int precision, const char* suffix) {
    std::ostringstream s;
    s << std::fixed << std::setprecision(precision) << value << suffix;
    return s.str();
  };
  std::cout << "| " << std::left << std::setw(static_cast<int>(name_width)) << "variant"
            << " | test acc | peak train memory (MiB) | vs dense | step time (ms) | vs dense |\n"
            << "|" << std::string(name_width + 2, '-')
            << "|---------:|------------------------:|---------:|---------------:|---------:|\n";
  for (const RunResult& run : runs) {
    std::string peak_ratio = "-", time_ratio = "-";
    if (dense && dense->peak_step_bytes > 0 && dense->step_ms_median > 0) {
      peak_ratio = format(
          static_cast<double>(run.peak_step_bytes) / static_cast<double>(dense->peak_step_bytes), 2,
          "x");
      time_ratio = format(run.step_ms_median / dense->step_ms_median, 2, "x");
    }
    for (const StepComparison& c : comparisons)
      if (c.variant.name() == run.variant.name()) {
        peak_ratio = format(c.steps.peak_ratio(), 2, "x*");
        time_ratio = format(c.steps.time_ratio(), 2, "x*");
      }
    std::cout << "| " << std::left << std::setw(static_cast<int>(name_width)) << run.variant.name()
              << " | " << std::right << std::setw(8)
              << format(run.epochs.back().test_accuracy, 2, " %") << " | " << std::setw(23)
              << format(mib(run.peak_step_bytes), 2, "") << " | " << std::setw(8) << peak_ratio
              << " | " << std::setw(14) << format(run.step_ms_median, 1, "") << " | "
              << std::setw(8) << time_ratio << " |\n";
  }
  std::cout << "\npeak train memory: bytes allocated during a training step (forward, backward, "
               "optimizer) above what was live before it (weights, gradients, optimizer state), "
               "measured at torch's allocator; step time: median over the training epochs.\n";
  if (!comparisons.empty())
    std::cout << "x*: from " << comparisons.front().steps.pairs()
              << " step pairs after training, dense and dropit interleaved on one batch: the "
                 "median of the per-pair time ratios and the ratio of the peaks.\n";
}

}  // namespace fmnist
