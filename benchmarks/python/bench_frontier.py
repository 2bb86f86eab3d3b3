#!/usr/bin/env python3
"""The memory/time frontier a PyTorch user chooses from: dropit beside torch.compile's activation
memory budget, per-block checkpointing and selective activation checkpointing (SAC), on a
torchvision ResNet-50, a torchvision ViT and a small GPT-style decoder.

Variants (each a training step: forward, loss, backward, SGD):
- eager dense; eager dropit (``dropit.convert``, gamma 0.9, chunked min-k, 1-bit ReLU masks);
- checkpoint: ``torch.utils.checkpoint`` (non-reentrant) around every residual / transformer block;
- SAC: the same blocks under a selective policy that saves the outputs of matmuls, convolutions and
  attention and recomputes everything else (torch's documented example policy);
- compiled dense and compiled dropit: ``torch.compile(model, fullgraph=True)`` (inductor) with
  ``torch._functorch.config.activation_memory_budget`` = 1.0, 0.5, 0.3, 0.2;
- with ``--plan 0.5 ...``, eager plan B: ``dropit.plan_memory`` at budget B (keep, convert,
  recompute or checkpoint per block, planned on the workload's own loss before the timed steps).

Each budget runs in a process of its own (the budget is global compiler configuration), with eager
dense as the baseline beside the two compiled models; the eager variants share one more process.
Within a process the variants step in turn on the same batch, so that drift of a shared machine
cancels: a time ratio is the median over rounds of that round's ratio. Memory is measured at the
allocator (``dropit.memory``): "held" is what forward leaves allocated (what backward will read),
"peak" the highest above what was live before the step. "grad dist" is the relative distance
‖g − g_dense‖ / ‖g_dense‖ of the first step's gradients (all parameters) from eager dense's.

On a GPU (``--device cuda``) the batches are larger (see ``Workload``), step times come from CUDA
events and memory from torch's caching allocator; ``--autocast bfloat16`` runs every variant under
autocast; ``--compiled dense`` leaves out compiled dropit.

    python3 benchmarks/python/bench_frontier.py [--models resnet50 vit decoder] [--rounds 6]
        [--output-dir benchmarks/results --label amd-epyc-2c]
    python3 benchmarks/python/bench_frontier.py --device cuda --models resnet18 resnet50 vit \
        --budgets 1.0 0.5 --compiled dense
    python3 benchmarks/python/bench_frontier.py --model vit --budget 0.5   # one process's share
"""

import argparse
import contextlib
import copy
import functools
import json
import math
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
import torchvision
from torch import nn
from torch.utils.checkpoint import (CheckpointPolicy, checkpoint,
                                    create_selective_checkpoint_contexts)

import dropit
from bench_common import cpu_name, save_results, summarise, write_json

BUDGETS = (1.0, 0.5, 0.3, 0.2)
GAMMA = 0.9


# --- the models ------------------------------------------------------------------------------------

class DecoderBlock(nn.Module):
    """A pre-norm GPT block, written as users write one: fused QKV projection, causal scaled dot
    product attention, GELU MLP."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.fc, self.act, self.out = nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)

    def forward(self, x):
        batch, tokens, width = x.shape
        q, k, v = (t.view(batch, tokens, self.heads, -1).transpose(1, 2)
                   for t in self.qkv(self.norm1(x)).split(width, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(batch, tokens, width))
        return x + self.out(self.act(self.fc(self.norm2(x))))


class Decoder(nn.Module):
    def __init__(self, vocab: int, tokens: int, width: int, layers: int, heads: int):
        super().__init__()
        self.embed, self.position = nn.Embedding(vocab, width), nn.Embedding(tokens, width)
        self.blocks = nn.ModuleList(DecoderBlock(width, heads) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, vocab)

    def forward(self, tokens):
        x = self.embed(tokens) + self.position(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class Workload:
    """A model, a batch of it (on ``device``), its loss, and where its blocks are (for
    checkpointing). A GPU gets batches that keep it busy; the CPU, batches a 2-core machine steps
    in about a second."""

    # name: (CPU batch, GPU batch)
    BATCH = {"resnet18": (16, 128), "resnet50": (16, 64), "vit": (8, 64), "decoder": (8, 32)}

    def __init__(self, name, device="cpu"):
        if name not in self.BATCH:
            raise ValueError(f"unknown model {name}; expected one of {', '.join(self.BATCH)}")
        self.name = name
        self.device = torch.device(device)
        batch = self.BATCH[name][self.device.type == "cuda"]
        generator = torch.Generator().manual_seed(1)
        torch.manual_seed(0)
        if name in ("resnet18", "resnet50"):
            side = 128 if self.device.type == "cpu" or name == "resnet18" else 160
            self.model = getattr(torchvision.models, name)(num_classes=10)
            self.batch = (torch.randn(batch, 3, side, side, generator=generator),
                          torch.randint(0, 10, (batch,), generator=generator))
            self.shape = f"batch {batch}, {side}²"
        elif name == "vit":
            self.model = torchvision.models.VisionTransformer(
                image_size=224, patch_size=16, num_layers=6, num_heads=6, hidden_dim=384,
                mlp_dim=1536, num_classes=10)
            self.batch = (torch.randn(batch, 3, 224, 224, generator=generator),
                          torch.randint(0, 10, (batch,), generator=generator))
            self.shape = f"6×384, batch {batch}, 224²"
        else:
            vocab, tokens = 2048, 256
            self.model = Decoder(vocab, tokens, width=256, layers=4, heads=4)
            text = torch.randint(0, vocab, (batch, tokens + 1), generator=generator)
            self.batch = (text[:, :-1], text[:, 1:])
            self.shape = f"4×256, batch {batch}, 256 tokens, vocabulary 2048"
        self.model.to(self.device)
        self.batch = tuple(t.to(self.device) for t in self.batch)
        self.autocast = None

    def loss(self, model):
        x, y = self.batch
        autocast = (torch.autocast(self.device.type, dtype=self.autocast) if self.autocast
                    else contextlib.nullcontext())
        with autocast:
            out = model(x)
            return F.cross_entropy(out.reshape(-1, out.shape[-1]).float(), y.reshape(-1))


def blocks(model):
    """(parent, key) of every residual or transformer block."""
    if isinstance(model, torchvision.models.ResNet):
        return [(stage, i) for name in ("layer1", "layer2", "layer3", "layer4")
                for stage in [getattr(model, name)] for i in range(len(stage))]
    if isinstance(model, torchvision.models.VisionTransformer):
        layers = model.encoder.layers
        return [(layers, name) for name, _ in layers.named_children()]
    return [(model.blocks, i) for i in range(len(model.blocks))]


class Checkpointed(nn.Module):
    def __init__(self, inner, context_fn=None):
        super().__init__()
        self.inner = inner
        self.context_fn = context_fn

    def forward(self, x):
        if self.context_fn is None:
            return checkpoint(self.inner, x, use_reentrant=False)
        return checkpoint(self.inner, x, use_reentrant=False, context_fn=self.context_fn)


def checkpointed(model, policy=None):
    context = None if policy is None else functools.partial(
        create_selective_checkpoint_contexts, policy)
    for parent, key in blocks(model):
        if isinstance(key, int):  # an entry of a Sequential or ModuleList
            parent[key] = Checkpointed(parent[key], context)
        else:
            setattr(parent, key, Checkpointed(getattr(parent, key), context))
    return model


_aten = torch.ops.aten
# torch's documented example: keep what is expensive to recompute.
_COMPUTE_INTENSIVE = {_aten.mm.default, _aten.addmm.default, _aten.bmm.default,
                      _aten.convolution.default}
for _name in ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
              "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention"):
    if hasattr(_aten, _name):
        _COMPUTE_INTENSIVE.add(getattr(_aten, _name).default)


def save_compute_intensive(ctx, op, *args, **kwargs):
    return CheckpointPolicy.MUST_SAVE if op in _COMPUTE_INTENSIVE else \
        CheckpointPolicy.PREFER_RECOMPUTE


def converted(model, example_input):
    dropit.convert(model, gamma=GAMMA, example_input=example_input)
    return model


def planned(model, workload, budget):
    plan = dropit.plan_memory(model, lambda: workload.loss(model), budget=budget)
    print(plan, flush=True)
    return model


def variants(workload, budget, compiled=("dense", "dropit"), plans=()):
    """The variants one process measures: eager dense first (the baseline), then the rest."""
    dense = workload.model
    out = {"eager dense": dense}
    if budget is None:
        out["eager dropit"] = converted(copy.deepcopy(dense), workload.batch[0])
        out["checkpoint"] = checkpointed(copy.deepcopy(dense))
        out["SAC"] = checkpointed(copy.deepcopy(dense), save_compute_intensive)
        for plan_budget in plans:
            out[f"eager plan {plan_budget}"] = planned(copy.deepcopy(dense), workload, plan_budget)
    else:
        if "dense" in compiled:
            out[f"compiled dense {budget}"] = torch.compile(copy.deepcopy(dense), fullgraph=True)
        if "dropit" in compiled:
            out[f"compiled dropit {budget}"] = torch.compile(
                converted(copy.deepcopy(dense), workload.batch[0]), fullgraph=True)
    return out


# --- the measurement -------------------------------------------------------------------------------

class _Clock:
    """Seconds of a stretch of work: wall time on the CPU; on a GPU, CUDA events on the current
    stream (read after the step, so timing adds no synchronisation inside it)."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def start(self):
        if self.cuda:
            self.begin = torch.cuda.Event(enable_timing=True)
            self.begin.record()
        else:
            self.begin = time.perf_counter()

    def stop(self):
        if not self.cuda:
            return time.perf_counter() - self.begin
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        end.synchronize()
        return self.begin.elapsed_time(end) / 1e3


def step(workload, model, optimizer):
    """(seconds, peak bytes above those live before, bytes forward left allocated, gradients)."""
    device = workload.device
    optimizer.zero_grad(set_to_none=True)
    clock = _Clock(device)
    with dropit.memory.measure(device) as memory:
        clock.start()
        before = dropit.memory.live_bytes(device)
        loss = workload.loss(model)
        held = dropit.memory.live_bytes(device) - before
        loss.backward()
        seconds = clock.stop()
    gradients = [p.grad for p in model.parameters()]
    optimizer.step()
    return seconds, memory.peak_bytes, held, gradients


def distance(gradients, reference):
    num = sum(float((g - r).double().pow(2).sum()) for g, r in zip(gradients, reference))
    den = sum(float(r.double().pow(2).sum()) for r in reference)
    return math.sqrt(num / den)


def measure(name, budget, rounds, warmup, device="cpu", autocast="", compiled=("dense", "dropit"),
            plans=()):
    if budget is not None:
        torch._functorch.config.activation_memory_budget = budget
    workload = Workload(name, device)
    workload.autocast = getattr(torch, autocast) if autocast else None
    models = variants(workload, budget, compiled, plans)
    for model in models.values():
        model.train()
    optimizers = {v: torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9)
                  for v, m in models.items()}
    times = {v: [] for v in models}
    peaks = {v: [] for v in models}
    helds = {v: [] for v in models}
    first_gradients = {}
    compile_seconds = {}
    for r in range(warmup + rounds):
        for v, model in models.items():
            seconds, peak, held, gradients = step(workload, model, optimizers[v])
            if r == 0:
                first_gradients[v] = [g.detach().clone() for g in gradients]
                compile_seconds[v] = seconds
            elif r >= warmup:
                times[v].append(seconds)
                peaks[v].append(peak)
                helds[v].append(held)
    result = {}
    compiled_dense = f"compiled dense {budget}"
    for v in models:
        entry = summarise(times[v], peaks[v], helds[v], times["eager dense"],
                          peaks["eager dense"], helds["eager dense"])
        entry["grad_distance"] = distance(first_gradients[v], first_gradients["eager dense"])
        entry["first_step_s"] = compile_seconds[v]
        if v.startswith("compiled dropit") and compiled_dense in times:
            entry["time_vs_compiled_dense"] = statistics.median(
                a / b for a, b in zip(times[v], times[compiled_dense]))
            entry["held_vs_compiled_dense"] = max(helds[v]) / max(helds[compiled_dense])
        result[v] = entry
    return {"model": name, "shape": workload.shape, "budget": budget, "device": device,
            "autocast": autocast, "variants": result}


# --- the whole frontier: one process per (model, budget) ---------------------------------------

def table(runs, machine, command):
    lines = [f"Frontier: training step on {machine}; gamma {GAMMA}; ratios to eager "
             "dense measured in the same process, interleaved (median of per-round ratios).", "",
             f"Command: `{command}`", "",
             "| model | variant | held vs dense | peak vs dense | time vs dense | "
             "vs compiled dense (held / time) | grad dist |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for run in runs:
        for v, r in run["variants"].items():
            if v == "eager dense" and run["budget"] is not None:
                continue  # the same baseline again
            versus = ""
            if "time_vs_compiled_dense" in r:
                versus = f"{r['held_vs_compiled_dense']:.2f}× / {r['time_vs_compiled_dense']:.2f}×"
            lines.append(f"| {run['model']} ({run['shape']}) | {v} | {r['held_ratio']:.2f}× | "
                         f"{r['peak_ratio']:.2f}× | {r['time_ratio']:.2f}× | {versus} | "
                         f"{r['grad_distance']:.1e} |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["resnet50", "vit", "decoder"],
                        choices=list(Workload.BATCH))
    parser.add_argument("--budgets", nargs="*", type=float, default=list(BUDGETS),
                        help="compiler memory budgets (none: the eager variants only)")
    parser.add_argument("--compiled", nargs="+", default=["dense", "dropit"],
                        choices=["dense", "dropit"], help="which models to compile at each budget")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--autocast", default="", choices=["", "bfloat16", "float16"],
                        help="run every variant under autocast to this type")
    parser.add_argument("--plan", nargs="*", type=float, default=[],
                        help="dropit.plan_memory budgets measured among the eager variants")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2, help="steps before timing (compiles)")
    parser.add_argument("--model", help="measure one process's share: this model ...")
    parser.add_argument("--budget", type=float, help="... at this compiler budget (else eager)")
    parser.add_argument("--json", help="where that share writes its result")
    parser.add_argument("--output-dir", default="")
    parser.add_argument("--label", default="", help="file name suffix, e.g. amd-epyc-2c")
    args = parser.parse_args()
    if args.warmup < 1:
        parser.error("--warmup must be at least 1 (the first step compiles)")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device")

    if args.model:
        result = measure(args.model, args.budget, args.rounds, args.warmup, args.device,
                         args.autocast, args.compiled, args.plan)
        write_json(result, args.json)
        return

    # Each process's share is kept until the table is written: an interrupted run resumes, and a
    # run stopped at a time limit leaves the shares it finished. Every model's eager variants come
    # first, then each budget for every model.
    runs, parts = [], []
    scratch = os.path.join(args.output_dir or ".", ".frontier-parts")
    os.makedirs(scratch, exist_ok=True)
    for budget in [None] + args.budgets:
        for name in args.models:
            plans = args.plan if budget is None else []
            tag = "-".join(filter(None, [name, str(budget or "eager"), args.device, args.autocast,
                                         *args.compiled, *(f"plan{b}" for b in plans),
                                         str(args.rounds)]))
            part = os.path.join(scratch, tag + ".json")
            if not os.path.exists(part):
                command = [sys.executable, __file__, "--model", name, "--rounds", str(args.rounds),
                           "--warmup", str(args.warmup), "--json", part, "--device", args.device,
                           "--compiled", *args.compiled]
                if args.autocast:
                    command += ["--autocast", args.autocast]
                if budget is not None:
                    command += ["--budget", str(budget)]
                if plans:
                    command += ["--plan", *map(str, plans)]
                print("frontier:", name, "eager" if budget is None else f"budget {budget}",
                      flush=True)
                subprocess.run(command, check=True)
            with open(part, encoding="utf-8") as f:
                runs.append(json.load(f))
            parts.append(part)
    runs.sort(key=lambda run: args.models.index(run["model"]))  # the table reads by model

    where = (f"{torch.cuda.get_device_name()}" if args.device == "cuda"
             else f"the CPU ({cpu_name()}, {torch.get_num_threads()} threads")
    machine = (f"{where}, torch {torch.__version__}" + (")" if args.device == "cpu" else "")
               + (f", autocast {args.autocast}" if args.autocast else ""))
    command = " ".join(["python3", "benchmarks/python/bench_frontier.py"] + sys.argv[1:])
    text = table(runs, machine, command)
    print(text, end="")
    if args.output_dir:
        save_results(args.output_dir, "frontier", args.label,
                     {"machine": machine, "command": command, "gamma": GAMMA, "runs": runs}, text)
    for part in parts:
        os.remove(part)
    if not os.listdir(scratch):  # another run's shares may still be there
        os.rmdir(scratch)


if __name__ == "__main__":
    main()
