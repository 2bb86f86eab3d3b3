#!/usr/bin/env python3
"""A training step of the models users train, three ways: torchvision's ResNet-50, ViT-B/16,
ConvNeXt-T and MobileNetV3-Large, timm's ViT-S/16, and Hugging Face's GPT-2, Llama and BERT, each
built from its config with random weights at a size a 2-core CPU steps in seconds.

Variants (each a training step: forward, loss, backward, optimizer step):
- dense: the model as its library builds it (eager);
- dropit: ``dropit.convert(model, gamma=0.9, example_input=batch)`` (chunked min-k, 1-bit ReLU
  masks; the layer fed by the model's own input stays dense);
- checkpoint: ``torch.utils.checkpoint`` (non-reentrant) around every residual or transformer block
  (ResNet bottlenecks, ViT encoder layers, ConvNeXt blocks, MobileNet inverted residuals, timm's
  ``blocks``, Hugging Face's decoder / encoder layers).

Each model runs in a process of its own. Within it the variants step in turn on the same batch, the
order rotating from round to round, so that drift of a shared machine cancels: a time ratio is the
median over rounds of that round's ratio to dense (the lowest and highest are given beside it).
Memory is measured at the allocator (``dropit.memory``): "held" is what forward leaves allocated
(what backward will read), "peak" the highest above what was live before the step (parameters and
optimizer state), over forward, backward and the optimizer's step. Dropout and stochastic depth
stay at the builders' defaults.

    python3 benchmarks/python/bench_models.py [--models resnet50 gpt2 ...] [--rounds 10]
        [--output-dir benchmarks/results --label amd-epyc-2c]
    python3 benchmarks/python/bench_models.py --model llama --rounds 10   # one process's share
"""

import argparse
import copy
import json
import os
import shlex
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
import torchvision
from torch.utils.checkpoint import checkpoint

import bench_frontier
import dropit
from bench_common import cpu_name, save_results, summarise, write_json

GAMMA = 0.9
TARGET = 1.02  # dropit's step time vs dense the project aims at
TOKENS = 256
VOCABULARY = 8192


# --- the models -----------------------------------------------------------------------------------

def image_batch(batch, size, classes=1000):
    generator = torch.Generator().manual_seed(1)
    return (torch.randn(batch, 3, size, size, generator=generator),
            torch.randint(0, classes, (batch,), generator=generator))


def text_batch(batch, masked=False):
    """input_ids and labels: the next tokens (the model shifts them), or for a masked language
    model the tokens at 15 % of positions and -100 (ignored) elsewhere."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCABULARY, (batch, TOKENS), generator=generator)
    labels = ids.clone()
    if masked:
        chosen = torch.rand(batch, TOKENS, generator=generator) < 0.15
        labels[~chosen] = -100
    return ids, labels


def hugging_face(config_name, model_name, **config):
    import transformers
    settings = dict(vocab_size=VOCABULARY, use_cache=False)
    settings.update(config)
    return getattr(transformers, model_name)(getattr(transformers, config_name)(**settings))


def timm_vit():
    import timm
    return timm.create_model("vit_small_patch16_224", pretrained=False)


# name -> (make the model, make the batch, the optimizer, a description of the size). Images: 1000
# classes; text: 256 tokens, vocabulary 8192; every Hugging Face model 6 layers, 512 wide, 8 heads.
MODELS = {
    "resnet50": (lambda: torchvision.models.resnet50(), lambda: image_batch(16, 128), "sgd",
                 "batch 16, 128²"),
    "vit_b_16": (lambda: torchvision.models.vit_b_16(), lambda: image_batch(4, 224), "adamw",
                 "batch 4, 224²"),
    "convnext_tiny": (lambda: torchvision.models.convnext_tiny(), lambda: image_batch(8, 128),
                      "adamw", "batch 8, 128²"),
    "mobilenet_v3_large": (lambda: torchvision.models.mobilenet_v3_large(),
                           lambda: image_batch(32, 224), "sgd", "batch 32, 224²"),
    "timm_vit_s": (timm_vit, lambda: image_batch(8, 224), "adamw",
                   "vit_small_patch16_224, batch 8, 224²"),
    "gpt2": (lambda: hugging_face("GPT2Config", "GPT2LMHeadModel", n_embd=512, n_layer=6, n_head=8,
                                  n_positions=TOKENS, bos_token_id=0, eos_token_id=0),
             lambda: text_batch(8), "adamw", "6×512, batch 8, 256 tokens"),
    "llama": (lambda: hugging_face("LlamaConfig", "LlamaForCausalLM", hidden_size=512,
                                   intermediate_size=1408, num_hidden_layers=6,
                                   num_attention_heads=8, num_key_value_heads=8,
                                   max_position_embeddings=TOKENS),
              lambda: text_batch(8), "adamw", "6×512, batch 8, 256 tokens"),
    "bert": (lambda: hugging_face("BertConfig", "BertForMaskedLM", hidden_size=512,
                                  intermediate_size=2048, num_hidden_layers=6,
                                  num_attention_heads=8, max_position_embeddings=512),
             lambda: text_batch(8, masked=True), "adamw",
             "6×512, batch 8, 256 tokens, 15 % masked"),
}


def is_text(name):
    return name in ("gpt2", "llama", "bert")


def loss_of(name, model, batch):
    x, y = batch
    if is_text(name):
        return model(input_ids=x, labels=y).loss
    return F.cross_entropy(model(x), y)


# --- per-block checkpointing ----------------------------------------------------------------------

class Checkpointed(bench_frontier.Checkpointed):
    """A block under torch.utils.checkpoint (non-reentrant), whatever arguments it takes."""

    def forward(self, *args, **kwargs):
        return checkpoint(self.inner, *args, use_reentrant=False, **kwargs)


def blocks(model):
    """(parent, key) of every residual or transformer block."""
    if isinstance(model, torchvision.models.ConvNeXt):
        return [(stage, i) for stage in model.features for i, block in enumerate(stage)
                if isinstance(block, torchvision.models.convnext.CNBlock)]
    if isinstance(model, torchvision.models.MobileNetV3):
        return [(model.features, i) for i, block in enumerate(model.features)
                if isinstance(block, torchvision.models.mobilenetv3.InvertedResidual)]
    for path in ("transformer.h", "model.layers", "bert.encoder.layer"):  # Hugging Face
        try:
            layers = model.get_submodule(path)
        except AttributeError:
            continue
        return [(layers, i) for i in range(len(layers))]
    return bench_frontier.blocks(model)  # ResNet, torchvision's ViT, timm's ``blocks``


def checkpointed(model):
    found = blocks(model)
    if not found:
        raise ValueError(f"no blocks found in {type(model).__name__}")
    for parent, key in found:
        if isinstance(key, int):
            parent[key] = Checkpointed(parent[key])
        else:
            setattr(parent, key, Checkpointed(getattr(parent, key)))
    return model, len(found)


# --- the measurement ------------------------------------------------------------------------------

def optimizer_for(kind, model):
    if kind == "sgd":
        return torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    return torch.optim.AdamW(model.parameters(), lr=1e-4)


def step(name, model, optimizer, batch):
    """(step seconds, forward+backward seconds, peak bytes above those live before, bytes forward
    left allocated)."""
    optimizer.zero_grad(set_to_none=True)
    with dropit.memory.measure("cpu") as memory:
        start = time.perf_counter()
        before = dropit.memory.live_bytes("cpu")
        loss = loss_of(name, model, batch)
        held = dropit.memory.live_bytes("cpu") - before
        loss.backward()
        backward_end = time.perf_counter()
        optimizer.step()
        end = time.perf_counter()
    return end - start, backward_end - start, memory.peak_bytes, held


def measure(name, rounds, warmup):
    make, make_batch, optimizer_kind, shape = MODELS[name]
    torch.manual_seed(0)
    dense = make()
    batch = make_batch()
    example = {"input_ids": batch[0]} if is_text(name) else batch[0]
    converted = copy.deepcopy(dense)
    report = dropit.convert(converted, gamma=GAMMA, example_input=example)
    checkpoint_model, block_count = checkpointed(copy.deepcopy(dense))
    models = {"dense": dense, "dropit": converted, "checkpoint": checkpoint_model}
    for model in models.values():
        model.train()
    optimizers = {v: optimizer_for(optimizer_kind, m) for v, m in models.items()}
    names = list(models)
    times = {v: [] for v in models}
    passes = {v: [] for v in models}
    peaks = {v: [] for v in models}
    helds = {v: [] for v in models}
    for r in range(warmup + rounds):
        for i in range(len(names)):
            v = names[(r + i) % len(names)]
            seconds, fwd_bwd, peak, held = step(name, models[v], optimizers[v], batch)
            if r >= warmup:
                times[v].append(seconds)
                passes[v].append(fwd_bwd)
                peaks[v].append(peak)
                helds[v].append(held)
        print(f"  {name} round {r + 1}/{warmup + rounds}: " +
              ", ".join(f"{v} {times[v][-1]:.2f} s" for v in names if r >= warmup), flush=True)
    result = {}
    for v in models:
        entry = summarise(times[v], peaks[v], helds[v], times["dense"], peaks["dense"],
                          helds["dense"])
        ratios = [a / b for a, b in zip(times[v], times["dense"])]
        entry["time_ratio_min"], entry["time_ratio_max"] = min(ratios), max(ratios)
        entry["fwd_bwd_time_ratio"] = statistics.median(
            a / b for a, b in zip(passes[v], passes["dense"]))
        entry["step_seconds"] = times[v]
        result[v] = entry
    parameters = sum(p.numel() for p in dense.parameters())
    return {"model": name, "shape": shape, "optimizer": optimizer_kind, "parameters": parameters,
            "converted_layers": len(report.converted), "checkpointed_blocks": block_count,
            "rounds": rounds, "warmup": warmup, "variants": result}


# --- all models: one process each -----------------------------------------------------------------

NAMES = {"resnet50": "ResNet-50", "vit_b_16": "ViT-B/16", "convnext_tiny": "ConvNeXt-T",
         "mobilenet_v3_large": "MobileNetV3-L", "timm_vit_s": "timm ViT-S/16", "gpt2": "GPT-2",
         "llama": "Llama", "bert": "BERT"}


def mib(n):
    return f"{n / 2**20:.0f} MiB"


def table(runs, machine, command, rounds, note):
    lines = [f"Training step on the CPU ({machine}); dropit gamma {GAMMA}; {rounds} interleaved "
             "rounds per model; time as the median of per-round ratios to dense (lowest–highest "
             "round in brackets), peak and held-after-forward at the allocator.", "",
             f"Command: `{command}`" + (f" {note}" if note else ""), "",
             "| model | size | optimizer | dense step / peak / held | dropit time vs dense | "
             f"dropit peak / held vs dense | ≤ {TARGET:.2f}× | checkpoint time vs dense | "
             "checkpoint peak / held vs dense |",
             "|---|---|---|---:|---:|---:|:---:|---:|---:|"]
    for run in runs:
        d, o, c = (run["variants"][v] for v in ("dense", "dropit", "checkpoint"))
        meets = "yes" if round(o["time_ratio"], 2) <= TARGET else "no"
        lines.append(
            f"| {NAMES.get(run['model'], run['model'])} | {run['shape']} | {run['optimizer']} | "
            f"{d['median_step_ms'] / 1000:.2f} s / {mib(d['peak_bytes'])} / "
            f"{mib(d['held_bytes'])} | "
            f"{o['time_ratio']:.2f}× ({o['time_ratio_min']:.2f}–{o['time_ratio_max']:.2f}) | "
            f"{o['peak_ratio']:.2f}× / {o['held_ratio']:.2f}× | {meets} | "
            f"{c['time_ratio']:.2f}× ({c['time_ratio_min']:.2f}–{c['time_ratio_max']:.2f}) | "
            f"{c['peak_ratio']:.2f}× / {c['held_ratio']:.2f}× |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=1, help="steps of each variant before timing")
    parser.add_argument("--model", choices=list(MODELS), help="measure one process's share")
    parser.add_argument("--json", help="where that share writes its result")
    parser.add_argument("--output-dir", default="")
    parser.add_argument("--label", default="", help="file name suffix, e.g. amd-epyc-2c")
    parser.add_argument("--note", default="", help="a line on the run's conditions, kept with it")
    args = parser.parse_args()
    if args.warmup < 1:
        parser.error("--warmup must be at least 1 (the first step allocates optimizer state)")

    if args.model:
        result = measure(args.model, args.rounds, args.warmup)
        write_json(result, args.json)
        return

    # Each process's share is kept until the table is written: an interrupted run resumes.
    runs, parts = [], []
    scratch = os.path.join(args.output_dir or ".", ".models-parts")
    os.makedirs(scratch, exist_ok=True)
    started = time.perf_counter()
    for name in args.models:
        part = os.path.join(scratch, f"{name}-{args.rounds}-{args.warmup}.json")
        if not os.path.exists(part):
            print("models:", name, flush=True)
            subprocess.run([sys.executable, __file__, "--model", name, "--rounds", str(args.rounds),
                            "--warmup", str(args.warmup), "--json", part], check=True)
        with open(part, encoding="utf-8") as f:
            runs.append(json.load(f))
        parts.append(part)

    machine = f"{cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}"
    command = shlex.join(["python3", "benchmarks/python/bench_models.py"] + sys.argv[1:])
    text = table(runs, machine, command, args.rounds, args.note)
    print(text, end="")
    print(f"({time.perf_counter() - started:.0f} s)")
    if args.output_dir:
        versions = {"torch": torch.__version__, "torchvision": torchvision.__version__}
        for package in ("timm", "transformers"):
            try:
                versions[package] = __import__(package).__version__
            except ImportError:
                pass
        save_results(args.output_dir, "models", args.label,
                     {"machine": machine, "command": command, "gamma": GAMMA, "target": TARGET,
                      "versions": versions, "note": args.note, "runs": runs}, text)
    for part in parts:
        os.remove(part)
    os.rmdir(scratch)


if __name__ == "__main__":
    main()
