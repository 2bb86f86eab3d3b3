#pragma once
/// @file
/// The 1-bit cache of a ReLU. ReLU's backward only needs to know where its output was positive, so
/// it can keep one bit per element instead of the output itself, which is what lets the next
/// layer's compact cache actually free the activation.
///
/// Bit i of word i / 32 is set where `!(y[i] <= 0)`: exactly where ReLU's backward passes the
/// gradient (NaN included, as in PyTorch's threshold_backward). `relu_mask_words(n)` gives the
/// mask's size. A 4-D tensor stored channels-last has the same mask as when stored contiguously
/// (bits in its logical order), so a gradient in either layout reads it (the `_channels_last`
/// functions).

#include <cstdint>
#include <type_traits>

#include "backend.hpp"
#include "detail/common/operands.hpp"
#include "detail/common/relu_mask.hpp"
#include "detail/cpu/backend_ops.hpp"
#include "shape.hpp"
#include "types.hpp"

namespace dropit {

/// Packs the mask of a ReLU output `y` into `words` (`relu_mask_words(y.numel())` of them).
template <storage_type T, backend_type Backend>
void pack_relu_mask(const Backend& backend, tensor_view<const std::type_identity_t<T>> y,
                    std::uint32_t* words) {
  const std::int64_t n = detail::check_pack_relu_mask(y, words);
  detail::expect_accessible(backend, y, "ReLU output");
  detail::expect_mask_accessible(backend, words, n);
  detail::backend_ops<Backend>::template pack_relu_mask<T>(backend, y.data,
                                                           static_cast<T*>(nullptr), n, words);
}

/// ReLU forward and its mask in one pass: `y = relu(x)`, and the mask of `y` into `words`
/// (`relu_mask_words(x.numel())` of them). `y` may alias `x`.
template <storage_type T, backend_type Backend>
void relu_with_mask(const Backend& backend, tensor_view<const std::type_identity_t<T>> x,
                    tensor_view<T> y, std::uint32_t* words) {
  const std::int64_t n = detail::check_relu_with_mask(x, y, words);
  detail::expect_accessible(backend, x, "ReLU input");
  detail::expect_accessible(backend, y, "ReLU output");
  detail::expect_mask_accessible(backend, words, n);
  detail::backend_ops<Backend>::template pack_relu_mask<T>(backend, x.data, y.data, n, words);
}

/// ReLU backward from the mask: `dx = mask ? dy : 0`. `dx` may alias `dy`.
template <storage_type T, backend_type Backend>
void apply_relu_mask(const Backend& backend, const std::uint32_t* words,
                     tensor_view<const std::type_identity_t<T>> dy, tensor_view<T> dx) {
  const std::int64_t n = detail::check_apply_relu_mask(words, dy, dx);
  detail::expect_accessible(backend, dy, "ReLU dy");
  detail::expect_accessible(backend, dx, "ReLU dx");
  detail::expect_mask_accessible(backend, words, n);
  detail::backend_ops<Backend>::template apply_relu_mask<T>(backend, words, dy.data, dx.data, n);
}

/// `relu_with_mask` of a 4-D tensor stored channels-last: `x` and `y` have the logical shape
/// [N, C, H, W] and hold their elements in (N, H, W, C) order. The mask is the one `relu_with_mask`
/// gives the same tensor stored contiguously. `y` may alias `x`.
template <storage_type T, backend_type Backend>
void relu_with_mask_channels_last(const Backend& backend,
                                  tensor_view<const std::type_identity_t<T>> x, tensor_view<T> y,
                                  std::uint32_t* words) {
  const std::int64_t n = detail::check_relu_with_mask(x, y, words);
  const channels_last_dims dims = detail::check_channels_last(x.shape, "ReLU input");
  detail::expect_accessible(backend, x, "ReLU input");
  detail::expect_accessible(backend, y, "ReLU output");
  detail::expect_mask_accessible(backend, words, n);
  detail::backend_ops<Backend>::template pack_relu_mask_channels_last<T>(backend, x.data, y.data,
                                                                         dims, words);
}

/// `apply_relu_mask` of a gradient stored channels-last (logical shape [N, C, H, W], elements in
/// (N, H, W, C) order), with the mask of the tensor's logical order. `dx` may alias `dy`.
template <storage_type T, backend_type Backend>
void apply_relu_mask_channels_last(const Backend& backend, const std::uint32_t* words,
                                   tensor_view<const std::type_identity_t<T>> dy,
                                   tensor_view<T> dx) {
  const std::int64_t n = detail::check_apply_relu_mask(words, dy, dx);
  const channels_last_dims dims = detail::check_channels_last(dy.shape, "ReLU dy");
  detail::expect_accessible(backend, dy, "ReLU dy");
  detail::expect_accessible(backend, dx, "ReLU dx");
  detail::expect_mask_accessible(backend, words, n);
  detail::backend_ops<Backend>::template apply_relu_mask_channels_last<T>(backend, words, dy.data,
                                                                          dx.data, dims);
}

}  // namespace dropit
