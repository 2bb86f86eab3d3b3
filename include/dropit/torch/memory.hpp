#pragma once
/// @file
/// Memory measured at the allocator: a counting CPU allocator (and, on CUDA builds of LibTorch, the
/// caching allocator's own statistics) reporting current and peak bytes of live tensors.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>

#include "../config.hpp"
#include "compat.hpp"

namespace dropit::torch {

namespace detail {

/// Wraps torch's CPU allocator and counts the bytes of live allocations. Each block carries its
/// size in a 64-byte header, and the pointer handed out is also the deleter's context: torch's
/// raw_allocate (used by oneDNN) requires that.
class counting_allocator final : public c10::Allocator {
 public:
  explicit counting_allocator(c10::Allocator* base) : base_(base) {
    dropit::detail::expect(base->raw_deleter() != nullptr,
                           "the CPU allocator to count has no raw deleter");
  }

  c10::DataPtr allocate(std::size_t bytes) DROPIT_TORCH_ALLOCATE_CONST override {
    c10::DataPtr inner = base_->allocate(bytes + header_bytes);
    const c10::Device device = inner.device();
    dropit::detail::expect(inner.get() == inner.get_context(),
                           "the CPU allocator to count does not own its blocks directly");
    auto* block = static_cast<std::byte*>(inner.release_context());
    std::memcpy(block, &bytes, sizeof bytes);
    const auto size = static_cast<std::int64_t>(bytes);
    const std::int64_t now = current_.fetch_add(size) + size;
    std::int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    void* data = block + header_bytes;
    return {data, data, &release, device};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &release; }

#if DROPIT_TORCH_ALLOCATOR_COPY_DATA
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
#endif

  std::int64_t current() const { return current_.load(); }
  std::int64_t peak() const { return peak_.load(); }
  void reset_peak() { peak_.store(current_.load()); }

  static counting_allocator* instance;

 private:
  static constexpr std::size_t header_bytes = 64;  // keeps the data 64-byte aligned

  static void release(void* data) {
    if (data == nullptr) return;
    std::byte* block = static_cast<std::byte*>(data) - header_bytes;
    std::size_t bytes;
    std::memcpy(&bytes, block, sizeof bytes);
    instance->current_.fetch_sub(static_cast<std::int64_t>(bytes));
    instance->base_->raw_deleter()(block);
  }

  c10::Allocator* base_;
  mutable std::atomic<std::int64_t> current_{0};
  mutable std::atomic<std::int64_t> peak_{0};
};

inline counting_allocator* counting_allocator::instance = nullptr;

/// The process-wide counting allocator, installed as torch's CPU allocator on first use. It stays
/// installed: tensors it handed out may outlive any meter.
inline counting_allocator& cpu_counter() {
  static counting_allocator* installed = [] {
    counting_allocator::instance = new counting_allocator(c10::GetAllocator(c10::DeviceType::CPU));
    c10::SetAllocator(c10::DeviceType::CPU, counting_allocator::instance, /*priority=*/255);
    return counting_allocator::instance;
  }();
  return *installed;
}

}  // namespace detail

/// Current and peak bytes of tensors allocated on one device since the meter began (or since the
/// last `reset_peak`). CPU tensors allocated before the first meter existed are not counted.
class MemoryMeter {
 public:
  explicit MemoryMeter(c10::Device device = c10::kCPU) : device_(device) {
    if (device_.is_cpu()) {
      detail::cpu_counter();
    } else {
#if DROPIT_TORCH_HAS_CUDA
      dropit::detail::expect(device_.is_cuda(), "MemoryMeter supports CPU and CUDA devices, not ",
                             device_.str());
      // `cuda` alone means the current device; the allocator's statistics exist once CUDA is
      // initialised, which any CUDA tensor does.
      (void)at::empty({0}, at::TensorOptions().device(device_));
      if (!device_.has_index()) device_ = c10::Device(c10::kCUDA, c10::cuda::current_device());
#else
      dropit::detail::fail("MemoryMeter: ", device_.str(),
                           " is not supported by this CPU-only LibTorch build");
#endif
    }
    reset_peak();
  }

  /// Bytes of live tensors now.
  std::int64_t current() const {
    if (device_.is_cpu()) return detail::cpu_counter().current();
#if DROPIT_TORCH_HAS_CUDA
    return compat::cuda_allocated(device_.index()).current;
#else
    return 0;
#endif
  }

  /// Highest `current()` since construction or the last `reset_peak`.
  std::int64_t peak() const {
    if (device_.is_cpu()) return detail::cpu_counter().peak();
#if DROPIT_TORCH_HAS_CUDA
    return compat::cuda_allocated(device_.index()).peak;
#else
    return 0;
#endif
  }

  void reset_peak() {
    if (device_.is_cpu()) {
      detail::cpu_counter().reset_peak();
      return;
    }
#if DROPIT_TORCH_HAS_CUDA
    compat::reset_cuda_peak(device_.index());
#endif
  }

 private:
  c10::Device device_;
};

}  // namespace dropit::torch
