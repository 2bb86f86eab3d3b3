#pragma once
/// @file
/// The autograd node of dropit's layers (linear, conv2d and ReLU; linear and conv2d recomputing
/// their input), built as torch's generated nodes are built. torch::autograd::Function serves any
/// C++ function, at a price a small layer feels: its node keeps C++ state as IValues in a
/// string-keyed map, records metadata of every input and output, and demangles the function's type
/// name on every backward call. A layer node keeps its state as members and its tensors as
/// SavedVariables (saved-tensor hooks see each one; a second backward after the graph was freed
/// gets torch's own error), and has a literal name.

#include <torch/autograd.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/version.h>
#if TORCH_VERSION_MAJOR >= 2
#include <ATen/FuncTorchTLS.h>
#endif

#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "../config.hpp"

namespace dropit::torch::detail {

/// The tensors a node keeps for backward, in the order saved.
class saved_tensors {
 public:
  void save(const at::Tensor& tensor) { saved_.emplace_back(tensor, /*is_output=*/false); }
  ::torch::autograd::variable_list unpack() const {
    ::torch::autograd::variable_list tensors;
    tensors.reserve(saved_.size());
    for (const auto& saved : saved_) tensors.push_back(saved.unpack());
    return tensors;
  }
  void release() {
    for (auto& saved : saved_) saved.reset_data();
  }

 private:
  std::vector<::torch::autograd::SavedVariable> saved_;
};

/// The node of a layer whose backward `State` computes. `State` has a `name`, a `saved_tensors
/// saved` member and `variable_list backward(const Node&, const at::Tensor& dz, const
/// variable_list& saved)`, which asks the node which inputs need a gradient
/// (task_should_compute_output) and returns one gradient per input.
template <class State>
struct layer_node final : ::torch::autograd::Node {
  State state;

  std::string name() const override { return State::name; }

  ::torch::autograd::variable_list apply(::torch::autograd::variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(mutex_);
    // No gradient reached the output: none flows to the inputs (as in torch's generated nodes).
    if (!grads[0].defined()) return ::torch::autograd::variable_list(num_outputs());
    return state.backward(*this, grads[0], state.saved.unpack());
  }

  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    state.saved.release();
  }
};

/// A node of type `NodeType`, owned as autograd's edges own nodes in this LibTorch
/// (std::shared_ptr, or c10::intrusive_ptr in later versions).
template <class NodeType, class Handle = decltype(::torch::autograd::Edge::function)>
auto make_node() {
  if constexpr (std::is_same_v<Handle, std::shared_ptr<::torch::autograd::Node>>)
    return std::make_shared<NodeType>();
  else
    return c10::make_intrusive<NodeType>();
}

/// Runs torch.autograd.graph's node creation hooks on `node`, in the LibTorch versions that have
/// them (found by argument-dependent lookup, so older versions compile without).
template <class Handle>
void fire_creation_hooks(const Handle& node) {
  if constexpr (requires { fire_node_creation_hooks(node); }) fire_node_creation_hooks(node);
}

/// The output `compute(state)` returns, computed below autograd, with a `layer_node<State>` as its
/// gradient function whose inputs are `inputs` (undefined ones have no edge) where autograd
/// records. `compute` fills the state: what backward needs, tensors in `state.saved`.
template <class State, class Compute>
at::Tensor record_layer(const ::torch::autograd::variable_list& inputs, Compute&& compute) {
#if TORCH_VERSION_MAJOR >= 2
  // functorch's transforms (torch.func) handle autograd functions in Python; refuse, as torch's
  // own C++ functions do, rather than compute silently wrong gradients.
  if (const auto& functorch = at::functorch::functorchTLSAccessor())
    functorch->checkSupportsCppAutogradFunction();
#endif
  for (const at::Tensor& input : inputs)
    dropit::detail::expect(!input.defined() || !input._fw_grad(/*level=*/0).defined(),
                           State::name, ": dropit's layers have no forward-mode gradient");
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  if (!(at::GradMode::is_enabled() && ::torch::autograd::any_variable_requires_grad(inputs))) {
    State unrecorded;
    return compute(unrecorded);
  }
  auto node = make_node<layer_node<State>>();
  at::Tensor output = compute(node->state);
  node->set_next_edges(::torch::autograd::collect_next_edges(inputs));
  ::torch::autograd::set_history(output, node);
  fire_creation_hooks(decltype(::torch::autograd::Edge::function)(node));
  return output;
}

}  // namespace dropit::torch::detail
