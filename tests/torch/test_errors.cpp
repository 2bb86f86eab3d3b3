// The table of bad inputs at the LibTorch adapter's entry points: every row must raise a
// dropit::error naming the bad value, before anything is read or written.

#include "torch_helpers.hpp"

namespace {

using namespace torch_test;

struct bad_input {
  std::string what;
  std::function<void()> call;
  std::vector<std::string> named;  // what the message must contain
};

dropit::policy_spec spec(double gamma = 0.5, std::int64_t chunk = 16) {
  dropit::policy_spec s;
  s.gamma = gamma;
  s.chunk_size = chunk;
  return s;
}

}  // namespace

TEST_CASE("torch: bad input table of the adapter") {
  const std::int64_t two40 = std::int64_t{1} << 40;
  const at::Tensor a = ::torch::randn({6, 4});
  const dt::saved_cache cache = dt::compress(a, spec());
  const dt::saved_cache other_layer = dt::compress(::torch::randn({8, 5}), spec());
  const dt::saved_cache image = dt::compress(::torch::randn({2, 4, 5, 5}), spec());
  const at::Tensor dz = ::torch::randn({6, 3});
  const at::Tensor meta = at::empty({6, 3}, at::TensorOptions().device(at::kMeta));
  const auto with = [&](auto change) {
    dt::saved_cache c = cache;
    change(c);
    return c;
  };
  const auto packed_with = [&](std::size_t word, std::int64_t value) {
    std::vector<std::int64_t> words = cache.packed_layout();
    words[word] = value;
    return words;
  };
  dropit::conv2d_params groups3;
  groups3.groups = 3;
  dropit::conv2d_params stride0;
  stride0.stride[0] = 0;
  dt::Linear layer(::torch::nn::LinearOptions(4, 3), dt::DropitOptions().gamma(0.5));

  const std::vector<bad_input> table{
      // compress: the tensor and the policy.
      {"non-contiguous input", [&] { dt::compress(::torch::randn({4, 6}).t(), spec()); },
       {"neither contiguous nor channels-last", "[6, 4]"}},
      {"4-D input neither contiguous nor channels-last",
       [&] { dt::compress(::torch::randn({2, 3, 5, 4}).transpose(2, 3), spec()); },
       {"neither contiguous nor channels-last", "[2, 3, 4, 5]"}},
      {"input of dtype double", [&] { dt::compress(a.to(at::kDouble), spec()); },
       {"Double", "float32"}},
      {"input on another device", [&] { dt::compress(at::empty({6, 4}, meta.options()), spec()); },
       {"meta"}},
      {"gamma NaN", [&] { dt::compress(a, spec(std::nan(""))); }, {"gamma = nan"}},
      {"gamma 1", [&] { dt::compress(a, spec(1.0)); }, {"gamma = 1"}},
      {"chunk size 0", [&] { dt::compress(a, spec(0.5, 0)); }, {"D = 0"}},
      {"chunk size 65537", [&] { dt::compress(a, spec(0.5, 65537)); }, {"D = 65537"}},
      // A cache whose tensors do not match its layout.
      {"values shorter than the layout keeps",
       [&] { dt::densify(with([](auto& c) { c.values = c.values.narrow(0, 0, 5); })); },
       {"cache values hold 5", std::to_string(cache.layout.kept())}},
      {"values of another dtype",
       [&] { dt::densify(with([](auto& c) { c.values = c.values.to(at::kHalf); })); },
       {"Half", "float32"}},
      {"non-contiguous values",
       [&] {
         dt::densify(with([](auto& c) {
           c.values = ::torch::zeros({2 * c.values.numel()}).slice(0, 0, 2 * c.values.numel(), 2);
         }));
       },
       {"non-contiguous"}},
      {"positions of another cache",
       [&] { dt::densify(with([&](auto& c) { c.positions = other_layer.positions; })); },
       {"cache positions are", "int32 words"}},
      {"values on another device",
       [&] { dt::densify(with([&](auto& c) { c.values = at::empty_like(c.values, meta.options()); })); },
       {"meta", "cpu"}},
      // Weight gradients: dZ against the cache.
      {"cache from another layer", [&] { dt::linear_weight_grad(other_layer, dz); },
       {"[6, 3]", "[8, 5]"}},
      {"dZ of dtype double", [&] { dt::linear_weight_grad(cache, dz.to(at::kDouble)); },
       {"Double", "float32"}},
      {"dZ of another float type than the cache", [&] { dt::linear_weight_grad(cache, dz.to(at::kHalf)); },
       {"float32", "float16"}},
      {"dZ on another device", [&] { dt::linear_weight_grad(cache, meta); }, {"meta"}},
      {"dZ of rank 0", [&] { dt::linear_weight_grad(cache, ::torch::randn({})); },
       {"dZ", "rank >= 1"}},
      {"conv2d gradient of a linear cache",
       [&] { dt::conv2d_weight_grad(cache, ::torch::randn({2, 6, 3, 3}), {6, 4, 3, 3}, {}); },
       {"[N, C_in, H, W]", "[6, 4]"}},
      {"conv2d groups not dividing the channels",
       [&] { dt::conv2d_weight_grad(image, ::torch::randn({2, 6, 3, 3}), {6, 1, 3, 3}, groups3); },
       {"groups 3", "input channels 4"}},
      {"conv2d zero stride",
       [&] { dt::conv2d_weight_grad(image, ::torch::randn({2, 6, 3, 3}), {6, 4, 3, 3}, stride0); },
       {"stride 0"}},
      {"conv2d output size <= 0",
       [&] { dt::conv2d_weight_grad(image, ::torch::randn({2, 6, 1, 1}), {6, 4, 7, 7}, {}); },
       {"output height", "kernel 7"}},
      // The layout as autograd saves it: integers that are no layout.
      {"packed layout of another length",
       [&] { dt::saved_cache::unpack_layout(std::vector<std::int64_t>(3, 0)); },
       {"packed cache layout has 3 words"}},
      {"packed rank 9", [&] { dt::saved_cache::unpack_layout(packed_with(0, 9)); },
       {"field rank is 9"}},
      {"packed flag that is no bool", [&] { dt::saved_cache::unpack_layout(packed_with(11, 2)); },
       {"channel_granularity is 2"}},
      {"packed encoding 7", [&] { dt::saved_cache::unpack_layout(packed_with(12, 7)); },
       {"encoding is 7"}},
      {"packed kept count larger than the chunk",
       [&] { dt::saved_cache::unpack_layout(packed_with(17, 17)); }, {"kept_per_chunk is 17"}},
      {"packed extents that overflow",
       [&] {
         auto words = packed_with(1, two40);
         words[2] = two40;
         dt::saved_cache::unpack_layout(words);
       },
       {"overflows"}},
      // A layer given a tensor on another device.
      {"layer input on another device", [&] { layer(at::empty({6, 4}, meta.options())); },
       {"meta"}},
  };
  for (const bad_input& row : table) {
    CAPTURE(row.what);
    const std::string message = error_message(row.call);
    INFO("message: ", message);
    CHECK_MESSAGE(message.rfind("dropit: ", 0) == 0, "expected a dropit::error");
    for (const std::string& needle : row.named)
      CHECK_MESSAGE(message.find(needle) != std::string::npos, "message should name '", needle, "'");
  }
}

TEST_CASE("torch: the packed layout round-trips for every policy") {
  const at::Tensor x = ::torch::randn({3, 8, 5});
  for (const auto selection : {dropit::selection_kind::random, dropit::selection_kind::min_k,
                               dropit::selection_kind::chunked_min_k})
    for (const bool channels : {false, true}) {
      if (channels && selection == dropit::selection_kind::chunked_min_k) continue;
      dropit::policy_spec s = spec(0.6, 7);
      s.selection = selection;
      s.channel_granularity = channels;
      s.seed = 11;
      s.rescale = selection == dropit::selection_kind::random;
      const dt::saved_cache c = dt::compress(x, s);
      dt::saved_cache copy = c;
      copy.layout = dt::saved_cache::unpack_layout(c.packed_layout());
      CHECK(copy.packed_layout() == c.packed_layout());
      CHECK(same_values(dt::densify(copy), dt::densify(c)));
    }
}
