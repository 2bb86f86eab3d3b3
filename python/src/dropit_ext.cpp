// dropit._C: what the Python package asks of the C++ library besides its operators (registered
// with torch's dispatcher in operators.cpp): policy validation, cache plans and descriptions, the
// weight-gradient path choice, the CPU memory meter. Every answer is the C++ adapter's own; this
// file only converts arguments.

#include <torch/extension.h>

#include <dropit/torch.hpp>

#include "layer_calls.hpp"
#include "policy_arguments.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace py = pybind11;
namespace dt = dropit::torch;

namespace {

using layout_words = std::vector<std::int64_t>;
using dropit_python::operator_policy;

py::dict describe_layout(const dropit::cache_layout& layout) {
  py::dict info;
  info["shape"] = std::vector<std::int64_t>(layout.shape.extents.begin(),
                                            layout.shape.extents.begin() + layout.shape.rank);
  info["dtype"] = std::string(dropit::name_of(layout.type));
  info["encoding"] = std::string(dropit::name_of(layout.encoding));
  info["kept"] = layout.kept();
  info["position_words"] = static_cast<std::int64_t>((layout.position_bytes() + 3) / 4);
  info["bytes"] = layout.bytes();
  return info;
}

py::dict describe(const layout_words& words) {
  return describe_layout(dt::saved_cache::unpack_layout(words));
}

/// The cache an input of `shape` and `dtype` gets under `policy`: what describe() tells of it, and
/// its packed layout (what the operators that read a cache take).
py::dict plan(const std::vector<std::int64_t>& shape, const std::string& dtype,
              const operator_policy& policy) {
  dropit::detail::expect(dtype == "float32" || dtype == "float16" || dtype == "bfloat16",
                         "a cache holds float32, float16 or bfloat16 values, not ", dtype);
  const dropit::element_type type = dtype == "float32"   ? dropit::element_type::float32
                                    : dtype == "float16" ? dropit::element_type::float16
                                                         : dropit::element_type::bfloat16;
  dt::saved_cache cache;
  cache.layout = dropit::plan_cache(policy.spec(), dropit::shape(shape), type);
  py::dict info = describe_layout(cache.layout);
  info["layout"] = cache.packed_layout();
  return info;
}

std::vector<int> codes_of(const std::vector<dropit::block_tool>& tools) {
  std::vector<int> codes;
  for (const dropit::block_tool tool : tools) codes.push_back(static_cast<int>(tool));
  return codes;
}

/// The memory planner's search (the LibTorch planner's, detail/common/plan_search.hpp) over the
/// costs dropit.plan_memory measured: per block, which tools apply and the seconds each adds
/// (keep, convert, recompute, checkpoint); `held(tools)` measures the bytes held after forward with
/// each block given its tool (0, 1, 2, 3). Returns (tools, whether the budget is met).
py::tuple plan_search(const std::vector<std::vector<bool>>& available,
                      const std::vector<std::vector<double>>& added_seconds,
                      std::int64_t dense_held, double dense_seconds, double budget,
                      const py::function& held) {
  dropit::detail::expect(available.size() == added_seconds.size(),
                         "plan_search: ", available.size(), " blocks' tools available but ",
                         added_seconds.size(),
                         " blocks' seconds; expected one entry per block in both");
  dropit::detail::expect(budget > 0.0 && budget <= 1.0, "plan_search: budget ", budget,
                         " is outside (0, 1]");
  std::vector<dropit::detail::block_costs> costs(available.size());
  for (std::size_t b = 0; b < costs.size(); ++b) {
    constexpr std::size_t tools = dropit::block_tool_count;
    dropit::detail::expect(available[b].size() == tools && added_seconds[b].size() == tools,
                           "plan_search: block ", b, " has ", available[b].size(), " and ",
                           added_seconds[b].size(), " entries; expected ", tools,
                           " (keep, convert, recompute, checkpoint)");
    for (std::size_t t = 0; t < tools; ++t) {
      costs[b].available[t] = available[b][t];
      costs[b].added_seconds[t] = added_seconds[b][t];
    }
  }
  dropit::detail::plan_search search(std::move(costs), dense_held, dense_seconds, budget,
                                     [&](const std::vector<dropit::block_tool>& tools) {
                                       return held(codes_of(tools)).cast<std::int64_t>();
                                     });
  const std::vector<dropit::block_tool> tools = search.run();  // before met() is read
  return py::make_tuple(codes_of(tools), search.met());
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "dropit's C++ operations (the LibTorch adapters of include/dropit/torch)";

  py::class_<operator_policy>(m, "PolicyArguments")
      .def(py::init([](std::string selection, std::string granularity, std::int64_t channel_axis,
                       double gamma, std::int64_t chunk_size, std::int64_t seed, std::int64_t call,
                       bool rescale) {
             operator_policy policy{std::move(selection),
                                    std::move(granularity),
                                    channel_axis,
                                    gamma,
                                    chunk_size,
                                    seed,
                                    call,
                                    rescale};
             policy.validate();  // raises ValueError naming any bad field
             return policy;
           }),
           py::arg("selection"), py::arg("granularity"), py::arg("channel_axis"), py::arg("gamma"),
           py::arg("chunk_size"), py::arg("seed"), py::arg("call"), py::arg("rescale"),
           "The policy arguments of dropit's operators, validated.")
      // Picklable, so that a layer holding one copies and pickles as torch's modules do.
      .def(py::pickle(
          [](const operator_policy& p) {
            return py::make_tuple(p.selection, p.granularity, p.channel_axis, p.gamma, p.chunk_size,
                                  p.seed, p.call, p.rescale);
          },
          [](const py::tuple& t) {
            operator_policy policy{t[0].cast<std::string>(),  t[1].cast<std::string>(),
                                   t[2].cast<std::int64_t>(), t[3].cast<double>(),
                                   t[4].cast<std::int64_t>(), t[5].cast<std::int64_t>(),
                                   t[6].cast<std::int64_t>(), t[7].cast<bool>()};
            policy.validate();
            return policy;
          }));

  // The eager layers' calls of their operators (layer_calls.hpp); the GIL is released while they
  // run, as torch's own bindings release it.
  m.def("linear", &dropit_python::call_linear, py::arg("input"), py::arg("weight"), py::arg("bias"),
        py::arg("policy"), py::arg("call_key") = py::none(),
        py::call_guard<py::gil_scoped_release>(), "torch.ops.dropit.linear with `policy`.");
  m.def(
      "conv2d",
      [](const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
         const std::vector<std::int64_t>& stride, const std::vector<std::int64_t>& padding,
         const std::vector<std::int64_t>& dilation, std::int64_t groups,
         const operator_policy& policy, const std::optional<at::Tensor>& call_key) {
        return dropit_python::call_conv2d(input, weight, bias, stride, padding, dilation, groups,
                                          policy, call_key);
      },
      py::arg("input"), py::arg("weight"), py::arg("bias"), py::arg("stride"), py::arg("padding"),
      py::arg("dilation"), py::arg("groups"), py::arg("policy"), py::arg("call_key") = py::none(),
      py::call_guard<py::gil_scoped_release>(), "torch.ops.dropit.conv2d with `policy`.");
  py::class_<dropit_python::producer_arguments>(m, "ProducerArguments")
      .def(py::init([](std::string kind, std::vector<std::optional<at::Tensor>> sources,
                       std::vector<std::int64_t> normalized_shape, double eps,
                       std::string approximate, bool relu) {
             return dropit_python::producer_arguments{std::move(kind),
                                                      std::move(sources),
                                                      std::move(normalized_shape),
                                                      eps,
                                                      std::move(approximate),
                                                      relu};
           }),
           py::arg("kind"), py::arg("sources"), py::arg("normalized_shape"), py::arg("eps"),
           py::arg("approximate"), py::arg("relu"),
           "What a producer's output is recomputed from in C++ (layer_after_producer).");
  m.def("layer_after_producer", &dropit_python::call_layer_after_producer, py::arg("input"),
        py::arg("weight"), py::arg("bias"), py::arg("convolution"), py::arg("producer"),
        py::call_guard<py::gil_scoped_release>(),
        "A linear layer, or a 2-D convolution (convolution: stride, padding, dilation, groups), on "
        "a producer's output, recomputing it in backward from `producer` in C++.");
  m.def("batch_norm_from_statistics", &dropit_python::batch_norm_from_statistics, py::arg("input"),
        py::arg("weight"), py::arg("bias"), py::arg("mean"), py::arg("invstd"),
        py::call_guard<py::gil_scoped_release>(),
        "BatchNorm's output again from the batch's mean and inverse standard deviation, in one "
        "pass (the LibTorch adapters' recomputation).");
  m.def("relu", &dropit_python::call_relu, py::arg("input"),
        py::call_guard<py::gil_scoped_release>(), "torch.ops.dropit.relu.");

  m.def("plan", &plan, py::arg("shape"), py::arg("dtype"), py::arg("policy"),
        "The cache an input of `shape` and `dtype` (float32, float16, bfloat16) gets under "
        "`policy`: kept count, position words, exact bytes and packed layout.");

  m.def(
      "preferred_weight_grad_path",
      [](const layout_words& layout, bool conv2d, std::int64_t row_width, std::int64_t taps,
         const std::string& device) {
        return std::string(dt::name_of(
            dt::preferred_weight_grad_path(dt::saved_cache::unpack_layout(layout),
                                           {conv2d, row_width, taps}, at::Device(device))));
      },
      py::arg("layout"), py::arg("conv2d"), py::arg("row_width"), py::arg("taps"),
      py::arg("device"),
      "The path 'auto' takes for a layer (conv2d or linear) with weight-gradient rows row_width "
      "wide and `taps` kernel taps.");
  m.attr("cpu_isa") =
      std::string(dropit::detail::cpu::name_of(dropit::detail::cpu::active_cpu_isa()));

  m.def("plan_search", &plan_search, py::arg("available"), py::arg("added_seconds"),
        py::arg("dense_held"), py::arg("dense_seconds"), py::arg("budget"), py::arg("held"),
        "The memory planner's search: one tool per block (0 keep, 1 convert, 2 checkpoint) "
        "meeting the budget at the least added time; returns (tools, met).");

  m.def("relu_mask_words", &dropit::relu_mask_words, py::arg("n"),
        "The int32 words of the 1-bit mask a ReLU of n elements saves.");

  m.def("describe", &describe, py::arg("layout"),
        "Shape, dtype, encoding, kept count and exact bytes of a cache layout.");

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
