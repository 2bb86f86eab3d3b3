#pragma once
/// @file
/// Tensors as dropit views, the backend a tensor's device selects, and the compact cache held as
/// torch tensors (so its memory comes from, and is counted by, torch's allocator).

#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "../dropit.hpp"
#include "compat.hpp"

namespace dropit::torch {

/// Calls `visit(T{})` with the dropit element type that stores `dtype`.
template <class Visit>
decltype(auto) visit_dtype(at::ScalarType dtype, const char* what, Visit&& visit) {
  switch (dtype) {
    case at::kFloat:
      return visit(float{});
    case at::kHalf:
      return visit(dropit::half{});
    case at::kBFloat16:
      return visit(dropit::bfloat16{});
    default:
      dropit::detail::fail(what, " has dtype ", c10::toString(dtype),
                           "; expected float32, float16 or bfloat16");
  }
}

inline element_type element_type_of_dtype(at::ScalarType dtype, const char* what) {
  return visit_dtype(dtype, what, [](auto v) { return element_type_of<decltype(v)>; });
}

inline at::ScalarType dtype_of(element_type type) {
  switch (type) {
    case element_type::float32:
      return at::kFloat;
    case element_type::float16:
      return at::kHalf;
    case element_type::bfloat16:
      return at::kBFloat16;
  }
  dropit::detail::fail("unknown element type ", static_cast<int>(type));
}

inline dropit::shape shape_of(const at::Tensor& t) { return dropit::shape(t.sizes()); }

/// The backend for tensors on `device`. The CPU backend uses torch's intra-op thread count, so
/// dropit and the dense layers it replaces run on the same threads.
inline cpu_backend backend_for(const at::Tensor& t, const char* what) {
  dropit::detail::expect(
      t.device().is_cpu(), what, " is on ", t.device().str(),
      "; this build of dropit::torch supports CPU tensors (the CUDA backend is not "
      "available)");
  return cpu_backend{at::get_num_threads()};
}

/// Checks what every dropit operation needs of a tensor: defined, contiguous, of a supported type.
inline void expect_usable(const at::Tensor& t, const char* what) {
  dropit::detail::expect(t.defined(), what, " is an undefined tensor");
  dropit::detail::expect(t.is_contiguous(), what, " of shape ", shape_of(t),
                         " is not contiguous; call .contiguous() first");
  element_type_of_dtype(t.scalar_type(), what);
}

template <storage_type T>
tensor_view<const T> const_view(const at::Tensor& t, const char* what) {
  expect_usable(t, what);
  dropit::detail::expect(t.scalar_type() == dtype_of(element_type_of<T>), what, " has dtype ",
                         c10::toString(t.scalar_type()), "; expected ",
                         c10::toString(dtype_of(element_type_of<T>)));
  return {static_cast<const T*>(t.data_ptr()), shape_of(t)};
}

template <storage_type T>
tensor_view<T> mutable_view(at::Tensor& t, const char* what) {
  const auto view = const_view<T>(t, what);
  return {const_cast<T*>(view.data), view.shape};
}

/// Workspace memory from torch's allocator on `like`'s device.
inline at::Tensor allocate_workspace(std::size_t bytes, const at::Tensor& like) {
  return at::empty({static_cast<std::int64_t>(bytes)}, like.options().dtype(at::kByte));
}

inline workspace span_of(at::Tensor& memory) {
  return {static_cast<std::byte*>(memory.data_ptr()), static_cast<std::size_t>(memory.numel())};
}

/// A compact cache whose buffers are torch tensors.
struct saved_cache {
  cache_layout layout{};
  at::Tensor values;     // `layout.kept()` elements of the input's dtype
  at::Tensor positions;  // int32 words holding `layout.position_bytes()`

  /// Bytes held by the cache's tensors.
  std::int64_t bytes() const {
    return static_cast<std::int64_t>(values.nbytes() + positions.nbytes());
  }

  template <storage_type T>
  cache_view<const T> view() const {
    dropit::detail::expect_type<T>(layout);
    return {layout, static_cast<const T*>(values.data_ptr()),
            const_cast<void*>(positions.data_ptr())};
  }

  /// The layout as integers, so it can travel through autograd's saved data.
  std::vector<std::int64_t> packed_layout() const {
    static_assert(std::is_trivially_copyable_v<cache_layout>);
    std::vector<std::int64_t> words((sizeof(cache_layout) + 7) / 8);
    std::memcpy(words.data(), &layout, sizeof(cache_layout));
    return words;
  }

  static cache_layout unpack_layout(const std::vector<std::int64_t>& words) {
    dropit::detail::expect(words.size() == (sizeof(cache_layout) + 7) / 8,
                           "packed cache layout has ", words.size(), " words; expected ",
                           (sizeof(cache_layout) + 7) / 8);
    cache_layout layout;
    std::memcpy(static_cast<void*>(&layout), words.data(), sizeof(cache_layout));
    return layout;
  }
};

/// Compresses `input` under `spec` into tensors allocated by torch.
inline saved_cache compress(const at::Tensor& input, const policy_spec& spec) {
  expect_usable(input, "compress input");
  const cpu_backend backend = backend_for(input, "compress input");
  saved_cache result;
  result.layout =
      plan_cache(spec, shape_of(input), element_type_of_dtype(input.scalar_type(), "input"));
  result.values = at::empty({result.layout.kept()}, input.options());
  result.positions =
      at::empty({static_cast<std::int64_t>((result.layout.position_bytes() + 3) / 4)},
                input.options().dtype(at::kInt));
  visit_dtype(input.scalar_type(), "compress input", [&](auto tag) {
    using T = decltype(tag);
    at::Tensor memory =
        allocate_workspace(compress_workspace_bytes<T>(backend, result.layout), input);
    dropit::compress<T>(backend, const_view<T>(input, "compress input"),
                        cache_view<T>{result.layout, static_cast<T*>(result.values.data_ptr()),
                                      result.positions.data_ptr()},
                        span_of(memory));
  });
  return result;
}

/// The dense tensor a cache stands for (zeros where nothing was kept).
inline at::Tensor densify(const saved_cache& cache) {
  at::Tensor out = at::empty(
      std::vector<std::int64_t>(cache.layout.shape.extents.begin(),
                                cache.layout.shape.extents.begin() + cache.layout.shape.rank),
      cache.values.options());
  const cpu_backend backend = backend_for(cache.values, "cache");
  visit_dtype(out.scalar_type(), "cache", [&](auto tag) {
    using T = decltype(tag);
    at::Tensor memory = allocate_workspace(densify_workspace_bytes<T>(backend, cache.layout), out);
    dropit::densify<T>(backend, cache.view<T>(), mutable_view<T>(out, "densify output"),
                       span_of(memory));
  });
  return out;
}

/// dW [N_out, K] of a linear layer whose input was cached in `input`, from `dz` [..., N_out].
inline at::Tensor linear_weight_grad(const saved_cache& input, const at::Tensor& dz) {
  expect_usable(dz, "dZ");
  const cpu_backend backend = backend_for(dz, "dZ");
  const std::int64_t in_features = input.layout.shape[input.layout.shape.rank - 1];
  at::Tensor dw = at::empty({dz.size(-1), in_features}, dz.options());
  visit_dtype(dz.scalar_type(), "dZ", [&](auto tag) {
    using T = decltype(tag);
    at::Tensor memory = allocate_workspace(
        linear_weight_grad_workspace_bytes<T>(backend, input.layout, shape_of(dz), shape_of(dw)),
        dz);
    dropit::linear_weight_grad<T>(backend, input.view<T>(), const_view<T>(dz, "dZ"),
                                  mutable_view<T>(dw, "dW"), grad_mode::overwrite, span_of(memory));
  });
  return dw;
}

/// dW of a conv2d whose input was cached in `input`, for a weight of `weight_size`.
inline at::Tensor conv2d_weight_grad(const saved_cache& input, const at::Tensor& dz,
                                     at::IntArrayRef weight_size, const conv2d_params& params) {
  expect_usable(dz, "dZ");
  const cpu_backend backend = backend_for(dz, "dZ");
  at::Tensor dw = at::empty(weight_size, dz.options());
  visit_dtype(dz.scalar_type(), "dZ", [&](auto tag) {
    using T = decltype(tag);
    at::Tensor memory =
        allocate_workspace(conv2d_weight_grad_workspace_bytes<T>(
                               backend, input.layout, shape_of(dz), shape_of(dw), params),
                           dz);
    dropit::conv2d_weight_grad<T>(backend, input.view<T>(), const_view<T>(dz, "dZ"),
                                  mutable_view<T>(dw, "dW"), params, grad_mode::overwrite,
                                  span_of(memory));
  });
  return dw;
}

}  // namespace dropit::torch
