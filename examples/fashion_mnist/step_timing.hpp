#pragma once
// Dense against dropit training steps, timed and measured the same way by the training example and
// benchmarks/torch: one step of each per pair, interleaved (dense, dropit, dropit, dense, ...) so
// that a slow spell of a shared machine hits both alike, each step's peak taken at torch's
// allocator above what was live before it.

#include <dropit/torch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

namespace fmnist {

inline double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

/// Times `step()` and returns milliseconds; raises `peak` to the bytes the step allocated above
/// what was live before it.
template <typename Step>
double timed_step(dropit::torch::MemoryMeter& meter, std::int64_t& peak, Step&& step) {
  const std::int64_t live = meter.current();
  meter.reset_peak();
  const auto start = std::chrono::steady_clock::now();
  step();
  const auto stop = std::chrono::steady_clock::now();
  peak = std::max(peak, meter.peak() - live);
  return std::chrono::duration<double, std::milli>(stop - start).count();
}

/// Step times and peaks of a dense and a dropit training step, gathered pair by pair.
class InterleavedSteps {
 public:
  /// One step of each, the order alternating from one pair to the next.
  template <typename DenseStep, typename DropitStep>
  void pair(dropit::torch::MemoryMeter& meter, DenseStep&& dense, DropitStep&& dropit) {
    if (ratios_.size() % 2 == 0) {
      dense_ms_.push_back(timed_step(meter, dense_peak_, dense));
      dropit_ms_.push_back(timed_step(meter, dropit_peak_, dropit));
    } else {
      dropit_ms_.push_back(timed_step(meter, dropit_peak_, dropit));
      dense_ms_.push_back(timed_step(meter, dense_peak_, dense));
    }
    ratios_.push_back(dropit_ms_.back() / dense_ms_.back());
  }

  std::size_t pairs() const { return ratios_.size(); }
  double last_pair_ms() const { return dense_ms_.back() + dropit_ms_.back(); }
  double dense_ms() const { return median(dense_ms_); }
  double dropit_ms() const { return median(dropit_ms_); }
  /// The median of the per-pair ratios dropit / dense (not the ratio of the medians).
  double time_ratio() const { return median(ratios_); }
  std::int64_t dense_peak() const { return dense_peak_; }
  std::int64_t dropit_peak() const { return dropit_peak_; }
  double peak_ratio() const {
    return dense_peak_ > 0 ? static_cast<double>(dropit_peak_) / static_cast<double>(dense_peak_)
                           : 0;
  }

 private:
  std::vector<double> dense_ms_, dropit_ms_, ratios_;
  std::int64_t dense_peak_ = 0, dropit_peak_ = 0;
};

}  // namespace fmnist
