#!/usr/bin/env python3
"""One training step (forward, backward, SGD) of a ResNet-18 and a small ViT, four ways, in one run:

- dense: the model as torchvision builds it;
- dropit: ``dropit.convert(model, gamma)`` (chunked min-k, 1-bit ReLU masks);
- dropit_no_mask: the same with ``relu=False`` (torch's ReLU), like for like with the paper's code;
- paper: the published DropIT method as a baseline: each converted layer keeps the top-k |x| of its
  whole input (``torch.topk``) with int32 indices and scatters them back to a dense tensor in
  backward (the same layers dropit converts; ReLU unchanged, as in the paper's code);
- checkpoint: ``torch.utils.checkpoint`` around each residual stage / encoder block.

Variants take their steps in turn (dense, dropit, ..., checkpoint, dense, ...) on the same batch so
that drift of a shared machine cancels; the step-time ratio is the median over rounds of each
round's ratio to dense. Peak memory is measured at the allocator (dropit.memory): bytes a step
allocates above what was live before it.

    python3 benchmarks/python/bench_step.py [--rounds 30] [--output-dir benchmarks/results]
    python3 benchmarks/python/bench_step.py --device cuda --batch 128 --autocast bfloat16
"""

import argparse
import copy
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F
import torchvision
from torch import nn
from torch.utils.checkpoint import checkpoint

import dropit
from bench_common import cpu_name, summarise


# --- the published method, as a baseline -------------------------------------------------------

def _top_k(x: torch.Tensor, gamma: float):
    flat = x.reshape(-1)
    k = flat.numel() - math.floor(gamma * flat.numel())
    indices = flat.abs().topk(max(k, 1), sorted=False).indices
    return flat[indices], indices.int()


def _scatter(values, indices, shape, like):
    dense = torch.zeros(shape, dtype=like.dtype, device=like.device)
    dense.view(-1)[indices.long()] = values.to(dense.dtype)
    return dense


class _PaperLinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, gamma):
        values, indices = _top_k(x, gamma)
        ctx.save_for_backward(values, indices, weight)
        ctx.shape, ctx.has_bias = x.shape, bias is not None
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, dz):
        values, indices, weight = ctx.saved_tensors
        weight = weight.to(dz.dtype)  # under autocast, forward ran in dz's dtype
        x = _scatter(values, indices, ctx.shape, dz)
        dz2 = dz.reshape(-1, dz.shape[-1])
        dw = dz2.t() @ x.reshape(-1, x.shape[-1])
        db = dz2.sum(0) if ctx.has_bias else None
        return dz @ weight, dw, db, None


class _PaperConv2dFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, stride, padding, dilation, groups, gamma):
        values, indices = _top_k(x, gamma)
        ctx.save_for_backward(values, indices, weight)
        ctx.shape, ctx.has_bias = x.shape, bias is not None
        ctx.conv = (stride, padding, dilation, groups)
        return F.conv2d(x, weight, bias, stride, padding, dilation, groups)

    @staticmethod
    def backward(ctx, dz):
        values, indices, weight = ctx.saved_tensors
        weight = weight.to(dz.dtype)  # under autocast, forward ran in dz's dtype
        stride, padding, dilation, groups = ctx.conv
        dx = torch.nn.grad.conv2d_input(ctx.shape, weight, dz, stride, padding, dilation, groups)
        x = _scatter(values, indices, ctx.shape, dz)
        dw = torch.nn.grad.conv2d_weight(x, weight.shape, dz, stride, padding, dilation, groups)
        return dx, dw, dz.sum((0, 2, 3)) if ctx.has_bias else None, None, None, None, None, None


class PaperLinear(nn.Linear):
    gamma = 0.9

    def forward(self, x):
        if not (self.training and torch.is_grad_enabled()):
            return super().forward(x)
        return _PaperLinearFn.apply(x, self.weight, self.bias, self.gamma)


class PaperConv2d(nn.Conv2d):
    gamma = 0.9

    def forward(self, x):
        if not (self.training and torch.is_grad_enabled()) or isinstance(self.padding, str):
            return super().forward(x)
        return _PaperConv2dFn.apply(x, self.weight, self.bias, self.stride, self.padding,
                                    self.dilation, self.groups, self.gamma)


def apply_paper_method(model: nn.Module, gamma: float, example_input: torch.Tensor):
    """Swaps in the baseline on exactly the Linear and Conv2d layers dropit.convert converts (a dry
    run says which)."""
    names = {layer.name for layer in dropit.convert(copy.deepcopy(model), gamma=gamma,
                                                    example_input=example_input).converted}
    for name, module in model.named_modules():
        if name in names and type(module) in (nn.Linear, nn.Conv2d):
            module.__class__ = PaperLinear if type(module) is nn.Linear else PaperConv2d
            module.gamma = gamma


# --- checkpointing ---------------------------------------------------------------------------------

class Checkpointed(nn.Module):
    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return checkpoint(self.inner, x, use_reentrant=False)


def apply_checkpointing(model: nn.Module):
    if isinstance(model, torchvision.models.ResNet):
        for stage in ("layer1", "layer2", "layer3", "layer4"):
            setattr(model, stage, Checkpointed(getattr(model, stage)))
    else:
        layers = model.encoder.layers
        for name, block in list(layers.named_children()):
            setattr(layers, name, Checkpointed(block))


# --- models and the measurement -------------------------------------------------------------------

def resnet18():
    return torchvision.models.resnet18(num_classes=10), (3, 64, 64)


def small_vit():
    return torchvision.models.VisionTransformer(image_size=32, patch_size=4, num_layers=6,
                                                num_heads=4, hidden_dim=192, mlp_dim=768,
                                                num_classes=10), (3, 32, 32)


MODELS = {"resnet18": resnet18, "vit": small_vit}


def variants(make, gamma):
    torch.manual_seed(0)
    dense, shape = make()
    example = torch.randn(2, *shape)
    out = {"dense": dense}
    out["dropit"] = copy.deepcopy(dense)
    dropit.convert(out["dropit"], gamma=gamma, example_input=example)
    out["dropit_no_mask"] = copy.deepcopy(dense)
    dropit.convert(out["dropit_no_mask"], gamma=gamma, relu=False, example_input=example)
    out["paper"] = copy.deepcopy(dense)
    apply_paper_method(out["paper"], gamma, example)
    out["checkpoint"] = copy.deepcopy(dense)
    apply_checkpointing(out["checkpoint"])
    return out


class Timer:
    """Wall time of a block on the CPU; on a GPU, the time its stream took (CUDA events)."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def __enter__(self):
        if self.cuda:
            self.events = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
            self.events[0].record()
        else:
            self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            self.events[1].record()
            self.events[1].synchronize()
            self.seconds = self.events[0].elapsed_time(self.events[1]) / 1000
        else:
            self.seconds = time.perf_counter() - self.start


def step(model, optimizer, x, y, amp_dtype):
    """(seconds, peak bytes above what was live before the step, bytes forward left allocated:
    what the model saved for backward, the activation memory dropit shrinks)."""
    with dropit.memory.measure(x.device) as memory, Timer(x.device) as timer:
        before = dropit.memory.live_bytes(x.device)  # bookkeeping only: no synchronisation
        with torch.autocast(x.device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            loss = F.cross_entropy(model(x), y)
        held = dropit.memory.live_bytes(x.device) - before
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return timer.seconds, memory.peak_bytes, held


def bench(name, batch, rounds, warmup, gamma, device, amp_dtype):
    make = MODELS[name]
    models = {v: m.to(device) for v, m in variants(make, gamma).items()}
    _, shape = make()
    generator = torch.Generator().manual_seed(1)
    x = torch.randn((batch,) + shape, generator=generator).to(device)
    y = torch.randint(0, 10, (batch,), generator=generator).to(device)
    optimizers = {v: torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
                  for v, m in models.items()}
    for m in models.values():
        m.train()
    times = {v: [] for v in models}
    peaks = {v: [] for v in models}
    helds = {v: [] for v in models}
    for r in range(warmup + rounds):
        for v, m in models.items():
            seconds, peak, held = step(m, optimizers[v], x, y, amp_dtype)
            if r >= warmup:
                times[v].append(seconds)
                peaks[v].append(peak)
                helds[v].append(held)
    return {v: summarise(times[v], peaks[v], helds[v], times["dense"], peaks["dense"],
                         helds["dense"]) for v in models}


def machine(device):
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{cpu_name()}, {os.cpu_count()} cores"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--gamma", type=float, default=0.9)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--autocast", default="", choices=["", "bfloat16", "float16"],
                        help="train under autocast to this dtype")
    parser.add_argument("--label", default="", help="file name suffix, e.g. amd-epyc-2c")
    parser.add_argument("--output-dir", default="")
    parser.add_argument("--note", default="", help="a line on the run's conditions, kept with it")
    args = parser.parse_args()

    device = torch.device(args.device)
    amp_dtype = getattr(torch, args.autocast) if args.autocast else None
    results = {"machine": machine(device), "torch": torch.__version__,
               "threads": torch.get_num_threads(), "device": args.device,
               "autocast": args.autocast or None, "batch": args.batch, "gamma": args.gamma,
               "rounds": args.rounds, "note": args.note,
               "command": "python3 benchmarks/python/bench_step.py " + " ".join(sys.argv[1:]),
               "models": {}}
    where = (f"{results['threads']} CPU threads" if device.type == "cpu"
             else "step time from CUDA events")
    lines = [f"Training step, batch {args.batch}, gamma {args.gamma}, {args.rounds} interleaved "
             f"rounds" + (f", autocast {args.autocast}" if args.autocast else "") +
             f"; {results['machine']}, torch {torch.__version__}, {where}.",
             f"Command: `{results['command']}`." + (f" {args.note}" if args.note else ""), "",
             "| model | variant | median step | time vs dense | peak step memory | peak vs dense "
             "| held after forward | held vs dense |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for name in args.models:
        result = bench(name, args.batch, args.rounds, args.warmup, args.gamma, device, amp_dtype)
        results["models"][name] = result
        for v, r in result.items():
            lines.append(f"| {name} | {v} | {r['median_step_ms']:.1f} ms | {r['time_ratio']:.2f}x | "
                         f"{r['peak_bytes'] / 2**20:.1f} MiB | {r['peak_ratio']:.2f}x | "
                         f"{r['held_bytes'] / 2**20:.1f} MiB | "
                         f"{r['held_ratio']:.2f}x |")
    table = "\n".join(lines)
    print(table)
    if args.output_dir:
        suffix = f"-{args.label}" if args.label else ""
        os.makedirs(args.output_dir, exist_ok=True)
        with open(os.path.join(args.output_dir, f"python{suffix}.json"), "w") as f:
            json.dump(results, f, indent=2)
            f.write("\n")
        with open(os.path.join(args.output_dir, f"python{suffix}.md"), "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
