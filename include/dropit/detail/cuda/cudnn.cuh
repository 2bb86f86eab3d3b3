#pragma once
// cuDNN's graph API as the CUDA backend uses it: the conv2d weight gradient of a densified cache,
// the kernel torch's own convolution backward runs (and so the LibTorch adapters' path). Compiled
// where CMake's dropit::cuda found cuDNN 9 (DROPIT_CUDA_CUDNN); without it, or where no engine
// runs a geometry, the backend keeps its own im2col + cuBLAS path.
//
// One operation graph per problem: X, dY and dW in the cache's type T, NCHW, dW overwritten or
// accumulated into (beta 0 or 1, blended in the float compute type; no engine that reduces in
// reduced precision is taken: the CUDA tests hold dW += to the once-rounded sum), and, as PyTorch
// does, float operands on TF32 tensor cores only where the backend allows TF32. Its execution
// plan is built on first use (heuristics, then the first engine configuration that finalizes:
// milliseconds) and kept per host thread and device, as PyTorch keeps its own: cuDNN does not
// promise that every engine's plan may run from several threads at once. A call binds the
// stream, makes a variant pack and executes.

#include <cudnn.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "../../types.hpp"
#include "../common/geometry.hpp"
#include "library_handles.hpp"
#include "runtime.hpp"

namespace dropit::detail::cuda {

/// The first cuDNN whose execution plans take a device-property descriptor (the handle attributes
/// they replace are deprecated).
inline constexpr std::size_t cudnn_minimum_version = 90800;

/// Throws `dropit::error` naming `what` and the cuDNN status unless it is success.
inline void check_cudnn(cudnnStatus_t status, const char* what) {
  if (status != CUDNN_STATUS_SUCCESS) fail(what, ": cuDNN error ", cudnnGetErrorString(status));
}

struct cudnn_library {
  using handle_type = cudnnHandle_t;

  static cudnnHandle_t create(const char* what) {
    cudnnHandle_t created = nullptr;
    check_cudnn(cudnnCreate(&created), what);
    return created;
  }
};

/// A backend descriptor owned by this object.
class cudnn_descriptor {
 public:
  cudnn_descriptor(cudnnBackendDescriptorType_t type, const char* what) : what_(what) {
    check_cudnn(cudnnBackendCreateDescriptor(type, &descriptor_), what);
  }
  cudnn_descriptor(const cudnn_descriptor&) = delete;
  cudnn_descriptor& operator=(const cudnn_descriptor&) = delete;
  ~cudnn_descriptor() {
    if (descriptor_ != nullptr) static_cast<void>(cudnnBackendDestroyDescriptor(descriptor_));
  }

  cudnnBackendDescriptor_t get() const { return descriptor_; }

  template <class V>
  cudnn_descriptor& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                        const V* values, std::int64_t count = 1) {
    check_cudnn(cudnnBackendSetAttribute(descriptor_, name, type, count, values), what_);
    return *this;
  }
  cudnn_descriptor& set(cudnnBackendAttributeName_t name, const cudnn_descriptor& other) {
    const cudnnBackendDescriptor_t value = other.get();
    return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, &value);
  }
  template <std::size_t N>
  cudnn_descriptor& set(cudnnBackendAttributeName_t name, const std::array<std::int64_t, N>& v) {
    return set(name, CUDNN_TYPE_INT64, v.data(), static_cast<std::int64_t>(N));
  }

  /// cudnnBackendFinalize's status: whether cuDNN accepts the descriptor as set.
  cudnnStatus_t try_finalize() { return cudnnBackendFinalize(descriptor_); }
  cudnn_descriptor& finalize() {
    check_cudnn(try_finalize(), what_);
    return *this;
  }

 private:
  cudnnBackendDescriptor_t descriptor_ = nullptr;
  const char* what_;
};

template <class T>
inline constexpr cudnnDataType_t cudnn_data_type = std::is_same_v<T, float>  ? CUDNN_DATA_FLOAT
                                                   : std::is_same_v<T, half> ? CUDNN_DATA_HALF
                                                                             : CUDNN_DATA_BFLOAT16;

/// What an execution plan is built for: the operands' type, the geometry, the alignment the
/// caller's dY and dW are promised (16 bytes, or their element's where either is not 16-byte
/// aligned), whether dW is accumulated into, and whether float operands may run on TF32 tensor
/// cores.
struct cudnn_wgrad_problem {
  cudnnDataType_t type;
  std::array<std::int64_t, 4> x, dy, dw;  // [N, C, H, W], [N, K, P, Q], [K, C/G, R, S]
  std::array<std::int64_t, 2> stride, padding, dilation;
  std::int64_t operand_alignment;
  bool accumulate;
  bool allow_tf32;

  auto operator<=>(const cudnn_wgrad_problem&) const = default;
};

template <class T>
cudnn_wgrad_problem make_cudnn_wgrad_problem(const conv2d_geometry& g, bool aligned,
                                             bool accumulate, bool allow_tf32) {
  return {cudnn_data_type<T>,
          {g.batch, g.in_channels, g.height, g.width},
          {g.batch, g.out_channels, g.out_height, g.out_width},
          {g.out_channels, g.in_per_group(), g.kernel_h, g.kernel_w},
          {g.stride_h, g.stride_w},
          {g.pad_h, g.pad_w},
          {g.dilation_h, g.dilation_w},
          aligned ? 16 : static_cast<std::int64_t>(sizeof(T)),
          accumulate,
          allow_tf32};
}

/// The unique ids of the graph's tensors, which the variant pack binds to memory.
enum cudnn_wgrad_uid : std::int64_t { wgrad_x = 1, wgrad_dy = 2, wgrad_dw = 3 };

/// The problem's operation graph (X, dY, dW, the convolution and its backward-filter operation),
/// finalized: what cuDNN checks of the geometry needs no device.
struct cudnn_wgrad_graph {
  static constexpr const char* what = "conv2d_weight_grad (cuDNN graph)";
  cudnn_descriptor x{CUDNN_BACKEND_TENSOR_DESCRIPTOR, what};
  cudnn_descriptor dy{CUDNN_BACKEND_TENSOR_DESCRIPTOR, what};
  cudnn_descriptor dw{CUDNN_BACKEND_TENSOR_DESCRIPTOR, what};
  cudnn_descriptor convolution{CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, what};
  cudnn_descriptor operation{CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR, what};
  cudnn_descriptor graph{CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, what};

  explicit cudnn_wgrad_graph(const cudnn_wgrad_problem& p) {
    // X lives in the backend's workspace (a 64-byte aligned segment); dY and dW are the caller's.
    describe_tensor(x, wgrad_x, p.type, p.x, 16);
    describe_tensor(dy, wgrad_dy, p.type, p.dy, p.operand_alignment);
    describe_tensor(dw, wgrad_dw, p.type, p.dw, p.operand_alignment);
    const std::int64_t spatial_dims = 2;
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
    convolution.set(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, &spatial_dims)
        .set(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &compute)
        .set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, &mode)
        .set(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, p.padding)
        .set(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, p.padding)
        .set(CUDNN_ATTR_CONVOLUTION_DILATIONS, p.dilation)
        .set(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, p.stride)
        .finalize();
    const float alpha = 1.0f, beta = p.accumulate ? 1.0f : 0.0f;
    operation.set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X, x)
        .set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY, dy)
        .set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW, dw)
        .set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC, convolution)
        .set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA, CUDNN_TYPE_FLOAT, &alpha)
        .set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA, CUDNN_TYPE_FLOAT, &beta)
        .finalize();
    graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, operation).finalize();
  }

 private:
  static void describe_tensor(cudnn_descriptor& t, std::int64_t uid, cudnnDataType_t type,
                              const std::array<std::int64_t, 4>& dims, std::int64_t alignment) {
    const std::array<std::int64_t, 4> strides{dims[1] * dims[2] * dims[3], dims[2] * dims[3],
                                              dims[3], 1};
    t.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, &type)
        .set(CUDNN_ATTR_TENSOR_DIMENSIONS, dims)
        .set(CUDNN_ATTR_TENSOR_STRIDES, strides)
        .set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, &uid)
        .set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, &alignment)
        .finalize();
  }
};

/// Whether a problem may run on an engine with these numerical notes: tensor cores for float
/// operands (TF32) only where allowed, as PyTorch decides; and, so that dW equals the CPU
/// backend's up to summation order, no reduction in reduced precision, no inputs converted down,
/// no FFT or Winograd transform.
inline bool cudnn_engine_allowed(const cudnn_wgrad_problem& p,
                                 const std::vector<cudnnBackendNumericalNote_t>& notes) {
  for (const cudnnBackendNumericalNote_t note : notes) {
    if (note == CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION ||
        note == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS || note == CUDNN_NUMERICAL_NOTE_FFT ||
        note == CUDNN_NUMERICAL_NOTE_WINOGRAD || note == CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_4x4 ||
        note == CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_6x6 ||
        note == CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_13x13)
      return false;
    if (note == CUDNN_NUMERICAL_NOTE_TENSOR_CORE && p.type == CUDNN_DATA_FLOAT && !p.allow_tf32)
      return false;
  }
  return true;
}

/// A finalized execution plan, with what it keeps alive, and the workspace it needs.
struct cudnn_wgrad_plan {
  std::unique_ptr<cudnn_wgrad_graph> graph;
  std::unique_ptr<cudnn_descriptor> device;
  std::unique_ptr<cudnn_descriptor> configuration;
  std::unique_ptr<cudnn_descriptor> plan;
  std::size_t workspace_bytes = 0;
};

/// The most workspace a plan may ask for: the dense input's bytes (the backend's own path keeps
/// its transient workspace within about that), and at least the 32 MiB PyTorch gives cuBLAS.
inline std::size_t cudnn_workspace_cap(const cudnn_wgrad_problem& p) {
  const std::size_t element = p.type == CUDNN_DATA_FLOAT ? 4 : 2;
  const auto input = static_cast<std::size_t>(p.x[0] * p.x[1] * p.x[2] * p.x[3]) * element;
  return std::max(input, std::size_t{32} << 20);
}

/// The execution plan of one engine configuration, or null where this configuration is not for
/// `p` (numerical notes), does not build, or asks for more than cudnn_workspace_cap.
inline std::unique_ptr<cudnn_wgrad_plan> plan_of_configuration(
    const cudnn_wgrad_problem& p, std::unique_ptr<cudnn_descriptor> configuration,
    const cudnn_descriptor& device) {
  constexpr const char* what = "conv2d_weight_grad (cuDNN plan)";
  cudnn_descriptor engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR, what);
  cudnnBackendDescriptor_t engine_raw = engine.get();
  std::int64_t engines = 0;
  if (cudnnBackendGetAttribute(configuration->get(), CUDNN_ATTR_ENGINECFG_ENGINE,
                               CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &engines,
                               &engine_raw) != CUDNN_STATUS_SUCCESS)
    return nullptr;
  std::vector<cudnnBackendNumericalNote_t> notes(CUDNN_NUMERICAL_NOTE_TYPE_COUNT);
  std::int64_t noted = 0;
  if (cudnnBackendGetAttribute(engine_raw, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
                               CUDNN_TYPE_NUMERICAL_NOTE, static_cast<std::int64_t>(notes.size()),
                               &noted, notes.data()) != CUDNN_STATUS_SUCCESS)
    return nullptr;
  notes.resize(static_cast<std::size_t>(
      std::clamp<std::int64_t>(noted, 0, CUDNN_NUMERICAL_NOTE_TYPE_COUNT)));
  if (!cudnn_engine_allowed(p, notes)) return nullptr;
  auto result = std::make_unique<cudnn_wgrad_plan>();
  result->plan = std::make_unique<cudnn_descriptor>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, what);
  result->plan->set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, *configuration)
      .set(CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP, device);
  if (result->plan->try_finalize() != CUDNN_STATUS_SUCCESS) return nullptr;
  std::int64_t workspace = 0, got = 0;
  check_cudnn(
      cudnnBackendGetAttribute(result->plan->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                               CUDNN_TYPE_INT64, 1, &got, &workspace),
      what);
  result->workspace_bytes = static_cast<std::size_t>(std::max<std::int64_t>(workspace, 0));
  if (result->workspace_bytes > cudnn_workspace_cap(p)) return nullptr;
  result->configuration = std::move(configuration);
  return result;
}

/// The properties of the device this thread's cuDNN handle is for, as plans are built for them.
inline std::unique_ptr<cudnn_descriptor> current_device_properties() {
  constexpr const char* what = "conv2d_weight_grad (cuDNN device)";
  const cudnnHandle_t handle = library_handles<cudnn_library>::current(what).handle;
  auto device = std::make_unique<cudnn_descriptor>(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, what);
  device->set(CUDNN_ATTR_DEVICEPROP_HANDLE, CUDNN_TYPE_HANDLE, &handle).finalize();
  return device;
}

/// The plan of `p` on the device `device` describes: the first engine configuration that
/// heuristics rank (mode A, then the fallback list) and plan_of_configuration accepts; null where
/// none does. Throws `dropit::error` where cuDNN fails otherwise (a graph it refuses). Needs no
/// device itself: the tests build plans for a described GPU on machines without one.
inline std::unique_ptr<cudnn_wgrad_plan> find_cudnn_wgrad_plan(
    const cudnn_wgrad_problem& p, std::unique_ptr<cudnn_descriptor> device) {
  constexpr const char* what = "conv2d_weight_grad (cuDNN plan)";
  auto graph = std::make_unique<cudnn_wgrad_graph>(p);
  for (const cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    cudnn_descriptor heuristics(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, what);
    heuristics.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph->graph)
        .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, &mode)
        .set(CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, *device);
    if (heuristics.try_finalize() != CUDNN_STATUS_SUCCESS) continue;
    std::int64_t count = 0;
    if (cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                                 nullptr) != CUDNN_STATUS_SUCCESS)
      continue;
    std::vector<std::unique_ptr<cudnn_descriptor>> configurations;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (std::int64_t i = 0; i < count; ++i) {
      configurations.push_back(
          std::make_unique<cudnn_descriptor>(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, what));
      raw.push_back(configurations.back()->get());
    }
    std::int64_t returned = 0;  // may be fewer than the count asked for first
    if (cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &returned,
                                 raw.data()) != CUDNN_STATUS_SUCCESS)
      continue;
    for (std::int64_t i = 0; i < std::min(count, returned); ++i) {
      std::unique_ptr<cudnn_wgrad_plan> plan;
      try {
        plan = plan_of_configuration(p, std::move(configurations[i]), *device);
      } catch (const dropit::error&) {
        continue;  // this configuration, not the search
      }
      if (!plan) continue;
      plan->graph = std::move(graph);
      plan->device = std::move(device);
      return plan;
    }
  }
  return nullptr;
}

/// The four plans one conv2d weight gradient may need, [dZ and dW 16-byte aligned][accumulating]:
/// the workspace query cannot know the call's pointers or mode, so it sizes for all of them.
struct cudnn_wgrad_plans {
  std::unique_ptr<cudnn_wgrad_plan> by[2][2];
  std::size_t workspace_bytes = 0;  // the most any of them needs

  const cudnn_wgrad_plan& for_call(const void* dy, const void* dw, bool accumulate) const {
    const bool aligned = reinterpret_cast<std::uintptr_t>(dy) % 16 == 0 &&
                         reinterpret_cast<std::uintptr_t>(dw) % 16 == 0;
    return *by[aligned][accumulate];
  }
};

/// This thread's plans of a `T` weight gradient of geometry `g` on the current device, built on
/// first use and kept (never destroyed: cuDNN's teardown at exit races the runtime's, as PyTorch
/// found). Null where this cuDNN is older than cudnn_minimum_version, or no engine runs one of
/// the four problems (kept: asked once), or cuDNN failed (not kept: asked again next time); the
/// backend's own path then computes the gradient. The CUDA tests check that every geometry they
/// run gets its plans.
template <class T>
const cudnn_wgrad_plans* cudnn_wgrad_plans_for(const conv2d_geometry& g, bool allow_tf32) {
  using plans_map =
      std::map<std::pair<int, cudnn_wgrad_problem>, std::unique_ptr<cudnn_wgrad_plans>>;
  thread_local auto* known = new plans_map;
  if (cudnnGetVersion() < cudnn_minimum_version) return nullptr;
  int device = 0;
  check(cudaGetDevice(&device), "conv2d_weight_grad (cuDNN plan)");
  auto key = std::make_pair(device, make_cudnn_wgrad_problem<T>(g, true, false, allow_tf32));
  if (const auto found = known->find(key); found != known->end()) return found->second.get();
  auto plans = std::make_unique<cudnn_wgrad_plans>();
  try {
    for (const bool aligned : {false, true})
      for (const bool accumulate : {false, true}) {
        auto& plan = plans->by[aligned][accumulate];
        plan =
            find_cudnn_wgrad_plan(make_cudnn_wgrad_problem<T>(g, aligned, accumulate, allow_tf32),
                                  current_device_properties());
        if (!plan) {
          plans.reset();
          return known->emplace(std::move(key), nullptr).first->second.get();
        }
        plans->workspace_bytes = std::max(plans->workspace_bytes, plan->workspace_bytes);
      }
  } catch (const dropit::error&) {
    return nullptr;
  }
  return known->emplace(std::move(key), std::move(plans)).first->second.get();
}

/// Enqueues `plan` on `stream`: dW (=, or += where the plan accumulates) the weight gradient of X
/// and dY, all of the plan's type.
inline void run_cudnn_wgrad(cudaStream_t stream, const cudnn_wgrad_plan& plan, const void* x,
                            const void* dy, void* dw, void* workspace) {
  constexpr const char* what = "conv2d_weight_grad (cuDNN)";
  auto& bound = library_handles<cudnn_library>::current(what);
  if (!bound.stream_bound || bound.stream != stream) {
    check_cudnn(cudnnSetStream(bound.handle, stream), what);
    bound.stream = stream;
    bound.stream_bound = true;
  }
  const cudnnHandle_t handle = bound.handle;
  const std::array<std::int64_t, 3> uids{wgrad_x, wgrad_dy, wgrad_dw};
  std::array<void*, 3> pointers{const_cast<void*>(x), const_cast<void*>(dy), dw};
  cudnn_descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, what);
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, uids)
      .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, pointers.data(), 3)
      .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, &workspace)
      .finalize();
  check_cudnn(cudnnBackendExecute(handle, plan.plan->get(), pack.get()), what);
}

}  // namespace dropit::detail::cuda
