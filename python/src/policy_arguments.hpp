#pragma once
// The policy of one forward call as dropit's operators and the Python package pass it: the names
// and numbers of dropit.Policy plus the layer's channel axis and call number.

#include <dropit/torch.hpp>

#include <cstdint>
#include <optional>
#include <string>

namespace dropit_python {

/// What a call key adds to a layer's call number: the value of a one-element int64 CPU tensor,
/// read when a kernel runs. A Python layer with random selection draws such a key from torch's
/// CPU generator on every call, as dropout draws its mask: torch.compile then traces the draw (one
/// graph for every step), and torch.utils.checkpoint, which restores the generator, recomputes a
/// forward with the positions it first drew.
inline std::int64_t call_key_value(const std::optional<at::Tensor>& key) {
  if (!key) return 0;
  dropit::detail::expect(key->defined() && key->numel() == 1 && key->scalar_type() == at::kLong &&
                             key->device().is_cpu(),
                         "the call key must be a one-element int64 CPU tensor; got a ",
                         key->defined() ? c10::toString(key->scalar_type()) : "undefined",
                         " tensor of shape ", dropit::torch::shape_of(*key), " on ",
                         key->defined() ? key->device().str() : std::string("no device"));
  return key->item<std::int64_t>();
}

/// `layout` planned by `operator_policy::planning_spec` with the key mixed into its seed, as
/// `operator_policy::spec` mixes it (only random selection reads the seed).
inline dropit::cache_layout with_call_key(dropit::cache_layout layout,
                                          const std::optional<at::Tensor>& key) {
  if (key)
    layout.seed =
        dropit::detail::mix64(layout.seed + static_cast<std::uint64_t>(call_key_value(key)));
  return layout;
}

struct operator_policy {
  std::string selection;    // "chunked_min_k", "min_k" or "random"
  std::string granularity;  // "element" or "channel"
  std::int64_t channel_axis = 1;
  double gamma = 0.9;
  std::int64_t chunk_size = dropit::default_chunk_size;
  std::int64_t seed = 0;  // the bits of the unsigned seed
  std::int64_t call = 0;  // numbers one layer's forward calls: random selection draws afresh
  bool rescale = false;
  std::optional<at::Tensor> call_key;  // adds its value to `call` when a kernel runs

  /// Raises `dropit::error` naming any bad field.
  void validate() const {
    options().validate();
    checked_channel_axis();
  }

  /// The core's policy of this call, the key read now. Planning a cache with it checks it whole.
  dropit::policy_spec spec() const {
    return options().spec(checked_channel_axis(),
                          static_cast<std::uint64_t>(call + call_key_value(call_key)));
  }

  /// The policy a cache's layout is planned with before the key is read (while tracing, say): with
  /// a key its seed is the unmixed seed + call, which `with_call_key` completes.
  dropit::policy_spec planning_spec() const {
    dropit::policy_spec planned =
        options().spec(checked_channel_axis(), static_cast<std::uint64_t>(call));
    if (call_key)
      planned.seed = static_cast<std::uint64_t>(seed) + static_cast<std::uint64_t>(call);
    return planned;
  }

 private:
  dropit::torch::DropitOptions options() const {
    namespace dt = dropit::torch;
    const auto options = dt::DropitOptions()
                             .gamma(gamma)
                             .selection(dt::selection_from_name(selection))
                             .granularity(dt::granularity_from_name(granularity))
                             .chunk_size(chunk_size)
                             .seed(static_cast<std::uint64_t>(seed))
                             .rescale(rescale);
    // No validate(): planning the cache, which every use of the policy does, checks it whole.
    return options;
  }
  int checked_channel_axis() const {
    dropit::detail::expect(
        channel_axis >= -dropit::shape::max_rank && channel_axis < dropit::shape::max_rank,
        "channel axis ", channel_axis, " is out of range");
    return static_cast<int>(channel_axis);
  }
};

}  // namespace dropit_python
