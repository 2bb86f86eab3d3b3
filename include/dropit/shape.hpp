#pragma once
/// @file
/// `shape` and `tensor_view`: the non-owning, host/device-copyable description of a dense,
/// contiguous, row-major tensor that every operation takes; `channels_last_dims`, how the
/// `_channels_last` operations see a 4-D tensor stored channels-last.

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <ostream>
#include <type_traits>

#include "config.hpp"

namespace dropit {

/// The extents of a `shape`: a plain array whose members are usable in device code too (those of
/// std::array are host-only under nvcc).
struct extent_array {
  static constexpr int capacity = 8;
  std::int64_t values[capacity];

  DROPIT_HOST_DEVICE constexpr std::int64_t& operator[](int axis) { return values[axis]; }
  DROPIT_HOST_DEVICE constexpr const std::int64_t& operator[](int axis) const {
    return values[axis];
  }
  constexpr std::int64_t* begin() { return values; }
  constexpr std::int64_t* end() { return values + capacity; }
  constexpr const std::int64_t* begin() const { return values; }
  constexpr const std::int64_t* end() const { return values + capacity; }
};

/// Extents of a row-major tensor of up to `max_rank` dimensions.
struct shape {
  static constexpr int max_rank = extent_array::capacity;
  /// The most elements a tensor may hold, 2^60 - 1: any byte size derived from it (values, 8-byte
  /// positions, scratch) then fits a signed 64-bit count.
  static constexpr std::int64_t max_numel = std::numeric_limits<std::int64_t>::max() / 8;

  extent_array extents{};
  int rank = 0;

  constexpr shape() = default;
  shape(std::initializer_list<std::int64_t> dims) {
    detail::expect(dims.size() <= max_rank, "tensor rank ", dims.size(), " exceeds the maximum of ",
                   max_rank);
    for (std::int64_t d : dims) push_back(d);
  }
  template <class Range>
  requires requires(const Range& r) {
    r.begin();
    r.end();
  }
  explicit shape(const Range& dims) {
    for (auto d : dims) push_back(static_cast<std::int64_t>(d));
  }

  void push_back(std::int64_t extent) {
    detail::expect(rank < max_rank, "tensor rank exceeds the maximum of ", max_rank);
    extents[rank++] = extent;
    validate("tensor");
  }

  /// Checks what every operation relies on, for shapes built by hand too: rank in [0, max_rank],
  /// extents >= 0, and the product of the non-zero extents (so every partial product, such as the
  /// outer or inner size around a channel axis) at most `max_numel`. Returns `numel()`.
  std::int64_t validate(const char* what) const {
    detail::expect(rank >= 0 && rank <= max_rank, what, " rank ", rank, " is outside [0, ",
                   max_rank, "]");
    std::int64_t product = 1;
    bool empty = false;
    for (int i = 0; i < rank; ++i) {
      detail::expect(extents[i] >= 0, what, " extent ", extents[i], " in dimension ", i,
                     " is negative; expected >= 0");
      if (extents[i] == 0) {
        empty = true;
        continue;
      }
      product =
          detail::checked_mul(product, extents[i], "element count of ", what, " shape ", *this);
      detail::expect(product <= max_numel, "the non-zero extents of ", what, " shape ", *this,
                     " multiply to more than the ", max_numel, " elements dropit supports");
    }
    return empty ? 0 : product;
  }

  DROPIT_HOST_DEVICE constexpr std::int64_t operator[](int axis) const { return extents[axis]; }

  DROPIT_HOST_DEVICE constexpr std::int64_t numel() const {
    std::int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= extents[i];
    return n;
  }

  /// Product of extents in [first, last).
  DROPIT_HOST_DEVICE constexpr std::int64_t product(int first, int last) const {
    std::int64_t n = 1;
    for (int i = first; i < last; ++i) n *= extents[i];
    return n;
  }

  friend constexpr bool operator==(const shape& a, const shape& b) {
    if (a.rank != b.rank) return false;
    for (int i = 0; i < a.rank; ++i)
      if (a.extents[i] != b.extents[i]) return false;
    return true;
  }

  friend std::ostream& operator<<(std::ostream& out, const shape& s) {
    out << '[';
    for (int i = 0; i < s.rank; ++i) out << (i ? ", " : "") << s.extents[i];
    return out << ']';
  }
};

/// A pointer and a shape; the data is contiguous and row-major.
template <class T>
struct tensor_view {
  T* data = nullptr;
  dropit::shape shape{};

  DROPIT_HOST_DEVICE std::int64_t numel() const { return shape.numel(); }
  // A template, so that tensor_view<const T> declares no conversion to itself.
  template <class U = T>
  requires(!std::is_const_v<U>) operator tensor_view<const U>() const { return {data, shape}; }
};

/// A 4-D tensor of logical shape [N, C, H, W] stored channels-last, in (N, H, W, C) order: `images`
/// blocks of `pixels` rows of `channels` elements in memory. The `_channels_last` operations
/// (compress, the ReLU mask) take its logical shape and read it in logical order, so that what they
/// make is what the same tensor stored contiguously gives.
struct channels_last_dims {
  std::int64_t images = 0, channels = 0, pixels = 0;
};

namespace detail {

/// The channels-last view of a 4-D logical shape [images, channels, height, width].
inline channels_last_dims check_channels_last(const shape& s, const char* what) {
  expect(s.rank == 4, what, " of shape ", s, " is not 4-D; channels-last needs [N, C, H, W]");
  return {s.extents[0], s.extents[1], s.extents[2] * s.extents[3]};
}

/// Maps a possibly negative axis onto [0, rank).
inline int normalize_axis(int axis, int rank, const char* what) {
  const int normalized = axis < 0 ? axis + rank : axis;
  expect(normalized >= 0 && normalized < rank, what, " axis ", axis,
         " is out of range for a tensor of rank ", rank);
  return normalized;
}

/// Checks a view's shape (see `shape::validate`) and that its data exists where it has elements.
template <class T>
void expect_data(const tensor_view<T>& view, const char* what) {
  const std::int64_t n = view.shape.validate(what);
  expect(view.data != nullptr || n == 0, what, " is a null pointer but holds ", n, " elements");
}

}  // namespace detail
}  // namespace dropit
