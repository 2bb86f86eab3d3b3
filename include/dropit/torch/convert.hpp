#pragma once
/// @file
/// `convert`: replaces the Linear and Conv2d layers (and optionally ReLU) of a module tree by
/// dropit layers that share the existing parameters, and LayerNorm, BatchNorm2d, GELU and SiLU by
/// dropit's producers, whose output a dropit Linear or Conv2d reading it (directly or through a
/// dropit ReLU) recomputes instead of caching.
///
/// LibTorch modules call their children through C++ members, which cannot be swapped from outside;
/// `torch::nn::Sequential` calls its children through type-erased slots, which can. So `convert`
/// replaces layers held by a Sequential, and lists any other candidate as not converted, with the
/// reason, in its report.

#include <memory>
#include <ostream>
#include <regex>
#include <string>
#include <vector>

#include "attention.hpp"
#include "modules.hpp"

namespace dropit::torch {

struct ConvertOptions {
  /// What the converted layers keep.
  TORCH_ARG(DropitOptions, dropit);
  /// Also replace ReLU by the 1-bit-mask ReLU (needed for conv caches to free memory, and for a
  /// Conv2d after BatchNorm2d -> ReLU to recompute its input).
  TORCH_ARG(bool, relu) = false;
  /// Cache nothing of the first Linear or Conv2d's input (in registration order): it is the data
  /// batch, which stays alive anyway. The layer keeps it as torch's does, as a dropit layer with
  /// DropitOptions::keep_input, whose output a producer after it can recompute (recompute_layers);
  /// where convert cannot swap it (held by a C++ member, a padding dropit's Conv2d lacks, or
  /// excluded), it stays torch's.
  TORCH_ARG(bool, skip_first) = true;
  /// Leave layers whose qualified name ("features.3") matches this regular expression.
  TORCH_ARG(std::string, exclude) = "";
};

struct ConvertReport {
  std::vector<std::string> converted;
  /// Producers swapped for dropit's (DropitOptions::recompute): a dropit Linear or Conv2d reading
  /// their output, untouched, recomputes it in backward and caches nothing.
  std::vector<std::string> producers;
  /// SoftmaxAttention modules made to recompute their probabilities in backward
  /// (DropitOptions::recompute).
  std::vector<std::string> attention;
  /// SoftmaxAttention modules built with only_through_layers (listed here, not above): they
  /// recompute the probabilities only with q, k and v, through the projection (recompute_layers),
  /// and keep them otherwise.
  std::vector<std::string> attention_through_layers;
  /// Qualified name and the reason it caches nothing: left as it was, or the first layer, which
  /// keeps its input (skip_first).
  std::vector<std::pair<std::string, std::string>> skipped;

  friend std::ostream& operator<<(std::ostream& out, const ConvertReport& report) {
    out << "converted " << report.converted.size() << " layer(s)";
    for (const auto& name : report.converted) out << "\n  + " << name;
    for (const auto& name : report.producers)
      out << "\n  ~ " << name << ": producer, its output recomputed by the dropit layer reading it";
    for (const auto& name : report.attention)
      out << "\n  ~ " << name << ": attention, its probabilities recomputed in backward";
    for (const auto& name : report.attention_through_layers)
      out << "\n  ~ " << name
          << ": attention, its probabilities kept unless q, k and v are recomputed through "
             "their projection (recompute_layers)";
    for (const auto& [name, reason] : report.skipped) out << "\n  - " << name << ": " << reason;
    return out;
  }
};

namespace detail {

/// One slot of a Sequential that convert filled: where it is, and the module before and after.
struct replacement {
  ::torch::nn::SequentialImpl* container = nullptr;
  std::size_t index = 0;
  std::string name;       // the child's key in its container
  std::string qualified;  // from the root
  ::torch::nn::AnyModule original, replaced;
};

/// Puts `module` into slot `index` (key `name`) of `container`: the slot the Sequential calls and
/// the child its parameters, state dicts and `to()` reach.
inline void install(::torch::nn::SequentialImpl& container, std::size_t index,
                    const std::string& name, const ::torch::nn::AnyModule& module) {
  *(container.begin() + static_cast<std::ptrdiff_t>(index)) = module;
  container.replace_module(name, module.ptr());
}

/// Turns DropitOptions::recompute_layers on or off in a module convert made (a dropit layer,
/// producer or attention; nothing else has it).
inline void set_recompute_layers(::torch::nn::Module& module, bool on) {
  if (auto* linear = dynamic_cast<LinearImpl*>(&module)) linear->dropit.recompute_layers(on);
  if (auto* conv = dynamic_cast<Conv2dImpl*>(&module)) conv->dropit.recompute_layers(on);
  if (auto* norm = dynamic_cast<LayerNormImpl*>(&module)) norm->recompute_layers = on;
  if (auto* norm = dynamic_cast<BatchNorm2dImpl*>(&module)) norm->recompute_layers = on;
  if (auto* gelu = dynamic_cast<GELUImpl*>(&module)) gelu->recompute_layers = on;
  if (auto* silu = dynamic_cast<SiLUImpl*>(&module)) silu->recompute_layers = on;
  if (auto* attention = dynamic_cast<SoftmaxAttentionImpl*>(&module))
    attention->recompute_layers = on;
}

class converter {
 public:
  explicit converter(const ConvertOptions& options)
      : options_(options), exclude_(options.exclude()) {
    options.dropit().validate();
  }

  void visit(::torch::nn::Module& parent, const std::string& prefix) {
    auto* sequential = dynamic_cast<::torch::nn::SequentialImpl*>(&parent);
    std::size_t index = 0;
    for (const auto& item : parent.named_children()) {
      const std::string& name = item.key();
      const std::shared_ptr<::torch::nn::Module>& child = item.value();
      const std::string qualified = prefix.empty() ? name : prefix + "." + name;
      std::shared_ptr<::torch::nn::Module> replacement = replacement_for(*child, qualified);
      if (replacement) {
        if (sequential) {
          replacements_.push_back({sequential, index, name, qualified,
                                   *(sequential->begin() + static_cast<std::ptrdiff_t>(index)),
                                   any_module(replacement)});
          install(*sequential, index, name, replacements_.back().replaced);
          if (keeps_input(*replacement))
            report_.skipped.emplace_back(qualified, first_layer);
          else
            report_list(*replacement).push_back(qualified);
        } else if (keeps_input(*replacement)) {
          report_.skipped.emplace_back(
              qualified, "first layer (skip_first), held by a C++ member of " + parent.name() +
                             ", which convert cannot rebind: torch's keeps its input, and no "
                             "producer after it can recompute through it");
        } else if (dynamic_cast<SoftmaxAttentionImpl*>(replacement.get())) {
          report_.skipped.emplace_back(
              qualified, "a SoftmaxAttention held by a C++ member of " + parent.name() +
                             ", which convert cannot rebind, so it keeps its probabilities; hold "
                             "it in a torch::nn::Sequential (or, unless only_through_layers, "
                             "build it with recompute(true))");
        } else if (is_producer(*replacement)) {
          report_.skipped.emplace_back(
              qualified, "a producer held by a C++ member of " + parent.name() +
                             ", which convert cannot rebind, so the Linear reading its output "
                             "caches it; hold it in a torch::nn::Sequential or build it as "
                             "dropit's (dropit::torch::LayerNorm, BatchNorm2d, GELU, SiLU) to "
                             "recompute instead");
        } else {
          report_.skipped.emplace_back(
              qualified, "held by a C++ member of " + parent.name() +
                             ", which convert cannot rebind; hold it in a torch::nn::Sequential "
                             "or build it as a dropit layer");
        }
      } else {
        visit(*child, qualified);
      }
      ++index;
    }
  }

  ConvertReport report() const { return report_; }
  /// Every slot replaced, in the order of the visit.
  const std::vector<replacement>& replacements() const { return replacements_; }

 private:
  /// The dropit layer that should stand in for `child`, or null.
  std::shared_ptr<::torch::nn::Module> replacement_for(::torch::nn::Module& child,
                                                       const std::string& name) {
    auto* linear = dynamic_cast<::torch::nn::LinearImpl*>(&child);
    auto* conv = dynamic_cast<::torch::nn::Conv2dImpl*>(&child);
    auto* relu = dynamic_cast<::torch::nn::ReLUImpl*>(&child);
    auto* norm = dynamic_cast<::torch::nn::LayerNormImpl*>(&child);
    auto* batch_norm = dynamic_cast<::torch::nn::BatchNorm2dImpl*>(&child);
    auto* gelu = dynamic_cast<::torch::nn::GELUImpl*>(&child);
    auto* silu = dynamic_cast<::torch::nn::SiLUImpl*>(&child);
    auto* attention = dynamic_cast<SoftmaxAttentionImpl*>(&child);
    const bool producer = options_.dropit().recompute() && (norm || batch_norm || gelu || silu);
    const bool keeps_probabilities =
        options_.dropit().recompute() && attention && !attention->options.recompute();
    if ((linear || conv || relu || producer || keeps_probabilities) &&
        !options_.exclude().empty() && std::regex_search(name, exclude_)) {
      if (linear || conv) seen_first_ = true;
      report_.skipped.emplace_back(name, "matches exclude pattern");
      return nullptr;
    }
    if (linear || conv) {
      // The first layer keeps its input, the batch, as torch's does (skip_first); no selection, so
      // it draws no seed.
      const bool first = options_.skip_first() && !seen_first_;
      seen_first_ = true;
      DropitOptions layer_options = options_.dropit();
      if (first)
        layer_options.keep_input(true);
      else
        layer_options.seed(options_.dropit().seed() + layers_++ * 0x9e3779b97f4a7c15ull);
      if (linear) return std::make_shared<LinearImpl>(*linear, layer_options);
      try {
        return std::make_shared<Conv2dImpl>(*conv, layer_options);
      } catch (const dropit::error& e) {  // a padding dropit's Conv2d lacks: torch's stays
        report_.skipped.emplace_back(
            name, std::string(first ? "first layer (skip_first); " : "") + e.what());
        return nullptr;
      }
    }
    if (relu && options_.relu()) {
      auto replacement = std::make_shared<ReLUImpl>();
      replacement->train(relu->is_training());
      return replacement;
    }
    if (keeps_probabilities) {
      auto replacement = std::make_shared<SoftmaxAttentionImpl>(attention->options);
      replacement->options.recompute(true);
      replacement->train(attention->is_training());
      return with_layers_recomputed(std::move(replacement));
    }
    if (producer && norm) return with_layers_recomputed(std::make_shared<LayerNormImpl>(*norm));
    if (producer && batch_norm)
      return with_layers_recomputed(std::make_shared<BatchNorm2dImpl>(*batch_norm));
    if (producer && gelu) return with_layers_recomputed(std::make_shared<GELUImpl>(*gelu));
    if (producer && silu) {
      auto replacement = std::make_shared<SiLUImpl>();
      replacement->train(silu->is_training());
      return with_layers_recomputed(std::move(replacement));
    }
    return nullptr;
  }

  std::shared_ptr<::torch::nn::Module> with_layers_recomputed(
      std::shared_ptr<::torch::nn::Module> producer) const {
    set_recompute_layers(*producer, options_.dropit().recompute_layers());
    return producer;
  }

  static constexpr const char* first_layer =
      "first layer (skip_first): its input is the model's, kept as it is";

  static bool keeps_input(::torch::nn::Module& m) {
    if (auto* linear = dynamic_cast<LinearImpl*>(&m)) return linear->dropit.keep_input();
    if (auto* conv = dynamic_cast<Conv2dImpl*>(&m)) return conv->dropit.keep_input();
    return false;
  }

  std::vector<std::string>& report_list(::torch::nn::Module& m) {
    if (auto* attention = dynamic_cast<SoftmaxAttentionImpl*>(&m))
      return attention->options.only_through_layers() ? report_.attention_through_layers
                                                      : report_.attention;
    return is_producer(m) ? report_.producers : report_.converted;
  }

  static bool is_producer(::torch::nn::Module& m) {
    return dynamic_cast<LayerNormImpl*>(&m) || dynamic_cast<BatchNorm2dImpl*>(&m) ||
           dynamic_cast<GELUImpl*>(&m) || dynamic_cast<SiLUImpl*>(&m);
  }

  static ::torch::nn::AnyModule any_module(const std::shared_ptr<::torch::nn::Module>& m) {
    if (auto linear = std::dynamic_pointer_cast<LinearImpl>(m))
      return ::torch::nn::AnyModule(linear);
    if (auto conv = std::dynamic_pointer_cast<Conv2dImpl>(m)) return ::torch::nn::AnyModule(conv);
    if (auto norm = std::dynamic_pointer_cast<LayerNormImpl>(m))
      return ::torch::nn::AnyModule(norm);
    if (auto norm = std::dynamic_pointer_cast<BatchNorm2dImpl>(m))
      return ::torch::nn::AnyModule(norm);
    if (auto gelu = std::dynamic_pointer_cast<GELUImpl>(m)) return ::torch::nn::AnyModule(gelu);
    if (auto silu = std::dynamic_pointer_cast<SiLUImpl>(m)) return ::torch::nn::AnyModule(silu);
    if (auto attention = std::dynamic_pointer_cast<SoftmaxAttentionImpl>(m))
      return ::torch::nn::AnyModule(attention);
    return ::torch::nn::AnyModule(std::dynamic_pointer_cast<ReLUImpl>(m));
  }

  ConvertOptions options_;
  std::regex exclude_;
  ConvertReport report_;
  std::vector<replacement> replacements_;
  bool seen_first_ = false;
  std::uint64_t layers_ = 0;
};

}  // namespace detail

/// Replaces the Linear and Conv2d layers of `root` (and ReLU when asked) by dropit layers that
/// share their parameters, and its LayerNorm, BatchNorm2d, GELU and SiLU by dropit's producers
/// (unless `options.dropit().recompute()` is off). Returns what was converted and what was left,
/// with reasons.
inline ConvertReport convert(::torch::nn::Module& root, const ConvertOptions& options = {}) {
  detail::converter c(options);
  c.visit(root, "");
  return c.report();
}

template <class ModuleHolder>
ConvertReport convert(ModuleHolder& root, const ConvertOptions& options = {}) requires requires {
  root.ptr();
}
{ return convert(*root.ptr(), options); }

}  // namespace dropit::torch
