#pragma once
/// @file
/// compress (sparsify a dense tensor into a cache) and densify (expand a cache back, zeros where
/// nothing was kept), on any backend.
///
/// Expert overloads take the cache's buffers and a workspace whose size the matching
/// `*_workspace_bytes` query returns; they allocate nothing. On the CUDA backend every buffer is
/// device-accessible and the work is enqueued on the backend's stream. Convenience overloads (CPU)
/// own their memory.

#include <cstddef>
#include <optional>
#include <type_traits>
#include <vector>

#include "backend.hpp"
#include "cache.hpp"
#include "detail/common/operands.hpp"
#include "detail/cpu/backend_ops.hpp"
#include "shape.hpp"

namespace dropit {

namespace detail {

template <class T, class U>
void expect_input_matches(const cache_layout& layout, const tensor_view<U>& tensor,
                          const char* what) {
  expect_layout<T>(layout);
  expect_data(tensor, what);
  expect(tensor.shape == layout.shape, what, " has shape ", tensor.shape,
         " but the cache layout expects ", layout.shape);
}

}  // namespace detail

namespace detail {

template <storage_type T, backend_type Backend>
void compress_stored(const Backend& backend, const tensor_view<const T>& input,
                     const std::optional<channels_last_dims>& channels_last,
                     const cache_view<T>& out, workspace scratch) {
  using ops = backend_ops<Backend>;
  expect_input_matches<T>(out.layout, input, "compress input");
  expect_buffers(out);
  expect_accessible(backend, input, "compress input");
  expect_accessible(backend, out);
  expect_workspace(backend, scratch,
                   ops::template compress_workspace_bytes<T>(backend, out.layout, channels_last),
                   "compress", "compress workspace");
  ops::template compress<T>(backend, input.data, channels_last, out, scratch);
}

}  // namespace detail

/// Workspace bytes `compress` needs on `backend` for a cache of `layout`.
template <storage_type T, backend_type Backend>
std::size_t compress_workspace_bytes(const Backend& backend, const cache_layout& layout) {
  detail::expect_layout<T>(layout);
  return detail::backend_ops<Backend>::template compress_workspace_bytes<T>(backend, layout,
                                                                            std::nullopt);
}

/// Sparsifies `input` into the caller's cache buffers `out` (planned with `plan_cache`).
template <storage_type T, backend_type Backend>
void compress(const Backend& backend, tensor_view<const std::type_identity_t<T>> input,
              cache_view<T> out, workspace scratch) {
  detail::compress_stored<T>(backend, input, std::nullopt, out, scratch);
}

/// Workspace bytes `compress_channels_last` needs on `backend` for a cache of `layout` (4-D).
template <storage_type T, backend_type Backend>
std::size_t compress_channels_last_workspace_bytes(const Backend& backend,
                                                   const cache_layout& layout) {
  detail::expect_layout<T>(layout);
  return detail::backend_ops<Backend>::template compress_workspace_bytes<T>(
      backend, layout, detail::check_channels_last(layout.shape, "compress input"));
}

/// `compress` of a 4-D tensor stored channels-last: `input` has the logical shape [N, C, H, W]
/// and holds its elements in (N, H, W, C) order. The cache is the one `compress` makes of the same
/// tensor stored contiguously (positions in logical order), so densify gives that tensor back.
template <storage_type T, backend_type Backend>
void compress_channels_last(const Backend& backend,
                            tensor_view<const std::type_identity_t<T>> input, cache_view<T> out,
                            workspace scratch) {
  const channels_last_dims dims = detail::check_channels_last(input.shape, "compress input");
  detail::compress_stored<T>(backend, input, dims, out, scratch);
}

/// Sparsifies `input` under policy `p` into a new cache.
template <class U, policy_type P, storage_type T = std::remove_const_t<U>>
cache<T> compress(const cpu_backend& backend, const P& p, tensor_view<U> input) {
  cache<T> result(plan_cache<T>(p, input.shape));
  auto memory = detail::allocate<std::byte>(compress_workspace_bytes<T>(backend, result.layout()),
                                            "compress workspace");
  compress<T>(backend, input, result.view(), workspace(memory));
  return result;
}

/// Workspace bytes `densify` needs on `backend` for a cache of `layout`.
template <storage_type T, backend_type Backend>
std::size_t densify_workspace_bytes(const Backend& backend, const cache_layout& layout) {
  detail::expect_layout<T>(layout);
  return detail::backend_ops<Backend>::template densify_workspace_bytes<T>(backend, layout);
}

/// Writes the dense tensor a cache stands for into `out`: kept values (scaled by n/k for random
/// selection with `rescale`), zeros elsewhere.
template <storage_type T, backend_type Backend>
void densify(const Backend& backend, cache_view<const std::type_identity_t<T>> cache,
             tensor_view<T> out, workspace scratch) {
  using ops = detail::backend_ops<Backend>;
  detail::expect_input_matches<T>(cache.layout, out, "densify output");
  detail::expect_buffers(cache);
  detail::expect_accessible(backend, cache);
  detail::expect_accessible(backend, out, "densify output");
  detail::expect_workspace(backend, scratch,
                           ops::template densify_workspace_bytes<T>(backend, cache.layout),
                           "densify", "densify workspace");
  ops::template densify<T>(backend, cache, out.data, scratch);
}

/// Densifies into a new vector.
template <class U, storage_type T = std::remove_const_t<U>>
std::vector<T> densify(const cpu_backend& backend, cache_view<U> cache) {
  const std::size_t bytes = densify_workspace_bytes<T>(backend, cache.layout);
  auto out = detail::allocate<T>(static_cast<std::size_t>(cache.layout.numel()), "densify output");
  auto memory = detail::allocate<std::byte>(bytes, "densify workspace");
  densify(backend, cache, tensor_view<T>{out.data(), cache.layout.shape}, workspace(memory));
  return out;
}

template <storage_type T>
std::vector<T> densify(const cpu_backend& backend, const cache<T>& c) {
  return densify(backend, c.view());
}

}  // namespace dropit
