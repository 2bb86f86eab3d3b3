"""benchmarks/python/profile_step.py, the profile the GPU check takes of a converted step, on the
CPU and, where there is one, on CUDA: it must find every converted layer's operator, forward and
backward, once per layer, and nothing else (the kernels they launch count under them)."""

import copy
import os
import sys

import torch

import dropit
import dropit.nn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "benchmarks",
                                "python"))
import profile_step  # noqa: E402


def test_profile_counts_one_call_per_converted_layer_each_way(device):
    model, x, y = profile_step.build("resnet18", batch=2, size=32, device=device.type)
    converted = copy.deepcopy(model)
    # recompute=False: every converted layer then runs dropit's operators (a layer that recomputes
    # its input runs torch's).
    dropit.convert(converted, gamma=0.9, example_input=x, recompute=False)
    # The reference: how often forward calls each converted module (ResNet's blocks call their
    # one ReLU module twice), counted by forward hooks on a forward of its own.
    layers = {"conv2d": dropit.nn.Conv2d, "linear": dropit.nn.Linear, "relu": dropit.nn.ReLU}
    expected = dict.fromkeys(layers, 0)
    hooks = []
    for module in converted.modules():
        for name, kind in layers.items():
            if isinstance(module, kind):
                def count(*_, name=name):
                    expected[name] += 1
                hooks.append(module.register_forward_hook(count))
    with torch.no_grad():
        converted(x)
    for hook in hooks:
        hook.remove()
    assert expected["conv2d"] == 19 and expected["linear"] == 1 and expected["relu"] == 17

    run = profile_step.profiled_step(converted, x, y, device.type, warmup=1)
    operators = profile_step.per_operator(run["events"])
    assert set(operators) == {f"{way}dropit::{name}" for name in expected
                              for way in ("", "backward of ")}
    for name, count in expected.items():
        assert operators[f"dropit::{name}"][0] == count, name
        assert operators[f"backward of dropit::{name}"][0] == count, name
    # Host time is measured for each; kernels are launched on CUDA only.
    assert all(entry[2] > 0 for entry in operators.values())
    assert all((entry[1] > 0) == (device.type == "cuda") for entry in operators.values())

    text = profile_step.report("resnet18", "batch 2, 32²", device.type, 0.9,
                               profile_step.profiled_step(model, x, y, device.type, warmup=1), run)
    assert f"| `dropit::conv2d` | {expected['conv2d']} |" in text

    # The differences between the steps: every name of either, each its own difference, and the
    # dropit operators absent from the dense step.
    dense_by = {"a": [2, 10.0], "b": [1, 5.0]}
    converted_by = {"a": [2, 4.0], "c": [3, 7.0]}
    assert profile_step.step_differences(dense_by, converted_by) == [
        ("c", 7.0, (0, 0.0), (3, 7.0)), ("a", -6.0, (2, 10.0), (2, 4.0)),
        ("b", -5.0, (1, 5.0), (0, 0.0))]
    assert "that differ most (dropit − dense)" in text
    differences = profile_step.step_differences(
        profile_step.time_by_name(profile_step.profiled_step(model, x, y, device.type, warmup=1),
                                  device.type),
        profile_step.time_by_name(run, device.type))
    if device.type == "cpu":
        dropit_rows = [row for row in differences if row[0] == "dropit::conv2d"]
        assert dropit_rows and dropit_rows[0][2] == (0, 0.0) and dropit_rows[0][3][0] == 19


def test_kernels_inductor_generates_are_named_by_what_they_fuse():
    assert profile_step.kernel_name("graph_1_cpp_fused_add_relu_7") == "fused_add_relu"
    assert profile_step.kernel_name("triton_poi_fused_add_relu_12") == "fused_add_relu"
    assert profile_step.kernel_name("graph_0_cpp_fused__native_batch_norm_legit_functional_3") \
        == "fused__native_batch_norm_legit_functional"
    assert profile_step.kernel_name("## Call CompiledFxGraph f2h7k733y5 ##") == \
        "compiled graph call"
    for kept in ("aten::convolution", "dropit::compress", "void at::native::copy_kernel_1"):
        assert profile_step.kernel_name(kept) == kept


def test_compiled_profile_finds_the_generated_kernels_and_dropit_operators(monkeypatch):
    # A fresh compiler: the suite's other compiled models count towards one recompile limit.
    torch._dynamo.reset()
    monkeypatch.setattr(torch._inductor.config.cpp, "enable_kernel_profile", True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(), torch.nn.Linear(8, 10))
    x, y = torch.randn(2, 3, 16, 16), torch.randint(0, 10, (2,))
    dropit.convert(model, gamma=0.9, example_input=x)
    run = profile_step.profiled_step(torch.compile(model, fullgraph=True), x, y, "cpu", warmup=1)
    by_name = profile_step.time_by_name(run, "cpu")
    # The graphs' own kernels, by what they fuse; dropit's operators called from them.
    assert any(name.startswith("fused_") for name in by_name)
    assert not any(name.startswith("graph_") for name in by_name)
    assert {"dropit::compress", "dropit::relu_with_mask"} <= set(by_name)
    text = profile_step.report("cnn", "batch 2, 16²", "cpu", 0.9, run, run, compiled=True)
    assert "both under torch.compile(fullgraph=True)" in text.splitlines()[0]
