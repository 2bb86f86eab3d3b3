#pragma once
/// @file
/// The compact cache saved between forward and backward: `cache_layout` (everything backward needs
/// to interpret the bytes), `cache_view` (non-owning, what the expert API takes) and `cache`
/// (owning host storage, what the convenience API returns).
///
/// Storage is two buffers. `values` holds the kept elements in the input's type, in ascending
/// position order. `positions` encodes where they were, as compactly as the policy allows:
///
/// | encoding       | used for                   | position bytes                              |
/// |----------------|----------------------------|---------------------------------------------|
/// | `bitmask`      | min-k, chunked min-k       | 1 bit per element, 32-bit words per chunk   |
/// | `offsets`      | min-k, chunked min-k       | 2 bytes per kept value (4: min-k, n > 2^16) |
/// | `seeded`       | random (element, channel)  | none: positions are regenerated             |
/// | `channel_list` | min-k, channel granularity | 4 bytes per kept channel                    |
///
/// For min-k the smaller of bitmask and offsets is chosen (bitmask on a tie).

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <ostream>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

#include "config.hpp"
#include "policy.hpp"
#include "shape.hpp"
#include "types.hpp"

namespace dropit {

enum class position_encoding : std::uint8_t { bitmask, offsets, seeded, channel_list };

constexpr std::string_view name_of(position_encoding encoding) {
  switch (encoding) {
    case position_encoding::bitmask:
      return "bitmask";
    case position_encoding::offsets:
      return "offsets";
    case position_encoding::seeded:
      return "seeded";
    case position_encoding::channel_list:
      return "channel_list";
  }
  return "unknown";
}

/// Everything backward needs to read a cache: plain data, cheap to copy to a device.
///
/// Element granularity cuts the flattened tensor into `chunk_count()` chunks of `chunk_size`
/// elements (min-k uses a single chunk of the whole tensor); each full chunk keeps
/// `kept_per_chunk` values and the tail keeps `kept_per_tail`. Channel granularity views the
/// tensor as [outer, channels, inner] and keeps `kept_channels` whole channels.
struct cache_layout {
  dropit::shape shape{};
  element_type type = element_type::float32;
  selection_kind selection = selection_kind::chunked_min_k;
  bool channel_granularity = false;
  position_encoding encoding = position_encoding::bitmask;
  double gamma = 0.0;
  std::uint64_t seed = 0;
  bool rescale = false;

  // Element granularity.
  std::int64_t chunk_size = 0;
  std::int64_t kept_per_chunk = 0;
  std::int64_t kept_per_tail = 0;
  int offset_bytes = 2;

  // Channel granularity.
  int channel_axis = 0;
  std::int64_t outer = 0, channels = 0, inner = 0, kept_channels = 0;

  friend bool operator==(const cache_layout&, const cache_layout&) = default;

  DROPIT_HOST_DEVICE std::int64_t numel() const { return shape.numel(); }
  DROPIT_HOST_DEVICE std::int64_t full_chunk_count() const {
    return chunk_size == 0 ? 0 : numel() / chunk_size;
  }
  DROPIT_HOST_DEVICE std::int64_t tail_size() const {
    return chunk_size == 0 ? 0 : numel() % chunk_size;
  }
  DROPIT_HOST_DEVICE std::int64_t chunk_count() const {
    return full_chunk_count() + (tail_size() > 0 ? 1 : 0);
  }
  DROPIT_HOST_DEVICE std::int64_t chunk_begin(std::int64_t chunk) const {
    return chunk * chunk_size;
  }
  DROPIT_HOST_DEVICE std::int64_t chunk_length(std::int64_t chunk) const {
    return chunk < full_chunk_count() ? chunk_size : tail_size();
  }
  DROPIT_HOST_DEVICE std::int64_t kept_in_chunk(std::int64_t chunk) const {
    return chunk < full_chunk_count() ? kept_per_chunk : kept_per_tail;
  }
  /// Fixed counts per chunk: a chunk's values (and offsets) start at a computable index.
  DROPIT_HOST_DEVICE std::int64_t values_begin(std::int64_t chunk) const {
    return chunk * kept_per_chunk;
  }
  DROPIT_HOST_DEVICE std::int64_t mask_words_per_chunk() const { return (chunk_size + 31) / 32; }
  DROPIT_HOST_DEVICE std::int64_t mask_word_begin(std::int64_t chunk) const {
    return chunk * mask_words_per_chunk();
  }

  /// Whether the cache stores where its values were (selections that rank values), rather than
  /// regenerating the positions from the seed.
  DROPIT_HOST_DEVICE bool stores_positions() const { return encoding != position_encoding::seeded; }

  /// Number of stored values.
  DROPIT_HOST_DEVICE std::int64_t kept() const {
    if (channel_granularity) return outer * kept_channels * inner;
    return full_chunk_count() * kept_per_chunk + (tail_size() > 0 ? kept_per_tail : 0);
  }

  DROPIT_HOST_DEVICE std::size_t element_bytes() const {
    return type == element_type::float32 ? 4 : 2;
  }
  DROPIT_HOST_DEVICE std::size_t value_bytes() const {
    return static_cast<std::size_t>(kept()) * element_bytes();
  }
  DROPIT_HOST_DEVICE std::size_t position_bytes() const {
    switch (encoding) {
      case position_encoding::bitmask:
        return 4 * static_cast<std::size_t>(full_chunk_count() * mask_words_per_chunk() +
                                            (tail_size() + 31) / 32);
      case position_encoding::offsets:
        return static_cast<std::size_t>(kept()) * static_cast<std::size_t>(offset_bytes);
      case position_encoding::seeded:
        return 0;
      case position_encoding::channel_list:
        return 4 * static_cast<std::size_t>(kept_channels);
    }
    return 0;
  }
  /// Exact bytes the cache occupies: values plus positions.
  DROPIT_HOST_DEVICE std::size_t bytes() const { return value_bytes() + position_bytes(); }

  /// Factor applied to a kept value of `chunk` (or any channel) in backward: n/k with `rescale`,
  /// otherwise 1.
  DROPIT_HOST_DEVICE float value_scale(std::int64_t chunk) const {
    if (!rescale) return 1.0f;
    if (channel_granularity)
      return kept_channels == 0 ? 1.0f
                                : static_cast<float>(static_cast<double>(channels) /
                                                     static_cast<double>(kept_channels));
    const std::int64_t kept_here = kept_in_chunk(chunk);
    return kept_here == 0 ? 1.0f
                          : static_cast<float>(static_cast<double>(chunk_length(chunk)) /
                                               static_cast<double>(kept_here));
  }
};

/// Plans the cache of a tensor of `type` and `input_shape` under `p`: validates the policy and
/// computes counts, encoding and sizes from the selection's traits. Throws `dropit::error` on bad
/// parameters.
template <policy_type P>
cache_layout plan_cache(const P& p, const shape& input_shape, element_type type) {
  using traits = selection_traits<typename P::selection_type>;
  traits::validate(p.selection);
  cache_layout layout;
  layout.shape = input_shape;
  layout.type = type;
  layout.selection = traits::kind;
  layout.gamma = p.selection.gamma;
  layout.seed = traits::seed(p.selection);
  layout.rescale = traits::rescale(p.selection);
  const std::int64_t n = input_shape.validate("input");

  if constexpr (std::same_as<typename P::granularity_type, channel_granularity>) {
    detail::expect(input_shape.rank >= 1, "channel granularity needs a tensor of rank >= 1");
    layout.channel_granularity = true;
    layout.channel_axis =
        detail::normalize_axis(p.granularity.axis, input_shape.rank, "channel granularity");
    layout.outer = input_shape.product(0, layout.channel_axis);
    layout.channels = input_shape[layout.channel_axis];
    layout.inner = input_shape.product(layout.channel_axis + 1, input_shape.rank);
    detail::expect(layout.channels <= std::numeric_limits<std::int32_t>::max(), "channel count ",
                   layout.channels, " exceeds the 32-bit channel index range");
    layout.kept_channels = kept_count(layout.channels, layout.gamma);
    layout.encoding =
        traits::ranks_values ? position_encoding::channel_list : position_encoding::seeded;
    return layout;
  } else {
    layout.chunk_size = traits::chunk_size(p.selection, n);
    layout.offset_bytes = layout.chunk_size <= max_chunk_size ? 2 : 4;
    layout.kept_per_chunk = kept_count(layout.chunk_size, layout.gamma);
    layout.kept_per_tail = kept_count(layout.tail_size(), layout.gamma);
    if constexpr (!traits::ranks_values) {
      layout.encoding = position_encoding::seeded;
    } else {  // the smaller of offsets and bitmask, bitmask on a tie
      layout.encoding = position_encoding::offsets;
      const std::size_t offsets_bytes = layout.position_bytes();
      layout.encoding = position_encoding::bitmask;
      if (offsets_bytes < layout.position_bytes()) layout.encoding = position_encoding::offsets;
    }
    return layout;
  }
}

template <storage_type T, policy_type P>
cache_layout plan_cache(const P& p, const shape& input_shape) {
  return plan_cache(p, input_shape, element_type_of<T>);
}

/// Calls `visit(p)` with the compile-time `policy<...>` that `spec` describes.
template <class Visit>
decltype(auto) visit_policy(const policy_spec& spec, Visit&& visit) {
  return visit_selection(spec.selection, [&]<class S>(std::type_identity<S>) -> decltype(auto) {
    using traits = selection_traits<S>;
    const S selection = traits::from_spec(spec);
    if constexpr (traits::supports_channels) {
      if (spec.channel_granularity)
        return visit(
            policy<S, channel_granularity>{selection, channel_granularity{spec.channel_axis}});
    } else {
      detail::expect(!spec.channel_granularity, traits::name,
                     " selects elements and does not support channel granularity");
    }
    return visit(policy<S>{selection, {}});
  });
}

inline cache_layout plan_cache(const policy_spec& spec, const shape& input_shape,
                               element_type type) {
  return visit_policy(spec, [&](const auto& p) { return plan_cache(p, input_shape, type); });
}

namespace detail {

/// Checks a layout whole, as every operation does where one crosses an API boundary (views built
/// by hand, layouts unpacked from integers): its enumerations hold known values, its shape is
/// valid, and every derived field is exactly what `plan_cache` gives for its own policy, shape and
/// type. Counts, encodings and sizes that disagree would make readers index outside the buffers.
inline void validate_layout(const cache_layout& layout) {
  // A layer's call validates its one layout at every API boundary it crosses (several per call, a
  // planning each): the last few layouts found valid on this thread are recognised by comparison.
  struct recent_layouts {
    std::array<cache_layout, 4> entries{};
    std::size_t filled = 0, next = 0;
  };
  thread_local recent_layouts recent;
  for (std::size_t i = 0; i < recent.filled; ++i)
    if (recent.entries[i] == layout) return;
  expect(static_cast<int>(layout.type) <= static_cast<int>(element_type::bfloat16),
         "cache layout element type ", static_cast<int>(layout.type),
         " is unknown; expected 0 (float32), 1 (float16) or 2 (bfloat16)");
  expect(is_known_selection(layout.selection), "cache layout selection ",
         static_cast<int>(layout.selection), " is unknown; expected one of ", known_selections());
  expect(static_cast<int>(layout.encoding) <= static_cast<int>(position_encoding::channel_list),
         "cache layout encoding ", static_cast<int>(layout.encoding),
         " is unknown; expected 0 (bitmask), 1 (offsets), 2 (seeded) or 3 (channel_list)");
  layout.shape.validate("cache layout");
  const policy_spec spec{layout.selection, layout.channel_granularity, layout.channel_axis,
                         layout.gamma,     layout.chunk_size,          layout.seed,
                         layout.rescale};
  const cache_layout planned = plan_cache(spec, layout.shape, layout.type);
  const auto expect_field = [&](const char* field, auto got, auto want) {
    expect(got == want, "cache layout is inconsistent: ", field, " is ", +got, " but a ",
           name_of(layout.encoding), " layout of shape ", layout.shape, " at gamma ", layout.gamma,
           " has ", +want, " (plan layouts with plan_cache)");
  };
  expect_field("encoding", static_cast<int>(layout.encoding), static_cast<int>(planned.encoding));
  expect_field("seed", layout.seed, planned.seed);
  expect_field("rescale", layout.rescale, planned.rescale);
  expect_field("chunk_size", layout.chunk_size, planned.chunk_size);
  expect_field("kept_per_chunk", layout.kept_per_chunk, planned.kept_per_chunk);
  expect_field("kept_per_tail", layout.kept_per_tail, planned.kept_per_tail);
  expect_field("offset_bytes", layout.offset_bytes, planned.offset_bytes);
  expect_field("channel_axis", layout.channel_axis, planned.channel_axis);
  expect_field("outer", layout.outer, planned.outer);
  expect_field("channels", layout.channels, planned.channels);
  expect_field("inner", layout.inner, planned.inner);
  expect_field("kept_channels", layout.kept_channels, planned.kept_channels);
  recent.entries[recent.next] = layout;
  recent.next = (recent.next + 1) % recent.entries.size();
  recent.filled = std::min(recent.filled + 1, recent.entries.size());
}

/// A valid layout (see `validate_layout`) of element type `T`.
template <class T>
void expect_layout(const cache_layout& layout) {
  validate_layout(layout);
  expect(layout.type == element_type_of<std::remove_const_t<T>>, "cache holds ",
         name_of(layout.type), " values but was accessed as ",
         name_of(element_type_of<std::remove_const_t<T>>));
}

}  // namespace detail

/// Non-owning view of a cache: a layout and its two buffers. `positions` must be 4-byte aligned.
template <class T>
struct cache_view {
  cache_layout layout{};
  T* values = nullptr;
  void* positions = nullptr;

  // A template, so that cache_view<const T> declares no conversion to itself.
  template <class U = T>
  requires(!std::is_const_v<U>) operator cache_view<const U>() const {
    return {layout, values, positions};
  }
};

/// A cache that owns host storage.
template <storage_type T>
class cache {
 public:
  cache() = default;
  explicit cache(const cache_layout& layout) : layout_(layout) {
    detail::expect_layout<T>(layout);
    values_ = detail::allocate<T>(static_cast<std::size_t>(layout.kept()), "cache values");
    positions_ =
        detail::allocate<std::uint32_t>((layout.position_bytes() + 3) / 4, "cache positions");
  }

  const cache_layout& layout() const { return layout_; }
  /// Exact size of the cached data in bytes (values plus encoded positions).
  std::size_t bytes() const { return layout_.bytes(); }
  std::span<const T> values() const { return values_; }

  cache_view<T> view() { return {layout_, values_.data(), positions_.data()}; }
  cache_view<const T> view() const {
    return {layout_, values_.data(), const_cast<std::uint32_t*>(positions_.data())};
  }

 private:
  cache_layout layout_{};
  std::vector<T> values_;
  std::vector<std::uint32_t> positions_;
};

namespace detail {

/// Checks a view's layout (see `validate_layout`) and that its buffers exist where its layout says
/// there is data.
template <class T>
void expect_buffers(const cache_view<T>& view) {
  expect_layout<T>(view.layout);
  expect(view.values != nullptr || view.layout.kept() == 0,
         "cache values buffer is null but the layout keeps ", view.layout.kept(), " values");
  expect(view.positions != nullptr || view.layout.position_bytes() == 0,
         "cache positions buffer is null but the layout needs ", view.layout.position_bytes(),
         " bytes");
  expect(reinterpret_cast<std::uintptr_t>(view.positions) % 4 == 0,
         "cache positions buffer must be 4-byte aligned");
}

}  // namespace detail
}  // namespace dropit
