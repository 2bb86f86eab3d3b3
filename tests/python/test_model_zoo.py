"""dropit.convert on the models users train, built from their configs (random weights, small
sizes, CPU): torchvision's ResNet-50, ViT-B/16, ConvNeXt-T and MobileNetV3, timm's ViT, Hugging
Face's GPT-2, Llama and BERT. For every model: every weight-bearing layer is converted but the one
fed by the model's own input; eval outputs are bitwise torch's; gamma-0 gradients equal dense; at
gamma 0.9 the bytes held after forward drop by what the encodings predict (savings.py)."""

import copy

import pytest
import torch
from torch import nn

import dropit
from savings import held_after_forward_and_step_peak, predicted_saving

torchvision = pytest.importorskip("torchvision", reason="torchvision is not installed")


def torchvision_model(name, **config):
    def make():
        return getattr(torchvision.models, name)(num_classes=10, **config), {
            "x": torch.randn(2, 3, 64, 64)}
    return make


def timm_vit():
    timm = pytest.importorskip("timm", reason="timm is not installed")
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=64,
                              num_classes=10)
    return model, {"x": torch.randn(2, 3, 64, 64)}


def hugging_face(config_name, model_name, **config):
    def make():
        transformers = pytest.importorskip("transformers", reason="transformers is not installed")
        settings = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=128)
        settings.update(config)
        model = getattr(transformers, model_name)(getattr(transformers, config_name)(**settings))
        return model, {"input_ids": torch.randint(0, 128, (2, 16))}
    return make


# name -> (make, the layers left: those fed by the model's input)
MODELS = {
    "resnet50": (torchvision_model("resnet50"), {"conv1"}),
    "vit_b_16": (torchvision_model("vit_b_16", image_size=64), {"conv_proj"}),
    "convnext_tiny": (torchvision_model("convnext_tiny", stochastic_depth_prob=0.0),
                      {"features.0.0"}),
    "mobilenet_v3_small": (torchvision_model("mobilenet_v3_small", dropout=0.0),
                           {"features.0.0"}),
    "timm_vit": (timm_vit, {"patch_embed.proj"}),
    "gpt2": (hugging_face("GPT2Config", "GPT2LMHeadModel", n_embd=64, n_layer=2, n_head=4,
                          n_positions=32, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
             set()),
    "llama": (hugging_face("LlamaConfig", "LlamaForCausalLM", num_key_value_heads=2), set()),
    "bert": (hugging_face("BertConfig", "BertForMaskedLM", hidden_dropout_prob=0.0,
                          attention_probs_dropout_prob=0.0), set()),
}


def weight_bearing(model):
    """Names of the layers with a weight that a linear or convolution applies to an input:
    torch's Linear and ConvNd, nn.MultiheadAttention (not its out_proj, whose weight it applies
    itself), and Hugging Face's Conv1D."""
    inside_attention = {f"{name}.out_proj" for name, m in model.named_modules()
                        if isinstance(m, nn.MultiheadAttention)}
    kinds = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.MultiheadAttention)
    return {name for name, m in model.named_modules()
            if (isinstance(m, kinds) or type(m).__name__ == "Conv1D")
            and name not in inside_attention}


def output_of(out):
    return getattr(out, "logits", out)


def gradients(model, inputs):
    model.zero_grad(set_to_none=True)
    output_of(model(**inputs)).float().square().mean().backward()
    return {name: p.grad for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", MODELS)
def test_model_zoo(name):
    make, left = MODELS[name]
    torch.manual_seed(0)
    dense, inputs = make()
    dense.train()
    model = copy.deepcopy(dense)
    report = dropit.convert(model, gamma=0.0, example_input=inputs)

    # What converted and what was left.
    converted = {layer.name for layer in report.converted if layer.kind != "ReLU"}
    skipped = {layer.name: layer.reason for layer in report.skipped}
    assert converted | set(skipped) >= weight_bearing(dense)
    assert set(skipped) == left, str(report)
    assert all("model's own input" in reason for reason in skipped.values())

    # Eval outputs: torch's own.
    model.eval()
    dense.eval()
    with torch.no_grad():
        assert torch.equal(output_of(model(**inputs)), output_of(dense(**inputs)))
    model.train()
    dense.train()

    # Gamma 0: the gradients of dense training.
    actual, expected = gradients(model, inputs), gradients(dense, inputs)
    assert actual.keys() == expected.keys()
    for parameter, grad in expected.items():
        torch.testing.assert_close(actual[parameter], grad, rtol=1e-3, atol=1e-5,
                                   msg=parameter)

    # Gamma 0.9: the bytes held after forward drop by what the encodings predict.
    model = copy.deepcopy(dense)
    dropit.convert(model, gamma=0.9, example_input=inputs)
    for _ in range(2):  # the first step also allocates the parameters' gradients
        dense_held, _ = held_after_forward_and_step_peak(dense, **inputs)
        dropit_held, _ = held_after_forward_and_step_peak(model, **inputs)
    expected_saving = predicted_saving(model, **inputs)
    saving = dense_held - dropit_held
    print(f"{name}: held after forward {dropit_held / dense_held:.3f}x dense; saving {saving} B, "
          f"predicted {expected_saving} B")
    assert 0.9 * expected_saving <= saving <= 1.15 * expected_saving
