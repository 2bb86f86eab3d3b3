#pragma once
// Plumbing of the CUDA tests: owning device buffers, device caches, and the GPU runs of compress
// and densify whose results the tests compare with the CPU backend's. Every output buffer and
// workspace is poisoned before a run, so a byte the kernels forget to write (or scratch they
// assume zeroed) shows up as a difference.

#include <dropit/dropit.cuh>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "helpers.hpp"

namespace cuda_test {

using dropit::bfloat16;
using dropit::half;

/// Whether the tests run on the CPU emulation of the device (tests/cuda/emulation, which defines
/// DROPIT_CUDA_EMULATION), where cases that take minutes run on a subset or not at all.
#if defined(DROPIT_CUDA_EMULATION)
inline constexpr bool emulated_device = true;
#else
inline constexpr bool emulated_device = false;
#endif

#define CUDA_REQUIRE(call)                                                             \
  do {                                                                                 \
    const cudaError_t status_ = (call);                                                \
    REQUIRE_MESSAGE(status_ == cudaSuccess, #call, ": ", cudaGetErrorString(status_)); \
  } while (0)

template <class T>
class device_buffer {
 public:
  device_buffer() = default;
  explicit device_buffer(std::size_t count) : count_(count) {
    if (count_ > 0) CUDA_REQUIRE(cudaMalloc(reinterpret_cast<void**>(&data_), count_ * sizeof(T)));
  }
  explicit device_buffer(const std::vector<T>& host) : device_buffer(host.size()) { upload(host); }
  device_buffer(device_buffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), count_(std::exchange(other.count_, 0)) {}
  device_buffer& operator=(device_buffer&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(count_, other.count_);
    return *this;
  }
  ~device_buffer() {
    if (data_ != nullptr) cudaFree(data_);
  }

  T* data() const { return data_; }
  std::size_t size() const { return count_; }
  std::size_t bytes() const { return count_ * sizeof(T); }

  void upload(const std::vector<T>& host) {
    REQUIRE(host.size() == count_);
    if (count_ > 0) CUDA_REQUIRE(cudaMemcpy(data_, host.data(), bytes(), cudaMemcpyHostToDevice));
    settle();
  }
  std::vector<T> download() const {
    std::vector<T> host(count_);
    if (count_ > 0) CUDA_REQUIRE(cudaMemcpy(host.data(), data_, bytes(), cudaMemcpyDeviceToHost));
    return host;
  }
  void poison(int byte = 0xa5) {
    if (count_ > 0) CUDA_REQUIRE(cudaMemset(data_, byte, bytes()));
    settle();
  }

 private:
  // cudaMemset and a cudaMemcpy from pageable memory may still be running on the legacy stream when
  // they return, and work on a non-blocking stream does not wait for that stream: the tests wait
  // here, so that every buffer is ready for whichever stream the backend uses.
  static void settle() { CUDA_REQUIRE(cudaDeviceSynchronize()); }

  T* data_ = nullptr;
  std::size_t count_ = 0;
};

/// A workspace of exactly `bytes` (poisoned).
inline device_buffer<std::byte> device_workspace(std::size_t bytes) {
  device_buffer<std::byte> w(bytes);
  w.poison(0x5a);
  return w;
}

inline dropit::workspace as_workspace(const device_buffer<std::byte>& w) {
  return dropit::workspace(w.data(), w.size());
}

template <class T>
struct device_cache {
  dropit::cache_layout layout;
  device_buffer<T> values;
  device_buffer<std::uint32_t> positions;

  explicit device_cache(const dropit::cache_layout& l)
      : layout(l),
        values(static_cast<std::size_t>(l.kept())),
        positions((l.position_bytes() + 3) / 4) {
    values.poison();
    positions.poison();
  }

  dropit::cache_view<T> view() const { return {layout, values.data(), positions.data()}; }
  dropit::cache_view<const T> const_view() const {
    return {layout, values.data(), positions.data()};
  }

  std::vector<unsigned char> position_bytes() const {
    const auto words = positions.download();
    std::vector<unsigned char> bytes(layout.position_bytes());
    if (!bytes.empty()) std::memcpy(bytes.data(), words.data(), bytes.size());
    return bytes;
  }
};

/// The CPU cache `c` copied to the device.
template <class T>
device_cache<T> upload(const dropit::cache<T>& c) {
  device_cache<T> d(c.layout());
  d.values.upload(test::values_of(c));
  const auto bytes = test::position_bytes(c);
  std::vector<std::uint32_t> words(d.positions.size(), 0);
  if (!bytes.empty()) std::memcpy(words.data(), bytes.data(), bytes.size());
  d.positions.upload(words);
  return d;
}

inline void finish(const dropit::cuda_backend& backend) {
  CUDA_REQUIRE(cudaStreamSynchronize(backend.stream));
  CUDA_REQUIRE(cudaGetLastError());
}

/// compress on the GPU through the expert API, waited for.
template <class T>
device_cache<T> gpu_compress(const dropit::cuda_backend& backend,
                             const dropit::cache_layout& layout, const device_buffer<T>& input) {
  device_cache<T> c(layout);
  const auto scratch = device_workspace(dropit::compress_workspace_bytes<T>(backend, layout));
  dropit::compress<T>(backend, dropit::tensor_view<const T>{input.data(), layout.shape}, c.view(),
                      as_workspace(scratch));
  finish(backend);
  return c;
}

/// densify on the GPU, waited for, copied back.
template <class T>
std::vector<T> gpu_densify(const dropit::cuda_backend& backend, const device_cache<T>& c) {
  device_buffer<T> out(static_cast<std::size_t>(c.layout.numel()));
  out.poison();
  const auto scratch = device_workspace(dropit::densify_workspace_bytes<T>(backend, c.layout));
  dropit::densify<T>(backend, c.const_view(), dropit::tensor_view<T>{out.data(), c.layout.shape},
                     as_workspace(scratch));
  finish(backend);
  return out.download();
}

}  // namespace cuda_test
