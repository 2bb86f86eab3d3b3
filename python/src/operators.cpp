// dropit's operations registered with torch's dispatcher, in the namespace `dropit`
// (torch.ops.dropit.*), so that torch.compile, its partitioner, selective activation
// checkpointing, CUDA graphs and torch.library.opcheck see them as operators. Every kernel is a
// LibTorch adapter of include/dropit/torch; nothing here computes.
//
// - compress, densify, linear_weight_grad, conv2d_weight_grad, relu_with_mask, relu_backward:
//   one kernel for CPU and CUDA (the adapter picks the backend from the tensor's device); their
//   fake kernels are in python/dropit/_operators.py.
// - linear, conv2d, relu: the layers. Their autograd kernel is the adapters' autograd function,
//   whose forward and backward call the operators above through the dispatcher; without gradients
//   they are torch's own dense operations. linear and conv2d have autocast kernels that cast
//   their floating-point inputs first, so the cache and dZ have one dtype.

#include <ATen/autocast_mode.h>
#include <torch/library.h>

#include <dropit/torch.hpp>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "layer_calls.hpp"
#include "policy_arguments.hpp"

namespace dt = dropit::torch;

namespace {

using dropit_python::operator_policy;

/// A dropit::error raised inside an operator surfaces in Python as ValueError, as from the
/// package's other functions, with the library's message.
template <class Work>
decltype(auto) raising_value_errors(Work&& work) {
  try {
    return std::forward<Work>(work)();
  } catch (const dropit::error& e) {
    TORCH_CHECK_VALUE(false, e.what());
  }
}

// The tags of an operator the compiler may hand its inputs in any layout (torch 2.6 has the tag).
const std::vector<at::Tag>& any_layout_tags() {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 6)
  static const std::vector<at::Tag> tags{at::Tag::flexible_layout};
#else
  static const std::vector<at::Tag> tags;
#endif
  return tags;
}

// The policy arguments every caching operator takes, in this order.
// (They end the schema: call_key has a default; see policy_arguments.hpp.)
#define DROPIT_POLICY_SCHEMA                                                                  \
  "str selection, str granularity, int channel_axis, float gamma, int chunk_size, int seed, " \
  "int call, bool rescale, Tensor? call_key=None"
#define DROPIT_POLICY_PARAMETERS                                                                 \
  c10::string_view selection, c10::string_view granularity, std::int64_t channel_axis,           \
      double gamma, std::int64_t chunk_size, std::int64_t seed, std::int64_t call, bool rescale, \
      const std::optional<at::Tensor>&call_key
#define DROPIT_POLICY_OF_PARAMETERS                                                                \
  operator_policy {                                                                                \
    std::string(selection), std::string(granularity), channel_axis, gamma, chunk_size, seed, call, \
        rescale, call_key                                                                          \
  }
#define DROPIT_POLICY_ARGUMENTS(p)                                                              \
  p.selection, p.granularity, p.channel_axis, p.gamma, p.chunk_size, p.seed, p.call, p.rescale, \
      p.call_key
#define DROPIT_POLICY_TYPES                                                             \
  c10::string_view, c10::string_view, std::int64_t, double, std::int64_t, std::int64_t, \
      std::int64_t, bool, const std::optional<at::Tensor>&

/// The cache of a layout planned by `operator_policy::planning_spec`, the call key mixed into its
/// seed.
dt::saved_cache cache_of(const at::Tensor& values, const at::Tensor& positions,
                         at::IntArrayRef layout, const std::optional<at::Tensor>& call_key) {
  dt::saved_cache cache;
  cache.values = values;
  cache.positions = positions;
  cache.layout =
      dropit_python::with_call_key(dt::saved_cache::unpack_layout(layout.vec()), call_key);
  return cache;
}

// --- the cache operations' kernels (CPU and CUDA) ---------------------------------------------

std::tuple<at::Tensor, at::Tensor> compress_kernel(const at::Tensor& input,
                                                   DROPIT_POLICY_PARAMETERS) {
  return raising_value_errors([&] {
    // A layer that reads an activation another layer just compressed under the same policy shares
    // that cache (compress_for_layer). A channels-last input is read in place; other strides
    // through a contiguous copy.
    const dt::saved_cache cache = dt::compress_for_layer(
        input.contiguous(dt::kernel_memory_format(input)), DROPIT_POLICY_OF_PARAMETERS.spec());
    return std::make_tuple(cache.values, cache.positions);
  });
}

at::Tensor densify_kernel(const at::Tensor& values, const at::Tensor& positions,
                          at::IntArrayRef layout, const std::optional<at::Tensor>& call_key) {
  return raising_value_errors(
      [&] { return dt::densify(cache_of(values, positions, layout, call_key)); });
}

at::Tensor linear_weight_grad_kernel(const at::Tensor& values, const at::Tensor& positions,
                                     at::IntArrayRef layout, const at::Tensor& dz,
                                     c10::string_view path,
                                     const std::optional<at::Tensor>& call_key) {
  return raising_value_errors([&] {
    return dt::linear_weight_grad(cache_of(values, positions, layout, call_key), dz,
                                  dt::weight_grad_path_from_name(path));
  });
}

at::Tensor conv2d_weight_grad_kernel(const at::Tensor& values, const at::Tensor& positions,
                                     at::IntArrayRef layout, const at::Tensor& dz,
                                     at::IntArrayRef weight_size, at::IntArrayRef stride,
                                     at::IntArrayRef padding, at::IntArrayRef dilation,
                                     std::int64_t groups, c10::string_view path,
                                     const std::optional<at::Tensor>& call_key) {
  return raising_value_errors([&] {
    return dt::conv2d_weight_grad(cache_of(values, positions, layout, call_key), dz, weight_size,
                                  dt::conv2d_params_of(stride, padding, dilation, groups),
                                  dt::weight_grad_path_from_name(path));
  });
}

std::tuple<at::Tensor, at::Tensor> relu_with_mask_kernel(const at::Tensor& input) {
  return raising_value_errors([&] { return dt::relu_with_mask(input); });
}

at::Tensor relu_backward_kernel(const at::Tensor& grad, const at::Tensor& mask) {
  return raising_value_errors([&] { return dt::relu_backward(grad, mask); });
}

// --- the layers' autograd functions, calling the operators above through the dispatcher -------

c10::TypedOperatorHandle<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&,
                                                            DROPIT_POLICY_PARAMETERS)>
compress_operator() {
  static const auto handle =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("dropit::compress", "")
          .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, DROPIT_POLICY_TYPES)>();
  return handle;
}

/// The layers' operators, called by their autocast kernels and by the Python layers' direct calls.
c10::TypedOperatorHandle<at::Tensor(const at::Tensor&, const at::Tensor&,
                                    const std::optional<at::Tensor>&, DROPIT_POLICY_TYPES)>
linear_operator() {
  static const auto handle =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("dropit::linear", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                            DROPIT_POLICY_TYPES)>();
  return handle;
}

c10::TypedOperatorHandle<at::Tensor(
    const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, at::IntArrayRef,
    at::IntArrayRef, at::IntArrayRef, std::int64_t, DROPIT_POLICY_TYPES)>
conv2d_operator() {
  static const auto handle =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("dropit::conv2d", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                            at::IntArrayRef, at::IntArrayRef, at::IntArrayRef, std::int64_t,
                            DROPIT_POLICY_TYPES)>();
  return handle;
}

/// `op.call(arguments...)`, below the autograd keys when gradients are off (a layer's forward, its
/// backward without create_graph). The cache operators have no autograd kernel: torch's fallback
/// for such operators would box every argument of every call only to find nothing to record. With
/// gradients on it still runs, and refuses a double backward through them.
template <class Operator, class... Arguments>
decltype(auto) call_below_autograd(const Operator& op, const Arguments&... arguments) {
  if (at::GradMode::is_enabled()) return op.call(arguments...);
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return op.call(arguments...);
}

}  // namespace

namespace dropit_python {

/// A cache made by the compress operator, with its call key (random selection regenerates its
/// positions from it in backward).
struct operator_cache : dt::saved_cache {
  at::Tensor call_key;

  std::optional<at::Tensor> key() const {
    return call_key.defined() ? std::optional<at::Tensor>(call_key) : std::nullopt;
  }
};

/// The cache operations of the layers' autograd functions, through torch's dispatcher.
struct operator_cache_ops {
  using policy_type = operator_policy;
  using cache_type = operator_cache;

  static operator_cache compress(const at::Tensor& input, const operator_policy& policy) {
    operator_cache cache;
    std::tie(cache.values, cache.positions) =
        call_below_autograd(compress_operator(), input, DROPIT_POLICY_ARGUMENTS(policy));
    // The layout follows from the policy, shape and dtype: the kernel planned the same (with the
    // call key, which the operators reading the cache add).
    cache.layout =
        dropit::plan_cache(policy.planning_spec(), dropit::shape(dt::compat::static_sizes(input)),
                           dt::element_type_of_dtype(input.scalar_type(), "input"));
    if (policy.call_key) cache.call_key = *policy.call_key;
    return cache;
  }
  /// Moves the cache's tensors (the call key last, where there is one) into `saved`, leaving its
  /// layout in `cache`.
  static void save(dt::detail::saved_tensors& saved, operator_cache& cache) {
    dt::direct_cache_ops::save(saved, cache);
    if (cache.call_key.defined()) saved.save(std::exchange(cache.call_key, at::Tensor()));
  }
  /// `cache` (what `save` left in it) with its tensors, `saved` from index `first` on.
  static operator_cache load(operator_cache cache, const ::torch::autograd::variable_list& saved,
                             std::size_t first) {
    static_cast<dt::saved_cache&>(cache) = dt::direct_cache_ops::load(cache, saved, first);
    if (saved.size() > first + 2) cache.call_key = saved[first + 2];
    return cache;
  }
  static at::Tensor densify(const operator_cache& cache) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("dropit::densify", "")
                               .typed<decltype(densify_kernel)>();
    return call_below_autograd(op, cache.values, cache.positions, cache.packed_layout(),
                               cache.key());
  }
  static at::Tensor linear_weight_grad(const operator_cache& cache, const at::Tensor& dz) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("dropit::linear_weight_grad", "")
                               .typed<decltype(linear_weight_grad_kernel)>();
    return call_below_autograd(op, cache.values, cache.positions, cache.packed_layout(), dz,
                               c10::string_view("auto"), cache.key());
  }
  static at::Tensor conv2d_weight_grad(const operator_cache& cache, const at::Tensor& dz,
                                       at::IntArrayRef weight_size,
                                       const dropit::conv2d_params& params) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("dropit::conv2d_weight_grad", "")
                               .typed<decltype(conv2d_weight_grad_kernel)>();
    return call_below_autograd(op, cache.values, cache.positions, cache.packed_layout(), dz,
                               weight_size, dt::torch_pair(params.stride),
                               dt::torch_pair(params.padding), dt::torch_pair(params.dilation),
                               params.groups, c10::string_view("sparse"), cache.key());
  }
  static std::tuple<at::Tensor, at::Tensor> relu_with_mask(const at::Tensor& input) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("dropit::relu_with_mask", "")
                               .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&)>();
    return call_below_autograd(op, input);
  }
  static at::Tensor relu_backward(const at::Tensor& dy, const at::Tensor& mask) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("dropit::relu_backward", "")
                               .typed<decltype(relu_backward_kernel)>();
    return call_below_autograd(op, dy, mask);
  }
};

}  // namespace dropit_python

namespace {

using dropit_python::operator_cache_ops;

bool caches(const at::Tensor& weight) {
  return at::GradMode::is_enabled() && weight.requires_grad();
}

at::Tensor linear_autograd(const at::Tensor& input, const at::Tensor& weight,
                           const std::optional<at::Tensor>& bias, DROPIT_POLICY_PARAMETERS) {
  if (!caches(weight)) return at::linear(input, weight, bias);
  return raising_value_errors([&] {
    return dt::basic_linear_function<operator_cache_ops>::apply(
        input, weight, bias.value_or(at::Tensor()), DROPIT_POLICY_OF_PARAMETERS);
  });
}

at::Tensor conv2d_autograd(const at::Tensor& input, const at::Tensor& weight,
                           const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                           at::IntArrayRef padding, at::IntArrayRef dilation, std::int64_t groups,
                           DROPIT_POLICY_PARAMETERS) {
  if (!caches(weight)) return at::conv2d(input, weight, bias, stride, padding, dilation, groups);
  return raising_value_errors([&] {
    return dt::basic_conv2d_function<operator_cache_ops>::apply(
        input, weight, bias.value_or(at::Tensor()),
        dt::conv2d_params_of(stride, padding, dilation, groups), DROPIT_POLICY_OF_PARAMETERS);
  });
}

/// Whether dropit's ReLU takes `input`: a floating type it stores, on a device this build runs on
/// (others get torch's ReLU).
bool relu_supported(const at::Tensor& input) {
  const at::ScalarType type = input.scalar_type();
  const bool stored_type = type == at::kFloat || type == at::kHalf || type == at::kBFloat16;
#if defined(DROPIT_TORCH_CUDA)
  const bool device = input.is_cpu() || input.is_cuda();
#else
  const bool device = input.is_cpu();
#endif
  return stored_type && device;
}

at::Tensor relu_autograd(const at::Tensor& input) {
  if (!(at::GradMode::is_enabled() && input.requires_grad() && relu_supported(input)))
    return at::relu(input);
  return raising_value_errors(
      [&] { return dt::basic_relu_function<operator_cache_ops>::apply(input); });
}

// Without autograd (inference mode, below the autograd key): torch's own dense operations.
at::Tensor linear_dense(const at::Tensor& input, const at::Tensor& weight,
                        const std::optional<at::Tensor>& bias, DROPIT_POLICY_PARAMETERS) {
  return at::linear(input, weight, bias);
}
at::Tensor conv2d_dense(const at::Tensor& input, const at::Tensor& weight,
                        const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                        at::IntArrayRef padding, at::IntArrayRef dilation, std::int64_t groups,
                        DROPIT_POLICY_PARAMETERS) {
  return at::conv2d(input, weight, bias, stride, padding, dilation, groups);
}
at::Tensor relu_dense(const at::Tensor& input) { return at::relu(input); }

// --- autocast: the layer runs in the autocast dtype, its cache included ------------------------

template <c10::DeviceType device>
at::Tensor cast(const at::Tensor& t) {
  return at::autocast::cached_cast(at::autocast::get_autocast_dtype(device), t, device);
}
template <c10::DeviceType device>
std::optional<at::Tensor> cast(const std::optional<at::Tensor>& t) {
  return t ? std::optional<at::Tensor>(cast<device>(*t)) : std::nullopt;
}

template <c10::DeviceType device>
at::Tensor linear_autocast(const at::Tensor& input, const at::Tensor& weight,
                           const std::optional<at::Tensor>& bias, DROPIT_POLICY_PARAMETERS) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  return linear_operator().call(cast<device>(input), cast<device>(weight), cast<device>(bias),
                                selection, granularity, channel_axis, gamma, chunk_size, seed, call,
                                rescale, call_key);
}

template <c10::DeviceType device>
at::Tensor conv2d_autocast(const at::Tensor& input, const at::Tensor& weight,
                           const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                           at::IntArrayRef padding, at::IntArrayRef dilation, std::int64_t groups,
                           DROPIT_POLICY_PARAMETERS) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  return conv2d_operator().call(cast<device>(input), cast<device>(weight), cast<device>(bias),
                                stride, padding, dilation, groups, selection, granularity,
                                channel_axis, gamma, chunk_size, seed, call, rescale, call_key);
}

}  // namespace

namespace dropit_python {

at::Tensor call_linear(const at::Tensor& input, const at::Tensor& weight,
                       const std::optional<at::Tensor>& bias, const operator_policy& p,
                       const std::optional<at::Tensor>& call_key) {
  return linear_operator().call(input, weight, bias, p.selection, p.granularity, p.channel_axis,
                                p.gamma, p.chunk_size, p.seed, p.call, p.rescale, call_key);
}

at::Tensor call_conv2d(const at::Tensor& input, const at::Tensor& weight,
                       const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                       at::IntArrayRef padding, at::IntArrayRef dilation, std::int64_t groups,
                       const operator_policy& p, const std::optional<at::Tensor>& call_key) {
  return conv2d_operator().call(input, weight, bias, stride, padding, dilation, groups, p.selection,
                                p.granularity, p.channel_axis, p.gamma, p.chunk_size, p.seed,
                                p.call, p.rescale, call_key);
}

at::Tensor call_layer_after_producer(const at::Tensor& input, const at::Tensor& weight,
                                     const std::optional<at::Tensor>& bias,
                                     const std::optional<std::vector<std::int64_t>>& convolution,
                                     const producer_arguments& producer) {
  using kind = dt::detail::producer_recipe::kind;
  // (name, recipe kind, sources): built once, not on every layer call.
  static const std::vector<std::pair<std::string, std::pair<kind, std::size_t>>> kinds{
      {"batch_norm", {kind::batch_norm, 5}},
      {"layer_norm", {kind::layer_norm, 3}},
      {"gelu", {kind::gelu, 1}},
      {"silu", {kind::silu, 1}}};
  const auto found = std::find_if(kinds.begin(), kinds.end(),
                                  [&](const auto& k) { return k.first == producer.kind; });
  dropit::detail::expect(found != kinds.end(), "layer_after_producer: producer '", producer.kind,
                         "'; expected batch_norm, layer_norm, gelu or silu");
  dropit::detail::expect(producer.sources.size() == found->second.second,
                         "layer_after_producer: ", producer.sources.size(), " sources of a ",
                         producer.kind, "; expected ", found->second.second);
  dt::detail::recomputable_input recomputable;
  dt::detail::producer_recipe& recipe = recomputable.recipe;
  recipe.what = found->second.first;
  recipe.batch_statistics = true;  // batch_norm: from the batch's statistics, the sources' last two
  recipe.normalized_shape = producer.normalized_shape;
  recipe.eps = producer.eps;
  recipe.approximate = producer.approximate;
  recipe.relu = producer.relu;
  for (const auto& source : producer.sources)
    recomputable.sources.push_back(source.value_or(at::Tensor()));
  const at::Tensor bias_tensor = bias.value_or(at::Tensor());
  if (!convolution)
    return dt::RecomputedInputLinearFunction::apply(input, weight, bias_tensor, recomputable);
  const std::vector<std::int64_t>& c = *convolution;
  dropit::detail::expect(c.size() == 7, "layer_after_producer: ", c.size(),
                         " convolution arguments; expected stride, padding and dilation (2 each) "
                         "and groups");
  const dropit::conv2d_params params =
      dt::conv2d_params_of({c[0], c[1]}, {c[2], c[3]}, {c[4], c[5]}, c[6]);
  return dt::RecomputedInputConv2dFunction::apply(input, weight, bias_tensor, params,
                                                  recomputable);
}

at::Tensor batch_norm_from_statistics(const at::Tensor& input,
                                      const std::optional<at::Tensor>& weight,
                                      const std::optional<at::Tensor>& bias, const at::Tensor& mean,
                                      const at::Tensor& invstd) {
  return dt::detail::producer_recipe::normalise(input, weight.value_or(at::Tensor()),
                                                bias.value_or(at::Tensor()), mean, invstd);
}

at::Tensor call_relu(const at::Tensor& input) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("dropit::relu", "")
                             .typed<decltype(relu_dense)>();
  return op.call(input);
}

}  // namespace dropit_python

TORCH_LIBRARY(dropit, m) {
  // compress and the ReLU read a tensor in its logical order whatever the layout (a cache and a
  // mask are the contiguous tensor's), so the compiler may hand them any: it keeps a convolutional
  // network channels-last.
  m.def(torch::schema("compress(Tensor input, " DROPIT_POLICY_SCHEMA
                      ") -> (Tensor values, Tensor positions)"),
        any_layout_tags());
  m.def(
      "densify(Tensor values, Tensor positions, int[] layout, Tensor? call_key=None) "
      "-> Tensor");
  m.def(
      "linear_weight_grad(Tensor values, Tensor positions, int[] layout, Tensor dz, "
      "str path=\"auto\", Tensor? call_key=None) -> Tensor");
  m.def(
      "conv2d_weight_grad(Tensor values, Tensor positions, int[] layout, Tensor dz, "
      "int[] weight_size, int[] stride, int[] padding, int[] dilation, int groups, "
      "str path=\"auto\", Tensor? call_key=None) -> Tensor");
  m.def(torch::schema("relu_with_mask(Tensor input) -> (Tensor output, Tensor mask)"),
        any_layout_tags());
  m.def(torch::schema("relu_backward(Tensor grad, Tensor mask) -> Tensor"), any_layout_tags());
  m.def("linear(Tensor input, Tensor weight, Tensor? bias, " DROPIT_POLICY_SCHEMA ") -> Tensor");
  m.def(
      "conv2d(Tensor input, Tensor weight, Tensor? bias, int[] stride, int[] padding, "
      "int[] dilation, int groups, " DROPIT_POLICY_SCHEMA ") -> Tensor");
  m.def("relu(Tensor input) -> Tensor");
}

// The adapters pick the backend from the tensor's device, so CPU and CUDA share one kernel each.
#define DROPIT_REGISTER_CACHE_KERNELS(m)                    \
  m.impl("compress", &compress_kernel);                     \
  m.impl("densify", &densify_kernel);                       \
  m.impl("linear_weight_grad", &linear_weight_grad_kernel); \
  m.impl("conv2d_weight_grad", &conv2d_weight_grad_kernel); \
  m.impl("relu_with_mask", &relu_with_mask_kernel);         \
  m.impl("relu_backward", &relu_backward_kernel)

TORCH_LIBRARY_IMPL(dropit, CPU, m) { DROPIT_REGISTER_CACHE_KERNELS(m); }
#if defined(DROPIT_TORCH_CUDA)
TORCH_LIBRARY_IMPL(dropit, CUDA, m) { DROPIT_REGISTER_CACHE_KERNELS(m); }
#endif

TORCH_LIBRARY_IMPL(dropit, CompositeExplicitAutograd, m) {
  m.impl("linear", &linear_dense);
  m.impl("conv2d", &conv2d_dense);
  m.impl("relu", &relu_dense);
}

TORCH_LIBRARY_IMPL(dropit, Autograd, m) {
  m.impl("linear", &linear_autograd);
  m.impl("conv2d", &conv2d_autograd);
  m.impl("relu", &relu_autograd);
}

TORCH_LIBRARY_IMPL(dropit, AutocastCPU, m) {
  m.impl("linear", &linear_autocast<c10::DeviceType::CPU>);
  m.impl("conv2d", &conv2d_autocast<c10::DeviceType::CPU>);
}
TORCH_LIBRARY_IMPL(dropit, AutocastCUDA, m) {
  m.impl("linear", &linear_autocast<c10::DeviceType::CUDA>);
  m.impl("conv2d", &conv2d_autocast<c10::DeviceType::CUDA>);
}
