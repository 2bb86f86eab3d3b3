#pragma once
/// @file
/// Tensors as dropit views, the backend a tensor's device selects, and the compact cache held as
/// torch tensors (so its memory comes from, and is counted by, torch's allocator).

#include <array>
#include <bit>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <variant>
#include <vector>

#include <ATen/Parallel.h>
#include <c10/core/DeviceGuard.h>

#include "../dropit.hpp"
#include "compat.hpp"

// DROPIT_TORCH_CUDA: the program links the CUDA backend's instances (dropit/cuda_instances.cu,
// CMake target dropit::cuda_instances; the Python package builds them when it builds with CUDA),
// so CUDA tensors are supported.
#if defined(DROPIT_TORCH_CUDA)
#include <c10/cuda/CUDAStream.h>

#include "../cuda.hpp"
#endif

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

#if defined(DROPIT_TORCH_CUDA)
using device_backend = std::variant<cpu_backend, cuda_backend>;
inline constexpr const char* supported_devices = "CPU and CUDA tensors";
#else
using device_backend = std::variant<cpu_backend>;
inline constexpr const char* supported_devices =
    "CPU tensors (it was built without the CUDA backend: define DROPIT_TORCH_CUDA and link "
    "dropit::cuda_instances)";
#endif

/// The backend for tensors on `t`'s device. The CPU backend uses torch's intra-op thread count, so
/// dropit and the dense layers it replaces run on the same threads; the CUDA backend runs on
/// torch's current stream of that device, so work is ordered with torch's own kernels. Every
/// adapter checks that its tensors share `t`'s device (or allocates them there), which
/// on_device_of makes current: the CUDA backend need not ask the driver where each one lives.
inline device_backend backend_for(const at::Tensor& t, const char* what) {
  if (t.device().is_cpu()) return cpu_backend{at::get_num_threads()};
#if defined(DROPIT_TORCH_CUDA)
  if (t.device().is_cuda())
    return cuda_backend{.stream = c10::cuda::getCurrentCUDAStream(t.device().index()).stream(),
                        .operands_on_current_device = true};
#endif
  dropit::detail::fail(what, " is on ", t.device().str(), "; this build of dropit::torch supports ",
                       supported_devices);
}

/// Calls `work(backend)` with the backend of `t`'s device, that device being current meanwhile.
template <class Work>
decltype(auto) on_device_of(const at::Tensor& t, const char* what, Work&& work) {
  device_backend backend = backend_for(t, what);
  c10::OptionalDeviceGuard guard;
  if (!t.device().is_cpu()) guard.reset_device(t.device());
  return std::visit(std::forward<Work>(work), backend);
}

/// Checks what every dropit operation needs of a tensor: defined, contiguous, of a supported type.
inline void expect_usable(const at::Tensor& t, const char* what) {
  dropit::detail::expect(t.defined(), what, " is an undefined tensor");
  dropit::detail::expect(t.is_contiguous(), what, " of shape ", shape_of(t),
                         " is not contiguous; call .contiguous() first");
  element_type_of_dtype(t.scalar_type(), what);
}

/// The memory format dropit's kernels read a tensor in (and the ReLU keeps): channels-last for a
/// 4-D tensor stored that way, else contiguous.
inline at::MemoryFormat kernel_memory_format(const at::Tensor& t) {
  return t.dim() == 4 && !t.is_contiguous() && t.is_contiguous(at::MemoryFormat::ChannelsLast)
             ? at::MemoryFormat::ChannelsLast
             : at::MemoryFormat::Contiguous;
}

/// `expect_usable`, a 4-D tensor stored channels-last also taken.
inline void expect_usable_any_format(const at::Tensor& t, const char* what) {
  dropit::detail::expect(t.defined(), what, " is an undefined tensor");
  dropit::detail::expect(t.is_contiguous(kernel_memory_format(t)), what, " of shape ", shape_of(t),
                         " is neither contiguous nor channels-last; call .contiguous() first");
  element_type_of_dtype(t.scalar_type(), what);
}

/// A tensor of dtype `T` stored densely (in any memory format), as a view of its elements in
/// memory order.
template <class T>
requires storage_type<std::remove_const_t<T>> tensor_view<T> memory_order_view(
    const at::Tensor& t) {
  return {static_cast<T*>(const_cast<void*>(t.data_ptr())), dropit::shape{t.numel()}};
}

/// A channels-last tensor of dtype `T` as the core's `_channels_last` functions take it: its
/// logical shape over its data.
template <class T>
requires storage_type<std::remove_const_t<T>> tensor_view<T> channels_last_view(
    const at::Tensor& t) {
  return {static_cast<T*>(const_cast<void*>(t.data_ptr())), shape_of(t)};
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

/// Workspace memory for one operation on `like`'s device, held until the end of the scope: none for
/// zero bytes (what most CPU operations need); a small CPU request from a buffer the thread keeps
/// for it (the general allocator's path for a few kilobytes costs a small layer's call more than
/// its kernel does); else from torch's allocator.
class scoped_workspace {
 public:
  /// The most bytes the thread's buffer serves.
  static constexpr std::size_t thread_buffer_bytes = std::size_t{64} << 10;

  scoped_workspace(std::size_t bytes, const at::Tensor& like) {
    if (bytes == 0) return;
    thread_buffer& buffer = buffer_of_this_thread();
    if (like.is_cpu() && bytes <= thread_buffer_bytes && !buffer.in_use) {
      buffer.in_use = true;  // an operation nested in this one allocates its own
      if (!buffer.memory) buffer.memory = std::make_unique<std::byte[]>(thread_buffer_bytes);
      borrowed_ = &buffer;
      memory_ = {buffer.memory.get(), bytes};
      return;
    }
    tensor_ = at::empty({static_cast<std::int64_t>(bytes)}, like.options().dtype(at::kByte));
    memory_ = {static_cast<std::byte*>(tensor_.data_ptr()), bytes};
  }
  ~scoped_workspace() {
    if (borrowed_) borrowed_->in_use = false;
  }
  scoped_workspace(const scoped_workspace&) = delete;
  scoped_workspace& operator=(const scoped_workspace&) = delete;

  workspace span() const { return memory_; }

 private:
  struct thread_buffer {
    std::unique_ptr<std::byte[]> memory;
    bool in_use = false;
  };
  static thread_buffer& buffer_of_this_thread() {
    thread_local thread_buffer buffer;
    return buffer;
  }

  thread_buffer* borrowed_ = nullptr;
  at::Tensor tensor_;
  workspace memory_{};
};

/// A compact cache whose buffers are torch tensors.
struct saved_cache {
  cache_layout layout{};
  at::Tensor values;     // `layout.kept()` elements of the input's dtype
  at::Tensor positions;  // int32 words holding `layout.position_bytes()`

  /// Bytes held by the cache's tensors.
  std::int64_t bytes() const {
    return static_cast<std::int64_t>(values.nbytes() + positions.nbytes());
  }

  /// Checks the layout whole and that the tensors hold what it describes, so that a cache is never
  /// read through buffers of another size, type or device (such as another layer's tensors).
  void validate() const {
    namespace d = dropit::detail;
    d::validate_layout(layout);
    d::expect(values.defined() && positions.defined(), "cache tensors are undefined");
    d::expect(values.device() == positions.device(), "cache values are on ", values.device(),
              " but its positions on ", positions.device());
    d::expect(values.scalar_type() == dtype_of(layout.type), "cache values have dtype ",
              c10::toString(values.scalar_type()), " but the layout holds ", name_of(layout.type));
    d::expect(values.is_contiguous() && values.numel() == layout.kept(), "cache values hold ",
              values.numel(), values.is_contiguous() ? "" : " non-contiguous",
              " elements but the layout keeps ", layout.kept());
    const auto words = static_cast<std::int64_t>((layout.position_bytes() + 3) / 4);
    d::expect(positions.scalar_type() == at::kInt && positions.is_contiguous() &&
                  positions.numel() == words,
              "cache positions are ", positions.numel(), " ",
              c10::toString(positions.scalar_type()), " elements",
              positions.is_contiguous() ? "" : " (non-contiguous)", " but the layout needs ", words,
              " contiguous int32 words");
  }

  template <storage_type T>
  cache_view<const T> view() const {
    validate();
    dropit::detail::expect_layout<T>(layout);
    return {layout, static_cast<const T*>(values.data_ptr()),
            const_cast<void*>(positions.data_ptr())};
  }

  /// The layout as integers, field by field, so it can travel through autograd's saved data.
  std::vector<std::int64_t> packed_layout() const {
    std::vector<std::int64_t> words{layout.shape.rank};
    words.insert(words.end(), layout.shape.extents.begin(), layout.shape.extents.end());
    words.insert(
        words.end(),
        {static_cast<std::int64_t>(layout.type), static_cast<std::int64_t>(layout.selection),
         layout.channel_granularity, static_cast<std::int64_t>(layout.encoding),
         std::bit_cast<std::int64_t>(layout.gamma), std::bit_cast<std::int64_t>(layout.seed),
         layout.rescale, layout.chunk_size, layout.kept_per_chunk, layout.kept_per_tail,
         layout.offset_bytes, layout.channel_axis, layout.outer, layout.channels, layout.inner,
         layout.kept_channels});
    return words;
  }

  /// The layout `packed_layout` wrote, validated whole. Integers that are no layout (another
  /// length, out-of-range fields, inconsistent counts) raise `dropit::error`.
  static cache_layout unpack_layout(const std::vector<std::int64_t>& words) {
    constexpr std::size_t count = 1 + shape::max_rank + 16;
    dropit::detail::expect(words.size() == count, "packed cache layout has ", words.size(),
                           " words; expected ", count);
    std::size_t next = 0;
    // Each field is range-checked before it is narrowed, so no value wraps into a valid one.
    const auto field = [&](const char* name, std::int64_t low, std::int64_t high) {
      const std::int64_t word = words[next++];
      dropit::detail::expect(word >= low && word <= high, "packed cache layout field ", name,
                             " is ", word, "; expected ", low, " to ", high);
      return word;
    };
    constexpr std::int64_t int_max = std::numeric_limits<int>::max();
    cache_layout layout;
    layout.shape.rank = static_cast<int>(field("rank", 0, shape::max_rank));
    for (auto& extent : layout.shape.extents) extent = words[next++];
    layout.type = static_cast<element_type>(field("type", 0, 2));
    layout.selection = static_cast<selection_kind>(field("selection", 0, 2));
    layout.channel_granularity = field("channel_granularity", 0, 1) != 0;
    layout.encoding = static_cast<position_encoding>(field("encoding", 0, 3));
    layout.gamma = std::bit_cast<double>(words[next++]);
    layout.seed = std::bit_cast<std::uint64_t>(words[next++]);
    layout.rescale = field("rescale", 0, 1) != 0;
    layout.chunk_size = words[next++];
    layout.kept_per_chunk = words[next++];
    layout.kept_per_tail = words[next++];
    layout.offset_bytes = static_cast<int>(field("offset_bytes", -int_max, int_max));
    layout.channel_axis = static_cast<int>(field("channel_axis", -int_max, int_max));
    layout.outer = words[next++];
    layout.channels = words[next++];
    layout.inner = words[next++];
    layout.kept_channels = words[next++];
    dropit::detail::validate_layout(layout);
    return layout;
  }
};

namespace detail {

/// Compresses `input`, contiguous or channels-last, into a cache of `layout`, planned for it.
inline saved_cache compress_planned(const at::Tensor& input, const cache_layout& layout) {
  saved_cache result;
  result.layout = layout;
  result.values = at::empty({result.layout.kept()}, input.options());
  const auto words = static_cast<std::int64_t>((result.layout.position_bytes() + 3) / 4);
  result.positions = at::empty({words}, input.options().dtype(at::kInt));
  // compress writes the encoding's bytes; the padding of the last word is zeroed here, so that a
  // cache's tensors are the same on every device and from run to run.
  if (result.layout.position_bytes() % 4 != 0) result.positions.narrow(0, words - 1, 1).zero_();
  on_device_of(input, "compress input", [&](const auto& backend) {
    visit_dtype(input.scalar_type(), "compress input", [&](auto tag) {
      using T = decltype(tag);
      const cache_view<T> out{result.layout, static_cast<T*>(result.values.data_ptr()),
                              result.positions.data_ptr()};
      if (kernel_memory_format(input) == at::MemoryFormat::ChannelsLast) {
        const scoped_workspace memory(
            compress_channels_last_workspace_bytes<T>(backend, result.layout), input);
        dropit::compress_channels_last<T>(backend, channels_last_view<const T>(input), out,
                                          memory.span());
      } else {
        const scoped_workspace memory(compress_workspace_bytes<T>(backend, result.layout), input);
        dropit::compress<T>(backend, const_view<T>(input, "compress input"), out, memory.span());
      }
    });
  });
  return result;
}

}  // namespace detail

/// Compresses `input` under `spec` into tensors allocated by torch. A 4-D input stored
/// channels-last is read in place, in its logical order: its cache is the contiguous tensor's.
inline saved_cache compress(const at::Tensor& input, const policy_spec& spec) {
  expect_usable_any_format(input, "compress input");
  return detail::compress_planned(
      input,
      plan_cache(spec, shape_of(input), element_type_of_dtype(input.scalar_type(), "input")));
}

namespace detail {

/// A cache a layer made, remembered by weak references only: it keeps neither the input nor the
/// cache alive.
struct remembered_cache {
  std::optional<c10::weak_intrusive_ptr<c10::TensorImpl>> input, values, positions;
  std::uint32_t input_version = 0;
  cache_layout layout{};

  /// The cache of `from` under `wanted` if this is it, still alive, and `from` has not been written
  /// since (torch's version counter counts every in-place write, views' included).
  std::optional<saved_cache> find(const at::Tensor& from, const cache_layout& wanted) const {
    if (!input || from._version() != input_version || layout != wanted) return std::nullopt;
    const auto same_input = input->lock();
    if (!same_input || same_input.get() != from.unsafeGetTensorImpl()) return std::nullopt;
    auto kept_values = values->lock(), kept_positions = positions->lock();
    if (!kept_values || !kept_positions) return std::nullopt;
    saved_cache cache;
    cache.layout = wanted;
    cache.values = at::Tensor(std::move(kept_values));
    cache.positions = at::Tensor(std::move(kept_positions));
    return cache;
  }

  void remember(const at::Tensor& from, const saved_cache& cache) {
    input = c10::weak_intrusive_ptr<c10::TensorImpl>(from.getIntrusivePtr());
    input_version = from._version();
    values = c10::weak_intrusive_ptr<c10::TensorImpl>(cache.values.getIntrusivePtr());
    positions = c10::weak_intrusive_ptr<c10::TensorImpl>(cache.positions.getIntrusivePtr());
    layout = cache.layout;
  }
};

}  // namespace detail

/// `compress` for a layer's forward: when one of the last few layers on this thread compressed the
/// same tensor, unchanged since, under the same policy, and that cache is still alive, it is shared
/// instead of compressed again (both layers then save the same cache tensors). A residual block's
/// first convolution and its shortcut read the same activation, a few layers apart.
inline saved_cache compress_for_layer(const at::Tensor& input, const policy_spec& spec) {
  constexpr std::size_t remembered = 8;
  thread_local std::array<detail::remembered_cache, remembered> recent;
  thread_local std::size_t next = 0;
  expect_usable_any_format(input, "compress input");
  const cache_layout wanted =
      plan_cache(spec, shape_of(input), element_type_of_dtype(input.scalar_type(), "input"));
  for (const detail::remembered_cache& entry : recent)
    if (std::optional<saved_cache> shared = entry.find(input, wanted)) return *shared;
  saved_cache cache = detail::compress_planned(input, wanted);
  recent[next].remember(input, cache);
  next = (next + 1) % remembered;
  return cache;
}

/// The dense tensor a cache stands for (zeros where nothing was kept).
inline at::Tensor densify(const saved_cache& cache) {
  cache.validate();
  at::Tensor out = at::empty(
      std::vector<std::int64_t>(cache.layout.shape.extents.begin(),
                                cache.layout.shape.extents.begin() + cache.layout.shape.rank),
      cache.values.options());
  on_device_of(cache.values, "cache", [&](const auto& backend) {
    visit_dtype(out.scalar_type(), "cache", [&](auto tag) {
      using T = decltype(tag);
      const scoped_workspace memory(densify_workspace_bytes<T>(backend, cache.layout), out);
      dropit::densify<T>(backend, cache.view<T>(), mutable_view<T>(out, "densify output"),
                         memory.span());
    });
  });
  return out;
}

/// ReLU of `input` and the 1-bit mask of where its output is positive, in one pass. The mask is in
/// the tensor's logical order whatever its layout, so the gradient may come in another one. A
/// channels-last input gives a channels-last output; any other layout is read as a contiguous
/// copy.
inline std::tuple<at::Tensor, at::Tensor> relu_with_mask(const at::Tensor& input) {
  dropit::detail::expect(input.defined(), "ReLU input is an undefined tensor");
  element_type_of_dtype(input.scalar_type(), "ReLU input");
  const at::MemoryFormat format = kernel_memory_format(input);
  const at::Tensor x = input.contiguous(format);
  at::Tensor output = at::empty_like(x, format);
  at::Tensor mask = at::empty({relu_mask_words(x.numel())}, x.options().dtype(at::kInt));
  auto* words = static_cast<std::uint32_t*>(mask.data_ptr());
  on_device_of(x, "ReLU input", [&](const auto& backend) {
    visit_dtype(x.scalar_type(), "ReLU input", [&](auto tag) {
      using T = decltype(tag);
      if (format == at::MemoryFormat::ChannelsLast)
        dropit::relu_with_mask_channels_last<T>(backend, channels_last_view<const T>(x),
                                                channels_last_view<T>(output), words);
      else
        dropit::relu_with_mask<T>(backend, memory_order_view<const T>(x),
                                  memory_order_view<T>(output), words);
    });
  });
  return {output, mask};
}

/// The input gradient of a ReLU from its output gradient `dy` and the mask `relu_with_mask` saved.
/// `dx` has `dy`'s layout where that is contiguous or channels-last.
inline at::Tensor relu_backward(const at::Tensor& dy_any, const at::Tensor& mask) {
  dropit::detail::expect(dy_any.defined(), "ReLU gradient is an undefined tensor");
  const at::MemoryFormat format = kernel_memory_format(dy_any);
  // A gradient in another layout (an expanded one from a sum, say) is copied once and masked in
  // place: the copy is already a tensor of its own.
  const bool copied = !dy_any.is_contiguous(format);
  const at::Tensor dy = dy_any.contiguous(format);
  dropit::detail::expect(
      mask.scalar_type() == at::kInt && mask.is_contiguous() &&
          mask.numel() == relu_mask_words(dy.numel()) && mask.device() == dy.device(),
      "ReLU mask of ", mask.numel(), " ", c10::toString(mask.scalar_type()), " words on ",
      mask.device(), " does not fit a gradient of shape ", shape_of(dy), " on ", dy.device(),
      " (expected ", relu_mask_words(dy.numel()), " int32 words)");
  at::Tensor dx = copied ? dy : at::empty_like(dy, format);
  const auto* words = static_cast<const std::uint32_t*>(mask.data_ptr());
  on_device_of(dy, "ReLU gradient", [&](const auto& backend) {
    visit_dtype(dy.scalar_type(), "ReLU gradient", [&](auto tag) {
      using T = decltype(tag);
      if (format == at::MemoryFormat::ChannelsLast)
        apply_relu_mask_channels_last<T>(backend, words, channels_last_view<const T>(dy),
                                         channels_last_view<T>(dx));
      else
        apply_relu_mask<T>(backend, words, memory_order_view<const T>(dy),
                           memory_order_view<T>(dx));
    });
  });
  return dx;
}

/// A valid cache on `dz`'s device and of its dtype.
inline void expect_matches_cache(const saved_cache& cache, const at::Tensor& dz) {
  dropit::detail::expect(dz.defined(), "dZ is an undefined tensor");
  cache.validate();
  dropit::detail::expect(cache.values.device() == dz.device(), "cache is on ",
                         cache.values.device(), " but dZ on ", dz.device());
  dropit::detail::expect(cache.values.scalar_type() == dz.scalar_type(), "cache holds ",
                         name_of(cache.layout.type), " but dZ is ",
                         name_of(element_type_of_dtype(dz.scalar_type(), "dZ")));
}

// The weight gradients. Each is computed one of two ways:
// - sparse: dropit's kernel reads the cache directly. Its work shrinks with γ, but per
//   multiply-add it is slower than a tuned dense kernel.
// - densify: the cache is densified into a transient tensor of the input's size and dtype, and
//   torch's own kernel (oneDNN or OpenBLAS on the CPU, cuBLAS or cuDNN on a GPU) runs on it. The
//   dense input exists only during this layer's backward, and is counted in its measured peak.
// `weight_grad_path::automatic` picks the faster by `preferred_weight_grad_path`.

/// How a weight gradient is computed from its cache.
enum class weight_grad_path { automatic, sparse, densify };

/// The path named "auto", "sparse" or "densify".
inline weight_grad_path weight_grad_path_from_name(std::string_view name) {
  if (name == "auto") return weight_grad_path::automatic;
  if (name == "sparse") return weight_grad_path::sparse;
  if (name == "densify") return weight_grad_path::densify;
  dropit::detail::fail("unknown weight-gradient path '", name,
                       "'; expected 'auto', 'sparse' or 'densify'");
}

inline const char* name_of(weight_grad_path path) {
  switch (path) {
    case weight_grad_path::sparse:
      return "sparse";
    case weight_grad_path::densify:
      return "densify";
    default:
      return "auto";
  }
}

/// What the cost model reads of a layer: its kind, the width of its weight-gradient rows (C_out /
/// groups of a conv2d, N_out of a linear layer) and a conv2d's kernel taps (KH x KW).
struct weight_grad_layer {
  bool conv2d = false;
  std::int64_t row_width = 0;
  std::int64_t taps = 1;
};

/// The smallest drop rate at which dropit's sparse kernel beats densify + torch's kernel on the
/// CPU. Fitted to the crossovers `dropit_bench_torch`'s weight_grad cases measured on the example
/// models' layers (benchmarks/results/torch-*.json), on the two kinds of processor the sparse
/// kernels are dispatched for. The sparse kernels do one multiply-add row of `row_width` per kept
/// element and tap: wide rows and 3x3 kernels amortise the per-element cost. With AVX2 (AMD EPYC)
/// they win on 3x3 convolutions from γ = 0.9 (≥ 32-wide rows) or 0.95, on 1x1 from 0.97, on
/// linear layers only when wide, from 0.95. Where AVX-512 is used (Intel Xeon), oneDNN's dense
/// kernels ran 2-4x faster and the crossovers move towards 1: 0.95 (≥ 64-wide), 0.97 (≥ 32) and
/// 0.99 on 3x3 convolutions, 0.99 on 1x1, and never up to 0.99 on linear layers.
inline double sparse_weight_grad_crossover(const weight_grad_layer& layer) {
  const bool avx512 = dropit::detail::cpu::active_cpu_isa() == dropit::detail::cpu::cpu_isa::avx512;
  if (layer.conv2d && layer.taps >= 9) {
    if (avx512) return layer.row_width >= 64 ? 0.95 : layer.row_width >= 32 ? 0.97 : 0.99;
    return layer.row_width >= 32 ? 0.9 : 0.95;
  }
  if (layer.conv2d) return avx512 ? 0.99 : 0.97;
  if (avx512) return 1.0;
  return layer.row_width >= 192 ? 0.95 : 0.99;
}

/// The faster way to compute the weight gradient of `layer` cached in `layout`: on a GPU always
/// densify (torch's library kernels run at the hardware's speed; dropit's are first versions), on
/// the CPU the sparse kernel from `sparse_weight_grad_crossover` on. 16-bit caches take the sparse
/// kernel on the CPU, which accumulates in float and rounds once, as on a GPU; torch's 16-bit CPU
/// kernels round partial sums.
inline weight_grad_path preferred_weight_grad_path(const cache_layout& layout,
                                                   const weight_grad_layer& layer,
                                                   const at::Device& device) {
  if (!device.is_cpu()) return weight_grad_path::densify;
  if (layout.type != element_type::float32) return weight_grad_path::sparse;
  return layout.gamma >= sparse_weight_grad_crossover(layer) ? weight_grad_path::sparse
                                                             : weight_grad_path::densify;
}

inline weight_grad_path resolve_weight_grad_path(weight_grad_path path, const cache_layout& layout,
                                                 const weight_grad_layer& layer,
                                                 const at::Device& device) {
  return path == weight_grad_path::automatic ? preferred_weight_grad_path(layout, layer, device)
                                             : path;
}

/// The type torch's kernel computes a densified weight gradient in: float for 16-bit tensors on the
/// CPU (its 16-bit CPU kernels round partial sums; dropit's contract is one rounding at the end),
/// the tensor's own type elsewhere (cuBLAS and cuDNN accumulate 16-bit products in float).
inline at::ScalarType accumulation_type(const at::Tensor& dz) {
  return dz.device().is_cpu() ? at::kFloat : dz.scalar_type();
}

// Two helpers that skip a dispatched call where it would change nothing (on small layers the
// calls, not the arithmetic, are the cost).

/// `t` in dtype `type`.
inline at::Tensor in_type(const at::Tensor& t, at::ScalarType type) {
  return t.scalar_type() == type ? t : t.to(type);
}

/// `t` [..., width] as rows [-1, width].
inline at::Tensor as_rows(const at::Tensor& t, std::int64_t width) {
  return t.dim() == 2 ? t : t.reshape({-1, width});
}

/// The cost model's view of a conv2d with weight `weight_size`.
inline weight_grad_layer conv2d_layer(at::IntArrayRef weight_size, const conv2d_params& params) {
  return {true, weight_size[0] / params.groups, weight_size[2] * weight_size[3]};
}

/// dW [N_out, K] of a linear layer whose input was cached in `input`, from `dz` [..., N_out] of
/// any strides (the sparse kernel reads a contiguous copy; torch's kernel takes it as it is).
inline at::Tensor linear_weight_grad(const saved_cache& input, const at::Tensor& dz,
                                     weight_grad_path path = weight_grad_path::automatic) {
  expect_matches_cache(input, dz);
  dropit::detail::expect(dz.dim() >= 1, "dZ must have rank >= 1, got shape ", shape_of(dz));
  // A rank-0 layout has no feature axis: the core check names it.
  const dropit::shape& a = input.layout.shape;
  const std::int64_t in_features = a.rank >= 1 ? a[a.rank - 1] : 0;
  const std::int64_t out_features = dz.size(-1);
  dropit::detail::check_linear(input.layout, shape_of(dz),
                               dropit::shape{out_features, in_features});
  if (resolve_weight_grad_path(path, input.layout, {false, out_features}, dz.device()) ==
      weight_grad_path::densify) {
    const at::ScalarType type = accumulation_type(dz);
    return in_type(at::mm(in_type(as_rows(dz, out_features).t(), type),
                          in_type(as_rows(densify(input), in_features), type)),
                   dz.scalar_type());
  }
  const at::Tensor dz_dense = dz.contiguous();
  at::Tensor dw = at::empty({out_features, in_features}, dz.options());
  on_device_of(dz, "dZ", [&](const auto& backend) {
    visit_dtype(dz.scalar_type(), "dZ", [&](auto tag) {
      using T = decltype(tag);
      const scoped_workspace memory(
          linear_weight_grad_workspace_bytes<T>(backend, input.layout, shape_of(dz), shape_of(dw)),
          dz);
      dropit::linear_weight_grad<T>(backend, input.view<T>(), const_view<T>(dz_dense, "dZ"),
                                    mutable_view<T>(dw, "dW"), grad_mode::overwrite,
                                    memory.span());
    });
  });
  return dw;
}

/// conv2d parameters from torch's lists, two values each (other lengths raise `dropit::error`).
inline conv2d_params conv2d_params_of(at::IntArrayRef stride, at::IntArrayRef padding,
                                      at::IntArrayRef dilation, std::int64_t groups) {
  const auto expect_pair = [](at::IntArrayRef v, const char* what) {
    dropit::detail::expect(v.size() == 2, "conv2d ", what, " has ", v.size(),
                           " values; expected 2");
  };
  expect_pair(stride, "stride");
  expect_pair(padding, "padding");
  expect_pair(dilation, "dilation");
  conv2d_params params;
  for (int i = 0; i < 2; ++i) {
    params.stride[i] = stride[i];
    params.padding[i] = padding[i];
    params.dilation[i] = dilation[i];
  }
  params.groups = groups;
  return params;
}

/// One of `conv2d_params`' pairs as torch's list.
inline std::vector<std::int64_t> torch_pair(const std::int64_t (&pair)[2]) {
  return {pair[0], pair[1]};
}

/// torch's conv2d backward (cuDNN on a GPU) for the gradients `wanted` selects (input, weight,
/// bias), with `input` the layer's input or a tensor of its shape when only dX is wanted.
inline std::tuple<at::Tensor, at::Tensor, at::Tensor> dense_conv2d_backward(
    const at::Tensor& dz, const at::Tensor& input, const at::Tensor& weight,
    const conv2d_params& params, std::array<bool, 3> wanted) {
  // The bias gradient, where wanted, as torch's convolution backward sums it (the dense layer's).
  const std::array<std::int64_t, 1> bias_sizes{weight.size(0)};
  return at::convolution_backward(
      dz, input, weight, wanted[2] ? at::OptionalIntArrayRef(bias_sizes) : c10::nullopt,
      torch_pair(params.stride), torch_pair(params.padding), torch_pair(params.dilation),
      /*transposed=*/false, {0, 0}, params.groups, wanted);
}

/// The input gradient of a conv2d from dZ and the weight alone, for an input of `input_sizes`.
/// From LibTorch 2.0 on, torch's transposed convolution runs the same oneDNN (cuDNN) kernel as the
/// input half of its convolution backward, with the same result, and reads no input-shaped tensor.
/// LibTorch 1.13 has no oneDNN transposed convolution (its fallback is 2.5-6x slower on 3x3
/// layers), so there the input half of the backward runs on an uninitialised stand-in it reads
/// only for its shape; contiguous, because a zero-stride one takes a path about twice as slow.
inline at::Tensor conv2d_input_grad(const at::Tensor& dz, const at::Tensor& weight,
                                    at::IntArrayRef input_sizes, const conv2d_params& params) {
  if constexpr (compat::torch_at_least(2, 0)) {
    // The output padding that makes the transposed convolution's output the input's size.
    const std::vector<std::int64_t> dz_sizes = compat::static_sizes(dz);
    const std::vector<std::int64_t> weight_sizes = compat::static_sizes(weight);
    std::vector<std::int64_t> output_padding(2);
    for (int axis = 0; axis < 2; ++axis) {
      const std::int64_t reach = (dz_sizes[2 + axis] - 1) * params.stride[axis] -
                                 2 * params.padding[axis] +
                                 params.dilation[axis] * (weight_sizes[2 + axis] - 1) + 1;
      output_padding[axis] = input_sizes[2 + axis] - reach;
    }
    return at::conv_transpose2d(dz, weight, {}, torch_pair(params.stride),
                                torch_pair(params.padding), output_padding, params.groups,
                                torch_pair(params.dilation));
  } else {
    return std::get<0>(dense_conv2d_backward(dz, at::empty(input_sizes, dz.options()), weight,
                                             params, {true, false, false}));
  }
}

/// dW of a conv2d whose input was cached in `input`, for a weight of `weight_size`; `dz` of any
/// strides or memory format, as in linear_weight_grad.
inline at::Tensor conv2d_weight_grad(const saved_cache& input, const at::Tensor& dz,
                                     at::IntArrayRef weight_size, const conv2d_params& params,
                                     weight_grad_path path = weight_grad_path::automatic) {
  expect_matches_cache(input, dz);
  dropit::detail::check_conv2d(input.layout, shape_of(dz), dropit::shape(weight_size), params);
  if (resolve_weight_grad_path(path, input.layout, conv2d_layer(weight_size, params),
                               dz.device()) == weight_grad_path::densify) {
    // The weight's values are not read; only its shape is.
    const at::ScalarType type = accumulation_type(dz);
    const at::Tensor weight = at::empty(weight_size, dz.options().dtype(type));
    return in_type(
        std::get<1>(dense_conv2d_backward(in_type(dz, type), in_type(densify(input), type), weight,
                                          params, {false, true, false})),
        dz.scalar_type());
  }
  const at::Tensor dz_dense = dz.contiguous();
  at::Tensor dw = at::empty(weight_size, dz.options());
  on_device_of(dz, "dZ", [&](const auto& backend) {
    visit_dtype(dz.scalar_type(), "dZ", [&](auto tag) {
      using T = decltype(tag);
      const scoped_workspace memory(conv2d_weight_grad_workspace_bytes<T>(
                                        backend, input.layout, shape_of(dz), shape_of(dw), params),
                                    dz);
      dropit::conv2d_weight_grad<T>(backend, input.view<T>(), const_view<T>(dz_dense, "dZ"),
                                    mutable_view<T>(dw, "dW"), params, grad_mode::overwrite,
                                    memory.span());
    });
  });
  return dw;
}

}  // namespace dropit::torch
