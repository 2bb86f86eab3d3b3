// dropit._C: the Python binding of the LibTorch adapters (dropit::torch). Every operation here is
// the C++ adapter's own; this file only converts arguments. The layers are the adapter's C++
// autograd functions, so Python autograd records them like any torch operation.

#include <torch/extension.h>

#include <dropit/torch.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace py = pybind11;
namespace dt = dropit::torch;

namespace {

using layout_words = std::vector<std::int64_t>;

/// The policy of one forward call. `call` numbers the calls of one layer, so that random
/// selection draws afresh each step exactly as the C++ layers do.
dropit::policy_spec make_spec(const std::string& policy, const std::string& granularity,
                              double gamma, std::int64_t chunk_size, std::uint64_t seed,
                              bool rescale, int channel_axis, std::uint64_t call) {
  const auto options = dt::DropitOptions()
                           .gamma(gamma)
                           .selection(dt::selection_from_name(policy))
                           .granularity(dt::granularity_from_name(granularity))
                           .chunk_size(chunk_size)
                           .seed(seed)
                           .rescale(rescale);
  options.validate();
  return options.spec(channel_axis, call);
}

dt::saved_cache cache_of(const at::Tensor& values, const at::Tensor& positions,
                         const layout_words& layout) {
  dt::saved_cache cache;
  cache.values = values;
  cache.positions = positions;
  cache.layout = dt::saved_cache::unpack_layout(layout);
  return cache;
}

at::Tensor bias_argument(const std::optional<at::Tensor>& bias, const at::Tensor& weight) {
  return dt::compat::optional_argument(bias.value_or(at::Tensor()), weight);
}

py::dict describe(const layout_words& words) {
  const dropit::cache_layout layout = dt::saved_cache::unpack_layout(words);
  py::dict info;
  info["shape"] = std::vector<std::int64_t>(layout.shape.extents.begin(),
                                            layout.shape.extents.begin() + layout.shape.rank);
  info["dtype"] = std::string(dropit::name_of(layout.type));
  info["encoding"] = std::string(dropit::name_of(layout.encoding));
  info["kept"] = layout.kept();
  info["bytes"] = layout.bytes();
  return info;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "dropit's C++ operations (the LibTorch adapters of include/dropit/torch)";

  py::class_<dropit::policy_spec>(m, "PolicySpec")
      .def_readonly("gamma", &dropit::policy_spec::gamma)
      .def_readonly("chunk_size", &dropit::policy_spec::chunk_size)
      .def_readonly("seed", &dropit::policy_spec::seed)
      .def_readonly("channel_axis", &dropit::policy_spec::channel_axis);

  m.def("make_spec", &make_spec, py::arg("policy"), py::arg("granularity"), py::arg("gamma"),
        py::arg("chunk_size"), py::arg("seed"), py::arg("rescale"), py::arg("channel_axis"),
        py::arg("call"),
        "The policy of one forward call; raises ValueError naming any bad argument.");

  m.def(
      "linear",
      [](const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
         const dropit::policy_spec& spec) {
        return dt::LinearFunction::apply(input, weight, bias_argument(bias, weight), spec);
      },
      py::arg("input"), py::arg("weight"), py::arg("bias"), py::arg("spec"));

  m.def(
      "conv2d",
      [](const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
         const std::vector<std::int64_t>& stride, const std::vector<std::int64_t>& padding,
         const std::vector<std::int64_t>& dilation, std::int64_t groups,
         const dropit::policy_spec& spec) {
        return dt::Conv2dFunction::apply(input, weight, bias_argument(bias, weight),
                                         dt::conv2d_params_of(stride, padding, dilation, groups),
                                         spec);
      },
      py::arg("input"), py::arg("weight"), py::arg("bias"), py::arg("stride"), py::arg("padding"),
      py::arg("dilation"), py::arg("groups"), py::arg("spec"));

  m.def("relu", [](const at::Tensor& input) { return dt::ReLUFunction::apply(input); },
        py::arg("input"));

  m.def(
      "compress",
      [](const at::Tensor& input, const dropit::policy_spec& spec) {
        const dt::saved_cache cache = dt::compress(input, spec);
        return py::make_tuple(cache.values, cache.positions, cache.packed_layout());
      },
      py::arg("input"), py::arg("spec"),
      "Compresses `input`; returns (values, positions, layout words).");

  m.def(
      "densify",
      [](const at::Tensor& values, const at::Tensor& positions, const layout_words& layout) {
        return dt::densify(cache_of(values, positions, layout));
      },
      py::arg("values"), py::arg("positions"), py::arg("layout"));

  m.def(
      "linear_weight_grad",
      [](const at::Tensor& values, const at::Tensor& positions, const layout_words& layout,
         const at::Tensor& dz, const std::string& path) {
        return dt::linear_weight_grad(cache_of(values, positions, layout), dz,
                                      dt::weight_grad_path_from_name(path));
      },
      py::arg("values"), py::arg("positions"), py::arg("layout"), py::arg("dz"),
      py::arg("path") = "auto", "dW of a linear layer; path is 'auto', 'sparse' or 'densify'.");

  m.def(
      "conv2d_weight_grad",
      [](const at::Tensor& values, const at::Tensor& positions, const layout_words& layout,
         const at::Tensor& dz, const std::vector<std::int64_t>& weight_size,
         const std::vector<std::int64_t>& stride, const std::vector<std::int64_t>& padding,
         const std::vector<std::int64_t>& dilation, std::int64_t groups, const std::string& path) {
        return dt::conv2d_weight_grad(cache_of(values, positions, layout), dz, weight_size,
                                      dt::conv2d_params_of(stride, padding, dilation, groups),
                                      dt::weight_grad_path_from_name(path));
      },
      py::arg("values"), py::arg("positions"), py::arg("layout"), py::arg("dz"),
      py::arg("weight_size"), py::arg("stride"), py::arg("padding"), py::arg("dilation"),
      py::arg("groups"), py::arg("path") = "auto",
      "dW of a conv2d; path is 'auto', 'sparse' or 'densify'.");

  m.def(
      "preferred_weight_grad_path",
      [](const layout_words& layout, bool conv2d, std::int64_t row_width, std::int64_t taps,
         const std::string& device) {
        return std::string(dt::name_of(dt::preferred_weight_grad_path(
            dt::saved_cache::unpack_layout(layout), {conv2d, row_width, taps}, at::Device(device))));
      },
      py::arg("layout"), py::arg("conv2d"), py::arg("row_width"), py::arg("taps"),
      py::arg("device"),
      "The path 'auto' takes for a layer (conv2d or linear) with weight-gradient rows row_width "
      "wide and `taps` kernel taps.");
  m.attr("cpu_isa") = std::string(dropit::detail::cpu::name_of(dropit::detail::cpu::active_cpu_isa()));

  m.def("describe", &describe, py::arg("layout"),
        "Shape, dtype, encoding, kept count and exact bytes of a cache layout.");

  m.def(
      "planned_bytes",
      [](const dropit::policy_spec& spec, const at::Tensor& input) {
        return dropit::plan_cache(spec, dt::shape_of(input),
                                  dt::element_type_of_dtype(input.scalar_type(), "planned cache"))
            .bytes();
      },
      py::arg("spec"), py::arg("input"),
      "Exact bytes of the cache `input` (its shape and dtype) would get under `spec`.");

  // Whether this build takes CUDA tensors (it was compiled with the CUDA backend's instances).
#if defined(DROPIT_TORCH_CUDA)
  m.attr("built_with_cuda") = true;
#else
  m.attr("built_with_cuda") = false;
#endif
  // The counting CPU allocator of the C++ side (installed as torch's CPU allocator on first use);
  // CUDA memory is read from torch's caching allocator in Python.
  py::class_<dt::MemoryMeter>(m, "CpuMemoryMeter")
      .def(py::init([] { return dt::MemoryMeter(c10::kCPU); }))
      .def("current", &dt::MemoryMeter::current)
      .def("peak", &dt::MemoryMeter::peak)
      .def("reset_peak", &dt::MemoryMeter::reset_peak);
}
