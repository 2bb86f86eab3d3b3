#!/usr/bin/env python3
"""Profile of one training step (forward, backward, SGD) of a converted model beside the dense
one, with torch.profiler: where the step's device time goes, how many kernels each dropit operator
launches and how much host time it takes per call, and dropit's share of the step.

Tables (Markdown):
- the step, dense and dropit: kernels launched, device time of those kernels, host (wall) time
  profiled; without the profiler, the host time to queue a step and the step's time;
- each dropit operator (anything whose name holds "dropit", forward and backward, outermost only):
  calls, kernels per call, host time per call, device time per call, share of the step's device
  time;
- the top kernels of the dropit step by device time (on the CPU: the top operators by self time);
- the kernels (operators) whose time differs most between the two steps: where the converted
  step's extra device time goes, and what it saves.

    python3 benchmarks/python/profile_step.py --device cuda [--model resnet18] [--output profile.md]
    python3 benchmarks/python/profile_step.py --batch 4 --size 32       # a quick look on the CPU

With --compile both models run under torch.compile(fullgraph=True) (inductor): the kernels it
generates are profiled too (on the CPU through inductor's kernel profiling), named by the
operations they fuse, so that the two steps' tables compare what each graph computes.
"""

import argparse
import copy
import re
import time

import torch
import torch.nn.functional as F
import torchvision
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

import dropit
from bench_common import print_table


def build(model_name, batch, size, device):
    torch.manual_seed(0)
    if model_name == "vit":
        model = torchvision.models.VisionTransformer(
            image_size=size, patch_size=16, num_layers=6, num_heads=6, hidden_dim=384,
            mlp_dim=1536, num_classes=10)
    else:
        model = getattr(torchvision.models, model_name)(num_classes=10)
    x = torch.randn(batch, 3, size, size, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    return model.to(device), x, y


def train_step(model, optimizer, x, y):
    optimizer.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()
    optimizer.step()


def kernel_name(name):
    """A kernel inductor generated, by the operations it fuses: graph_1_cpp_fused_add_relu_7 and
    triton_poi_fused_add_relu_7 are both fused_add_relu (each graph numbers its kernels, so the
    two steps' kernels compare only by what they fuse); a graph's call, by any hash, is "compiled
    graph call". Other names are kept."""
    match = re.fullmatch(r"(?:graph_\d+_)?(?:cpp|triton_[a-z]+)_(fused_\w*?)(?:_\d+)?", name)
    if match:
        return match.group(1)
    # A compiled graph's call (its wrapper's own time), whichever graph: forward or backward.
    return re.sub(r"^## Call CompiledFxGraph \S+ ##$", "compiled graph call", name)


def short_name(name):
    """A dropit layer's backward node by its layer: dropit::Conv2dBackward is the backward of
    dropit::conv2d."""
    match = re.search(r"dropit::(Linear|Conv2d|ReLU)Backward$", name)
    return f"backward of dropit::{match.group(1).lower()}" if match else name


def is_dropit(event):
    """A host-side dropit event (its kernels, whose names say dropit too, are counted under it)."""
    return event.device_type == DeviceType.CPU and "dropit" in event.name.lower()


def outermost_dropit(events):
    """The dropit events with no dropit ancestor (an operator's inner calls count towards it)."""
    out = []
    for event in events:
        if not is_dropit(event):
            continue
        parent = event.cpu_parent
        while parent is not None and not is_dropit(parent):
            parent = parent.cpu_parent
        if parent is None:
            out.append(event)
    return out


def subtree_kernels(event):
    """(kernels launched, their device time in µs) by an event and everything it called."""
    count = len(event.kernels)
    device_us = sum(k.duration for k in event.kernels)
    for child in event.cpu_children:
        c, d = subtree_kernels(child)
        count += c
        device_us += d
    return count, device_us


def profiled_step(model, x, y, device, warmup, steps=1):
    """The profile of `steps` steps after `warmup` ones; the figures are per step."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    for _ in range(warmup):
        train_step(model, optimizer, x, y)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    if device == "cuda":
        torch.cuda.synchronize()
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            train_step(model, optimizer, x, y)
        if device == "cuda":
            torch.cuda.synchronize()
        wall_us = (time.perf_counter() - start) * 1e6 / steps
    events = list(prof.events())
    kernels = [k for e in events for k in e.kernels]
    enqueue_us, step_us = unprofiled_step(model, optimizer, x, y, device)
    return {
        "prof": prof,
        "events": events,
        "steps": steps,
        "wall_us": wall_us,
        "kernels": len(kernels) / steps,
        "device_us": sum(k.duration for k in kernels) / steps,
        "enqueue_us": enqueue_us,
        "step_us": step_us,
    }


def unprofiled_step(model, optimizer, x, y, device, steps=11):
    """Medians over `steps` steps without the profiler (whose own host cost inflates the profiled
    step's): the host time until a step's last operation is queued, and the step's whole time. A
    step whose host time reaches its whole time is bound by the host, not the device."""
    synchronize = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    enqueue, whole = [], []
    for _ in range(steps):
        synchronize()
        start = time.perf_counter()
        train_step(model, optimizer, x, y)
        queued = time.perf_counter()
        synchronize()
        enqueue.append((queued - start) * 1e6)
        whole.append((time.perf_counter() - start) * 1e6)
    return sorted(enqueue)[steps // 2], sorted(whole)[steps // 2]


def per_operator(events, steps=1):
    """{operator: [calls, kernels, host µs, device µs]} per step over the outermost dropit
    events of `steps` steps."""
    out = {}
    for event in outermost_dropit(events):
        count, device_us = subtree_kernels(event)
        entry = out.setdefault(short_name(event.name), [0, 0, 0.0, 0.0])
        entry[0] += 1
        entry[1] += count
        entry[2] += event.cpu_time_total
        entry[3] += device_us
    return {name: [calls / steps, count / steps, host_us / steps, device_us / steps]
            for name, (calls, count, host_us, device_us) in out.items()}


def steps_profiled(run):
    return "one step" if run["steps"] == 1 else f"{run['steps']} steps each"


def report(model_name, shape, device, gamma, dense, converted, compiled=False):
    where = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    how = ", both under torch.compile(fullgraph=True)" if compiled else ""
    lines = [f"# Profile of one training step: {model_name} ({shape}) on {where}, gamma {gamma}"
             f"{how}",
             "", f"torch {torch.__version__}; {steps_profiled(dense)} after warm-up, "
             "torch.profiler (figures per step); then the median of 11 steps without it: the "
             "host time until the step's last operation is queued, and the step's time "
             "(host-bound where the two meet).", "",
             "| step | kernels | device time (ms) | host time, profiled (ms) | host time to queue "
             "(ms) | step time (ms) |", "|---|---:|---:|---:|---:|---:|"]
    for name, run in (("dense", dense), ("dropit", converted)):
        lines.append(f"| {name} | {run['kernels']:g} | {run['device_us'] / 1e3:.2f} | "
                     f"{run['wall_us'] / 1e3:.2f} | {run['enqueue_us'] / 1e3:.2f} | "
                     f"{run['step_us'] / 1e3:.2f} |")

    per_op = per_operator(converted["events"], converted["steps"])
    total_device = max(converted["device_us"], 1e-9)
    lines += ["", "| dropit operator | calls | kernels per call | host µs per call | "
              "device µs per call | share of step device time |", "|---|---:|---:|---:|---:|---:|"]
    shares = 0.0
    # By device time, then (on the CPU, where there is none) by host time.
    for name, (calls, count, host_us, device_us) in sorted(
            per_op.items(), key=lambda item: (item[1][3], item[1][2]), reverse=True):
        shares += device_us / total_device
        lines.append(f"| `{name}` | {calls:g} | {count / calls:.1f} | {host_us / calls:.1f} | "
                     f"{device_us / calls:.1f} | {100 * device_us / total_device:.1f} % |")
    lines += ["", f"dropit's operators: {100 * shares:.1f} % of the step's device time, "
              f"{sum(v[2] for v in per_op.values()) / 1e3:.2f} ms of host time (their own and "
              "what they call)."]

    what = "kernels" if device == "cuda" else "operators"
    unit = "device time" if device == "cuda" else "self CPU time"
    dense_by, converted_by = time_by_name(dense, device), time_by_name(converted, device)
    lines += ["", f"| top {what} (dropit step) | calls | {unit} (ms) | share |",
              "|---|---:|---:|---:|"]
    total = max(sum(us for _, us in converted_by.values()), 1e-9)
    for name, (calls, us) in sorted(converted_by.items(), key=lambda item: -item[1][1])[:15]:
        lines.append(f"| `{name[:90]}` | {calls:g} | {us / 1e3:.3f} | {100 * us / total:.1f} % |")

    lines += ["", f"| {what} that differ most (dropit − dense) | dense calls | dense ms | "
              "dropit calls | dropit ms | difference (ms) |", "|---|---:|---:|---:|---:|---:|"]
    for name, difference, (dense_calls, dense_us), (calls, us) in step_differences(
            dense_by, converted_by)[:15]:
        lines.append(f"| `{name[:90]}` | {dense_calls:g} | {dense_us / 1e3:.3f} | {calls:g} | "
                     f"{us / 1e3:.3f} | {difference / 1e3:+.3f} |")
    return "\n".join(lines) + "\n"


def time_by_name(run, device):
    """{name: [calls, µs]} per step: each kernel's device time on CUDA, each operator's self CPU
    time on the CPU."""
    by_name = {}
    if device == "cuda":
        for event in run["events"]:
            for k in event.kernels:
                entry = by_name.setdefault(kernel_name(k.name), [0, 0.0])
                entry[0] += 1
                entry[1] += k.duration
    else:
        for avg in run["prof"].key_averages():
            entry = by_name.setdefault(kernel_name(avg.key), [0, 0.0])
            entry[0] += avg.count
            entry[1] += avg.self_cpu_time_total
    steps = run["steps"]
    return {name: [calls / steps, us / steps] for name, (calls, us) in by_name.items()}


def step_differences(dense_by, converted_by):
    """[(name, dropit µs − dense µs, dense [calls, µs], dropit [calls, µs])], largest difference in
    either direction first."""
    rows = []
    for name in dense_by.keys() | converted_by.keys():
        dense_entry, entry = dense_by.get(name, [0, 0.0]), converted_by.get(name, [0, 0.0])
        rows.append((name, entry[1] - dense_entry[1], tuple(dense_entry), tuple(entry)))
    return sorted(rows, key=lambda row: -abs(row[1]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--model", default="resnet18", choices=["resnet18", "resnet50", "vit"])
    parser.add_argument("--batch", type=int, help="default: 128 on a GPU, 8 on the CPU")
    parser.add_argument("--size", type=int, help="image side (default: 64; the ViT 224)")
    parser.add_argument("--gamma", type=float, default=0.9)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=1,
                        help="profiled steps (the tables give per-step figures)")
    parser.add_argument("--compile", action="store_true",
                        help="compile both models with torch.compile(fullgraph=True) (inductor)")
    parser.add_argument("--output", default="", help="also write the tables to this file")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device")
    if args.steps < 1 or args.warmup < 1:
        parser.error(f"--steps {args.steps} and --warmup {args.warmup} must be at least 1")
    batch = args.batch or (128 if args.device == "cuda" else 8)
    size = args.size or (224 if args.model == "vit" else 64)

    model, x, y = build(args.model, batch, size, args.device)
    converted = copy.deepcopy(model)
    dropit.convert(converted, gamma=args.gamma, example_input=x)  # in place; returns its report
    if args.compile:
        # The generated CPU kernels as profiler events of their own (CUDA's are kernels anyway).
        torch._inductor.config.cpp.enable_kernel_profile = True
        model = torch.compile(model, fullgraph=True)
        converted = torch.compile(converted, fullgraph=True)
    dense_run = profiled_step(model, x, y, args.device, args.warmup, args.steps)
    converted_run = profiled_step(converted, x, y, args.device, args.warmup, args.steps)
    text = report(args.model, f"batch {batch}, {size}²", args.device, args.gamma, dense_run,
                  converted_run, args.compile)
    print_table(text, args.output)


if __name__ == "__main__":
    main()
