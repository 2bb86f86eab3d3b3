#pragma once
// The checks of the operands that every entry point makes before it dispatches to a backend,
// beyond shapes and layouts: the memory each operand points to must be usable by the backend
// (`backend_ops<B>::expect_accessible`), and the workspace must hold what the backend asked for.

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "../../backend.hpp"
#include "../../cache.hpp"
#include "../../shape.hpp"
#include "relu_mask.hpp"
#include "workspace.hpp"

namespace dropit::detail {

template <backend_type B, class T>
void expect_accessible(const B& backend, const tensor_view<T>& view, const char* what) {
  backend_ops<B>::expect_accessible(
      backend, view.data, static_cast<std::size_t>(view.numel()) * sizeof(std::remove_const_t<T>),
      what);
}

template <backend_type B, class T>
void expect_accessible(const B& backend, const cache_view<T>& view) {
  backend_ops<B>::expect_accessible(backend, view.values, view.layout.value_bytes(),
                                    "cache values buffer");
  backend_ops<B>::expect_accessible(backend, view.positions, view.layout.position_bytes(),
                                    "cache positions buffer");
}

/// The mask of `n` elements in `words`.
template <backend_type B>
void expect_mask_accessible(const B& backend, const std::uint32_t* words, std::int64_t n) {
  backend_ops<B>::expect_accessible(
      backend, words, static_cast<std::size_t>(relu_mask_words(n)) * 4, "ReLU mask buffer");
}

/// `memory` holds the `required` bytes of `operation`'s workspace, where the backend can use them.
template <backend_type B>
void expect_workspace(const B& backend, workspace memory, std::size_t required,
                      const char* operation, const char* what) {
  expect_workspace_size(memory, required, operation);
  backend_ops<B>::expect_accessible(backend, memory.data(), required, what);
}

}  // namespace dropit::detail
