#pragma once
// The two Fashion-MNIST models, shared by the training example and benchmarks/torch: a small
// ResNet-style CNN and a small ViT. Every Linear, Conv2d and ReLU that dropit should replace is
// held by a torch::nn::Sequential, the one container whose children `dropit::torch::convert` can
// swap; the modules' own forward code only wires those Sequentials together.

#include <torch/torch.h>
#include <dropit/torch.hpp>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

namespace fmnist {

/// A model that maps [N, 1, 28, 28] images to [N, 10] logits.
class Classifier : public torch::nn::Module {
 public:
  virtual torch::Tensor forward(torch::Tensor images) = 0;
};

struct ModelConfig {
  std::string kind = "cnn";  // "cnn" or "vit"
  /// CNN: channels of the first stage (the stages have width, 2 width, 4 width).
  std::int64_t width = 16;
  /// CNN: BatchNorm after every convolution. BatchNorm saves its input for backward, so with it a
  /// convolution's compact cache frees less of a block's activations.
  bool batchnorm = true;
  /// ViT: embedding size, heads, transformer blocks, MLP expansion.
  std::int64_t dim = 96;
  std::int64_t heads = 4;
  std::int64_t depth = 4;
  std::int64_t mlp_ratio = 2;
};

// --- ResNet-style CNN --------------------------------------------------------------------------

inline torch::nn::Conv2d conv3x3(std::int64_t in, std::int64_t out, std::int64_t stride,
                                 bool bias) {
  return torch::nn::Conv2d(
      torch::nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(bias));
}

/// out = relu(body(x) + shortcut(x)), body = conv-(bn)-relu-conv-(bn).
class ResidualBlockImpl : public torch::nn::Module {
 public:
  ResidualBlockImpl(std::int64_t in, std::int64_t out, std::int64_t stride, bool batchnorm,
                    bool bias) {
    torch::nn::Sequential body_layers;
    body_layers->push_back(conv3x3(in, out, stride, bias));
    if (batchnorm) body_layers->push_back(torch::nn::BatchNorm2d(out));
    body_layers->push_back(torch::nn::ReLU());
    body_layers->push_back(conv3x3(out, out, 1, bias));
    if (batchnorm) body_layers->push_back(torch::nn::BatchNorm2d(out));
    body = register_module("body", body_layers);
    if (stride != 1 || in != out) {
      torch::nn::Sequential projection;
      projection->push_back(
          torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 1).stride(stride).bias(bias)));
      if (batchnorm) projection->push_back(torch::nn::BatchNorm2d(out));
      shortcut = register_module("shortcut", projection);
    }
    post = register_module("post", torch::nn::Sequential(torch::nn::ReLU()));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor y = body->forward(x);
    y = y + (shortcut ? shortcut->forward(x) : x);
    return post->forward(y);
  }

  torch::nn::Sequential body{nullptr}, shortcut{nullptr}, post{nullptr};
};
TORCH_MODULE(ResidualBlock);

/// stem conv (28x28) -> 3 residual blocks (28x28, 14x14, 7x7) -> global average pool -> Linear.
class ResNetImpl : public Classifier {
 public:
  explicit ResNetImpl(const ModelConfig& c) {
    const std::int64_t w = c.width;
    const bool bias = !c.batchnorm;  // BatchNorm makes a convolution bias redundant
    torch::nn::Sequential stem_layers;
    stem_layers->push_back(conv3x3(1, w, 1, bias));
    if (c.batchnorm) stem_layers->push_back(torch::nn::BatchNorm2d(w));
    stem_layers->push_back(torch::nn::ReLU());
    // Registered first: convert's skip_first keeps this convolution's input (the batch) as it is;
    // the BatchNorm after it can recompute its own input through it (recompute_layers).
    stem = register_module("stem", stem_layers);
    blocks = register_module(
        "blocks", torch::nn::Sequential(ResidualBlock(w, w, 1, c.batchnorm, bias),
                                        ResidualBlock(w, 2 * w, 2, c.batchnorm, bias),
                                        ResidualBlock(2 * w, 4 * w, 2, c.batchnorm, bias)));
    head = register_module("head", torch::nn::Sequential(torch::nn::Linear(4 * w, 10)));
    for (auto& module : modules(/*include_self=*/false)) {
      if (auto* conv = module->as<torch::nn::Conv2d>())
        torch::nn::init::kaiming_normal_(conv->weight, 0.0, torch::kFanOut, torch::kReLU);
    }
  }

  torch::Tensor forward(torch::Tensor images) override {
    torch::Tensor x = blocks->forward(stem->forward(images));
    x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
    return head->forward(x);
  }

  torch::nn::Sequential stem{nullptr}, blocks{nullptr}, head{nullptr};
};
TORCH_MODULE(ResNet);

// --- ViT ---------------------------------------------------------------------------------------

/// Multi-head self-attention from two Linear layers (fused q, k, v and the output projection)
/// around dropit's SoftmaxAttention, softmax(q kᵀ / √d) v. Made with recompute(false) it is
/// torch's operations, which keep q, k, v and the probabilities for backward. Converted, it keeps
/// none of them where it recomputes through layers (the planner's recompute tool): backward runs
/// the projection after LayerNorm again, and the probabilities. Elsewhere it keeps the
/// probabilities (only_through_layers): 17 tokens make them few bytes, and computing them again
/// is a batched product of many tiny matrices.
class AttentionImpl : public torch::nn::Module {
 public:
  AttentionImpl(std::int64_t dim, std::int64_t heads) : heads_(heads) {
    if (dim % heads != 0)
      throw std::invalid_argument("ViT: dim " + std::to_string(dim) + " is not divisible by " +
                                  std::to_string(heads) + " heads");
    qkv = register_module("qkv", torch::nn::Sequential(torch::nn::Linear(dim, 3 * dim)));
    softmax = register_module(
        "softmax",
        torch::nn::Sequential(dropit::torch::SoftmaxAttention(
            dropit::torch::SoftmaxAttentionOptions().recompute(false).only_through_layers(true))));
    proj = register_module("proj", torch::nn::Sequential(torch::nn::Linear(dim, dim)));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    const std::int64_t batch = x.size(0), tokens = x.size(1), dim = x.size(2);
    const std::int64_t head_dim = dim / heads_;
    // [B, T, 3D] -> [3, B, heads, T, head_dim]: q, k and v are views of the projection's output.
    const torch::Tensor parts =
        qkv->forward(x).reshape({batch, tokens, 3, heads_, head_dim}).permute({2, 0, 3, 1, 4});
    // Through the Sequential's slot, which convert may have swapped.
    const torch::Tensor mixed =
        softmax->begin()->forward<torch::Tensor>(parts[0], parts[1], parts[2]);  // [B, H, T, d]
    // reshape of the transposed tensor copies it into the contiguous layout dropit caches.
    return proj->forward(mixed.transpose(1, 2).reshape({batch, tokens, dim}));
  }

  torch::nn::Sequential qkv{nullptr}, softmax{nullptr}, proj{nullptr};

 private:
  std::int64_t heads_;
};
TORCH_MODULE(Attention);

/// Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x)). The norms are held in
/// Sequentials, as the layers are, so that convert can swap them for dropit's: the Linear layers
/// reading their outputs (q, k, v and the MLP's first) then recompute those in backward.
class TransformerBlockImpl : public torch::nn::Module {
 public:
  TransformerBlockImpl(std::int64_t dim, std::int64_t heads, std::int64_t mlp_ratio) {
    norm1 = register_module(
        "norm1", torch::nn::Sequential(torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim}))));
    attn = register_module("attn", Attention(dim, heads));
    norm2 = register_module(
        "norm2", torch::nn::Sequential(torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim}))));
    mlp = register_module(
        "mlp", torch::nn::Sequential(torch::nn::Linear(dim, mlp_ratio * dim), torch::nn::GELU(),
                                     torch::nn::Linear(mlp_ratio * dim, dim)));
  }

  torch::Tensor forward(torch::Tensor x) {
    x = x + attn->forward(norm1->forward(x));
    return x + mlp->forward(norm2->forward(x));
  }

  torch::nn::Sequential norm1{nullptr}, norm2{nullptr};
  Attention attn{nullptr};
  torch::nn::Sequential mlp{nullptr};
};
TORCH_MODULE(TransformerBlock);

/// 7x7 patches (16 tokens) + class token, learned position embedding, pre-norm blocks, Linear head
/// on the class token.
class ViTImpl : public Classifier {
 public:
  explicit ViTImpl(const ModelConfig& c) {
    // Registered first: convert's skip_first keeps the patch embedding's input (the batch) as it
    // is.
    patch = register_module(
        "patch", torch::nn::Sequential(torch::nn::Conv2d(
                     torch::nn::Conv2dOptions(1, c.dim, patch_size).stride(patch_size))));
    cls = register_parameter("cls", torch::randn({1, 1, c.dim}) * 0.02);
    pos = register_parameter("pos", torch::randn({1, tokens + 1, c.dim}) * 0.02);
    torch::nn::Sequential stack;
    for (std::int64_t i = 0; i < c.depth; ++i)
      stack->push_back(TransformerBlock(c.dim, c.heads, c.mlp_ratio));
    blocks = register_module("blocks", stack);
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.dim})));
    head = register_module("head", torch::nn::Sequential(torch::nn::Linear(c.dim, 10)));
  }

  torch::Tensor forward(torch::Tensor images) override {
    const std::int64_t batch = images.size(0);
    torch::Tensor x = patch->forward(images).flatten(2).transpose(1, 2);  // [B, 16, D]
    x = torch::cat({cls.expand({batch, 1, cls.size(2)}), x}, 1) + pos;
    x = norm->forward(blocks->forward(x));
    return head->forward(x.select(1, 0).contiguous());
  }

  static constexpr std::int64_t patch_size = 7;
  static constexpr std::int64_t tokens = (28 / patch_size) * (28 / patch_size);

  torch::nn::Sequential patch{nullptr}, blocks{nullptr}, head{nullptr};
  torch::nn::LayerNorm norm{nullptr};
  torch::Tensor cls, pos;
};
TORCH_MODULE(ViT);

// --- helpers -------------------------------------------------------------------------------------

/// A freshly initialised model (torch's global generator: seed it first for reproducible weights).
inline std::shared_ptr<Classifier> make_model(const ModelConfig& c) {
  if (c.kind == "cnn") return ResNet(c).ptr();
  if (c.kind == "vit") return ViT(c).ptr();
  throw std::invalid_argument("unknown model '" + c.kind + "'; expected cnn or vit");
}

/// Copies parameters and buffers of `from` into `to` (same architecture), so every variant of a run
/// starts from the same weights.
inline void copy_state(const torch::nn::Module& from, torch::nn::Module& to) {
  torch::NoGradGuard no_grad;
  const auto source_parameters = from.named_parameters();
  for (auto& item : to.named_parameters()) item.value().copy_(source_parameters[item.key()]);
  const auto source_buffers = from.named_buffers();
  for (auto& item : to.named_buffers()) item.value().copy_(source_buffers[item.key()]);
}

inline std::int64_t parameter_count(torch::nn::Module& model) {
  std::int64_t count = 0;
  for (const auto& p : model.parameters()) count += p.numel();
  return count;
}

}  // namespace fmnist
