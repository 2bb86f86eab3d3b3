#pragma once
// The CPU backend's operations (see `detail::backend_ops` in backend.hpp): the public entry points
// have checked every operand, so these only carve the workspace and run the loops.

#include <cstddef>
#include <cstdint>
#include <optional>

#include "../../backend.hpp"
#include "../../cache.hpp"
#include "../common/geometry.hpp"
#include "../common/workspace.hpp"
#include "cache_ops.hpp"
#include "relu_mask.hpp"
#include "weight_grad.hpp"

namespace dropit::detail {

template <>
struct backend_ops<cpu_backend> {
  static constexpr const char* name = "CPU";

  /// The CPU backend reads and writes host memory; there is nothing more to check about a pointer.
  static void expect_accessible(const cpu_backend&, const void*, std::size_t, const char*) {}

  /// compress reads `input` contiguous, or channels-last where `channels_last` is set.
  template <storage_type T>
  static std::size_t compress_workspace_bytes(
      const cpu_backend& backend, const cache_layout& layout,
      const std::optional<channels_last_dims>& channels_last) {
    return cpu::compress_workspace_bytes<T>(backend, layout, channels_last);
  }

  template <storage_type T>
  static void compress(const cpu_backend& backend, const T* input,
                       const std::optional<channels_last_dims>& channels_last,
                       const cache_view<T>& out, workspace memory) {
    cpu::compress(backend, input, channels_last, out, memory);
  }

  template <storage_type T>
  static std::size_t densify_workspace_bytes(const cpu_backend& backend,
                                             const cache_layout& layout) {
    return cpu::densify_workspace_bytes<T>(backend, layout);
  }

  template <storage_type T>
  static void densify(const cpu_backend& backend, const cache_view<const T>& cache, T* out,
                      workspace memory) {
    cpu::densify(backend, cache, out, memory);
  }

  template <storage_type T>
  static std::size_t linear_weight_grad_workspace_bytes(const cpu_backend& backend,
                                                        const cache_layout& a,
                                                        const linear_dims& d) {
    return workspace_bytes_of(
        [&](workspace_carver& carver) { cpu::add_linear_scratch(carver, backend, a, d); });
  }

  template <storage_type T>
  static void linear_weight_grad(const cpu_backend& backend, const cache_view<const T>& a,
                                 const T* dz, T* dw, const linear_dims& d, grad_mode mode,
                                 workspace memory) {
    workspace_carver carver(memory);
    const auto scratch = cpu::add_linear_scratch(carver, backend, a.layout, d);
    cpu::linear_weight_grad<T>(backend, a, dz, dw, d, mode, scratch);
  }

  template <storage_type T>
  static std::size_t conv2d_weight_grad_workspace_bytes(const cpu_backend& backend,
                                                        const cache_layout& x,
                                                        const conv2d_geometry& g) {
    return workspace_bytes_of(
        [&](workspace_carver& carver) { cpu::add_conv2d_scratch(carver, backend, x, g); });
  }

  template <storage_type T>
  static void conv2d_weight_grad(const cpu_backend& backend, const cache_view<const T>& x,
                                 const T* dz, T* dw, const conv2d_geometry& g, grad_mode mode,
                                 workspace memory) {
    workspace_carver carver(memory);
    const auto scratch = cpu::add_conv2d_scratch(carver, backend, x.layout, g);
    cpu::conv2d_weight_grad<T>(backend, x, dz, dw, g, mode, scratch);
  }

  /// The mask of `x` into `words`, and `relu(x)` into `y` unless `y` is null (`y` may be `x`).
  template <storage_type T>
  static void pack_relu_mask(const cpu_backend& backend, const T* x, T* y, std::int64_t n,
                             std::uint32_t* words) {
    cpu::pack_relu_mask(backend, x, y, n, words);
  }

  template <storage_type T>
  static void apply_relu_mask(const cpu_backend& backend, const std::uint32_t* words, const T* dy,
                              T* dx, std::int64_t n) {
    cpu::apply_relu_mask(backend, words, dy, dx, n);
  }

  /// The channels-last forms: the mask in the tensor's logical order (see relu_mask.hpp).
  template <storage_type T>
  static void pack_relu_mask_channels_last(const cpu_backend& backend, const T* x, T* y,
                                           const channels_last_dims& d, std::uint32_t* words) {
    cpu::pack_relu_mask_channels_last(backend, x, y, d, words);
  }

  template <storage_type T>
  static void apply_relu_mask_channels_last(const cpu_backend& backend,
                                            const std::uint32_t* words, const T* dy, T* dx,
                                            const channels_last_dims& d) {
    cpu::apply_relu_mask_channels_last(backend, words, dy, dx, d);
  }
};

// The CPU operations for every storage type, as explicit instantiations: declared (extern) in a
// program that defines DROPIT_CPU_INSTANCES in every translation unit, defined once in
// dropit/cpu_instances.cpp. Such a program compiles the CPU loops (each instruction set, each
// selection) once instead of in every translation unit that reaches them.
#define DROPIT_CPU_OPERATIONS(kind, T)                                                           \
  kind void cpu::compress<T>(const cpu_backend&, const T*,                                       \
                             const std::optional<channels_last_dims>&, const cache_view<T>&,     \
                             workspace);                                                         \
  kind void cpu::densify<T>(const cpu_backend&, const cache_view<const T>&, T*, workspace);      \
  kind void cpu::linear_weight_grad<T>(const cpu_backend&, const cache_view<const T>&, const T*, \
                                       T*, const linear_dims&, grad_mode,                        \
                                       const cpu::linear_scratch&);                              \
  kind void cpu::conv2d_weight_grad<T>(const cpu_backend&, const cache_view<const T>&, const T*, \
                                       T*, const conv2d_geometry&, grad_mode,                    \
                                       const cpu::conv2d_scratch&);                              \
  kind void cpu::pack_relu_mask<T>(const cpu_backend&, const T*, T*, std::int64_t,               \
                                   std::uint32_t*);                                              \
  kind void cpu::apply_relu_mask<T>(const cpu_backend&, const std::uint32_t*, const T*, T*,      \
                                    std::int64_t);                                               \
  kind void cpu::pack_relu_mask_channels_last<T>(const cpu_backend&, const T*, T*,               \
                                                 const channels_last_dims&, std::uint32_t*);     \
  kind void cpu::apply_relu_mask_channels_last<T>(const cpu_backend&, const std::uint32_t*,      \
                                                  const T*, T*, const channels_last_dims&);

#if defined(DROPIT_CPU_INSTANCES)
DROPIT_CPU_OPERATIONS(extern template, float)
DROPIT_CPU_OPERATIONS(extern template, half)
DROPIT_CPU_OPERATIONS(extern template, bfloat16)
#endif

}  // namespace dropit::detail
