"""Train a small GPT-style decoder on real English text, dense and with dropit (gamma = 0.9), from
the same weights and the same batches, for several seeds; compare validation loss and perplexity
(mean and spread over the seeds), what forward holds for backward, and step time.

The corpus is the World English Bible (public domain), as Debian's sword-text-web ships it (a SWORD
module, OSIS markup in zlib blocks, read here without the SWORD library): about 4.9 MB of UTF-8
prose and verse once the markup and footnotes are stripped. Tokens are its bytes (256 of them), so
nothing needs a tokenizer. Every tenth 64 KiB piece of the text is held out for validation.

    python3 examples/python/train_text.py --quick       # a tiny model, a few steps: CI's short mode
    python3 examples/python/train_text.py --out-dir examples/python/results-text
"""

import argparse
import copy
import csv
import functools
import math
import os
import re
import statistics
import struct
import subprocess
import sys
import time
import zlib
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

import dropit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fashion_mnist_harness as harness  # noqa: E402  (Run, measured_step, machine)

CORPUS_PACKAGE = "sword-text-web"
CORPUS_DIR = "/usr/share/sword/modules/texts/ztext/engWEB2015eb"
VOCAB = 256  # byte-level tokens


# --------------------------------------------------------------------------------------------------
# The corpus


def _verses(prefix: str):
    """The entries of one testament of a SWORD zText module: ``.bzs`` lists the zlib blocks
    (offset, size, uncompressed size), ``.bzv`` every verse (block, offset, size), in canon
    order."""
    with open(prefix + ".bzs", "rb") as f:
        index = f.read()
    with open(prefix + ".bzz", "rb") as f:
        data = f.read()
    blocks = [zlib.decompress(data[offset:offset + size])
              for offset, size, _ in struct.iter_unpack("<III", index)]
    with open(prefix + ".bzv", "rb") as f:
        for block, start, size in struct.iter_unpack("<IIH", f.read()):
            if size:
                yield blocks[block][start:start + size].decode("utf-8")


_NOTE = re.compile(r"<note\b.*?</note>", re.S)  # footnotes and cross references
_BREAK = re.compile(r"<(?:div|l|lg|chapter)\b[^>]*\beID=[^>]*>|<lb\b[^>]*>|</?title\b[^>]*>")
_TAG = re.compile(r"<[^>]*>")


@functools.lru_cache(maxsize=1)
def load_corpus(corpus_dir: str = CORPUS_DIR) -> str:
    """The World English Bible as plain text: the OSIS markup and footnotes dropped, paragraphs,
    poetry lines and headings on lines of their own (about a second and a half; kept)."""
    if not os.path.isfile(os.path.join(corpus_dir, "ot.bzz")):
        raise SystemExit(f"the text corpus is not at {corpus_dir}: install Debian's "
                         f"{CORPUS_PACKAGE} (scripts/install-deps does) or pass --corpus-dir")
    raw = "".join(_verses(os.path.join(corpus_dir, "ot"))) + \
        "".join(_verses(os.path.join(corpus_dir, "nt")))
    # A footnote between two words stood for the space; four words in the source lack theirs.
    raw = _NOTE.sub(" ", raw).replace("</w><w", "</w> <w")
    text = _TAG.sub("", _BREAK.sub("\n", raw))
    text = re.sub(r"[ \t]+", " ", text)
    text = re.sub(r" *\n *", "\n", text)
    text = re.sub(r" ([,.;:!?’”)])", r"\1", text)  # a space left where a footnote was
    return re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"


def split(text: str, piece: int = 1 << 16, every: int = 10):
    """The text's UTF-8 bytes as two uint8 tensors: training, and validation (every ``every``-th
    piece of ``piece`` bytes, so that it samples the whole corpus)."""
    data = torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8)
    pieces = list(torch.split(data, piece))
    held_out = [p for i, p in enumerate(pieces) if i % every == every - 1]
    kept = [p for i, p in enumerate(pieces) if i % every != every - 1]
    return torch.cat(kept), torch.cat(held_out)


def batches(train: torch.Tensor, steps: int, batch: int, context: int, seed: int):
    """``steps`` batches of (inputs, next-byte targets) [batch, context], int64, from random offsets
    drawn by a generator of their own: the same seed gives the same batches."""
    generator = torch.Generator().manual_seed(seed)
    span = torch.arange(context + 1)
    for _ in range(steps):
        starts = torch.randint(len(train) - context - 1, (batch, 1), generator=generator)
        window = train[starts + span].long()
        yield window[:, :-1], window[:, 1:]


def validation_windows(val: torch.Tensor, count: int, context: int) -> torch.Tensor:
    """``count`` windows of ``context`` + 1 bytes spread evenly over the validation split."""
    starts = torch.linspace(0, len(val) - context - 1, count).long().unsqueeze(1)
    return val[starts + torch.arange(context + 1)].long()


# --------------------------------------------------------------------------------------------------
# The model: a GPT-style decoder, pre-LayerNorm blocks of nn.Linear layers


class Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.out = nn.Linear(4 * width, width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, c // self.heads).permute(
            2, 0, 3, 1, 4)
        attention = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attention.transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.norm2(x))))


class Decoder(nn.Module):
    """Byte embeddings and learned positions, ``layers`` blocks, a final LayerNorm and a linear
    head over the 256 bytes."""

    def __init__(self, width: int = 256, layers: int = 4, heads: int = 4, context: int = 128):
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, width)
        self.positions = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, VOCAB, bias=False)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, tokens):
        x = self.tokens(tokens) + self.positions(torch.arange(tokens.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def lm_loss(logits, targets):
    """Mean cross entropy of the next byte, in nats."""
    return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def evaluate(model, windows: torch.Tensor, batch: int = 64) -> float:
    """Mean validation loss over ``windows``, in nats per byte."""
    model.eval()
    total = 0.0
    with torch.no_grad():
        for i in range(0, len(windows), batch):
            chunk = windows[i:i + batch]
            total += lm_loss(model(chunk[:, :-1]), chunk[:, 1:]).item() * len(chunk)
    model.train()
    return total / len(windows)


# --------------------------------------------------------------------------------------------------
# Training, dense and dropit side by side


@dataclass
class TextRun(harness.Run):
    """One model's training (harness.Run's per-step loss, time and memory) and its validation
    loss at each evaluation."""
    seed: int = 0
    val_steps: List[int] = field(default_factory=list)
    val_losses: List[float] = field(default_factory=list)

    @property
    def val_loss(self) -> float:
        return self.val_losses[-1]


def schedule(step: int, steps: int, warmup: int) -> float:
    """The learning rate's factor: linear warm-up, then a cosine down to a tenth."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


def train_pair(models: Dict[str, nn.Module], train: torch.Tensor, windows: torch.Tensor, args,
               seed: int) -> List[TextRun]:
    """AdamW with warm-up and cosine decay. The models take their steps in turn on the same
    batches, so that both see the same data and any slowdown of the machine hits both alike."""
    runs, optimizers, schedules = [], [], []
    for name, model in models.items():
        runs.append(TextRun(name, seed=seed))
        optimizers.append(torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95),
                                            weight_decay=args.weight_decay))
        schedules.append(torch.optim.lr_scheduler.LambdaLR(
            optimizers[-1], lambda step: schedule(step, args.steps, args.warmup)))
        model.train()

    def validate(step):
        for run, model in zip(runs, models.values()):
            run.val_steps.append(step)
            run.val_losses.append(evaluate(model, windows))

    validate(0)
    start = time.perf_counter()
    for step, (inputs, targets) in enumerate(
            batches(train, args.steps, args.batch, args.context, seed), 1):
        for run, model, optimizer, scheduler in zip(runs, models.values(), optimizers,
                                                    schedules):
            harness.measured_step(run, model, optimizer, inputs, targets, lm_loss)
            scheduler.step()
        if step % args.eval_every == 0 or step == args.steps:
            validate(step)
            print(f"seed {seed} step {step}/{args.steps} ({time.perf_counter() - start:.0f} s): "
                  + ", ".join(f"{r.name} train {r.losses[-1]:.3f} val {r.val_loss:.3f}"
                              for r in runs), flush=True)
    return runs


# --------------------------------------------------------------------------------------------------
# The report


def spread(values: Sequence[float]) -> str:
    """mean ± sample standard deviation, then [min, max]."""
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.4f} ± {sd:.4f} [{min(values):.4f}, {max(values):.4f}]"


def write_results(pairs: List[List[TextRun]], out_dir: str, header: str = "") -> str:
    """results.md (``header``, then the tables), results.csv (one row per seed and run),
    curves.csv (every step's training loss and every evaluation) and curves.png when matplotlib is
    there; returns the tables."""
    os.makedirs(out_dir, exist_ok=True)
    names = [r.name for r in pairs[0]]
    by_name = {name: [pair[i] for pair in pairs] for i, name in enumerate(names)}
    base = by_name[names[0]]

    with open(os.path.join(out_dir, "results.csv"), "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["seed", "run", "val_loss_nats_per_byte", "val_perplexity",
                         "val_bits_per_byte", "held_after_forward_bytes", "peak_step_bytes",
                         "median_step_ms", "step_vs_dense"])
        for pair in pairs:
            for r in pair:
                dense = pair[0]
                ratio = statistics.median(a / b for a, b in zip(r.step_seconds, dense.step_seconds))
                writer.writerow([r.seed, r.name, f"{r.val_loss:.5f}", f"{math.exp(r.val_loss):.4f}",
                                 f"{r.val_loss / math.log(2):.5f}", r.held_bytes, r.peak_bytes,
                                 f"{1000 * statistics.median(r.step_seconds):.1f}",
                                 f"{ratio:.3f}"])
    with open(os.path.join(out_dir, "curves.csv"), "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["seed", "run", "step", "train_loss", "val_loss"])
        for pair in pairs:
            for r in pair:
                val = dict(zip(r.val_steps, r.val_losses))
                for step in range(len(r.losses) + 1):
                    train_loss = f"{r.losses[step - 1]:.5f}" if step else ""
                    val_loss = f"{val[step]:.5f}" if step in val else ""
                    writer.writerow([r.seed, r.name, step, train_loss, val_loss])
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.6))
        for (name, runs), color in zip(by_name.items(), ("tab:blue", "tab:orange")):
            for i, r in enumerate(runs):
                ax.plot(r.val_steps, r.val_losses, marker="o", markersize=3, color=color,
                        alpha=0.8, label=name if i == 0 else None)
        ax.set(xlabel="step", ylabel="validation loss (nats per byte)", ylim=(None, 3.5),
               title=f"{len(pairs)} seeds, one line each")
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "curves.png"), dpi=80)
        plt.close(fig)
    except ImportError:
        print("matplotlib is not installed: no plot")

    seeds = [pair[0].seed for pair in pairs]
    lines = ["Validation loss per seed (nats per byte; perplexity per byte in brackets):", "",
             "| seed | " + " | ".join(names) + " | " +
             " | ".join(f"{n} − {names[0]}" for n in names[1:]) + " |",
             "|---:|" + "---:|" * (2 * len(names) - 1)]
    for seed, pair in zip(seeds, pairs):
        lines.append(f"| {seed} | " +
                     " | ".join(f"{r.val_loss:.4f} ({math.exp(r.val_loss):.3f})" for r in pair) +
                     " | " + " | ".join(f"{r.val_loss - pair[0].val_loss:+.4f}" for r in pair[1:]) +
                     " |")
    lines += ["", f"Over the {len(pairs)} seeds: mean ± sample standard deviation [min, max].", "",
              "| run | validation loss | perplexity | bits per byte | held after forward | "
              "vs dense | peak step memory | vs dense | median step | step vs dense |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, runs in by_name.items():
        losses = [r.val_loss for r in runs]
        held = max(r.held_bytes for r in runs)
        peak = max(r.peak_bytes for r in runs)
        ratio = statistics.median(a / b for r, d in zip(runs, base)
                                  for a, b in zip(r.step_seconds, d.step_seconds))
        lines.append(
            f"| {name} | {spread(losses)} | {spread([math.exp(v) for v in losses])} | "
            f"{spread([v / math.log(2) for v in losses])} | "
            f"{held / 2**20:.1f} MiB | {held / max(r.held_bytes for r in base):.2f}x | "
            f"{peak / 2**20:.1f} MiB | {peak / max(r.peak_bytes for r in base):.2f}x | "
            f"{1000 * statistics.median(s for r in runs for s in r.step_seconds):.1f} ms | "
            f"{ratio:.2f}x |")
    for name in names[1:]:
        gaps = [r.val_loss - d.val_loss for r, d in zip(by_name[name], base)]
        lines.append(f"\n{name} − {names[0]}, validation loss, paired by seed: {spread(gaps)} "
                     "nats per byte.")
    lines += ["", "Memory is measured at the allocator, above what was live when the step began "
              "(the weights, the batch, the optimizer's state). Held after forward: what forward "
              "leaves allocated for backward, the activation memory that dropit compresses (the "
              "highest over all steps and seeds). Peak step memory: the highest over the steps "
              "after each run's first (which also allocates AdamW's state). Step time: the "
              "median over all steps and seeds; step vs dense: the median of the per-step ratios "
              "(the two runs take their steps in turn)."]
    table = "\n".join(lines)
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write((header + "\n\n" if header else "") + table + "\n")
    return table


def _commit() -> Optional[str]:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True,
                              cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="CI's short mode: a tiny model (width 64, 2 layers, context 32), 40 "
                        "steps, 2 seeds, 1 thread")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=24)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--lr", type=float, default=2e-3, help="AdamW's highest learning rate")
    parser.add_argument("--warmup", type=int, default=30, help="steps of linear warm-up")
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--gamma", type=float, default=0.9)
    parser.add_argument("--recompute", action="store_true",
                        help="let the layers that read a LayerNorm output recompute it exactly "
                        "(convert's recompute=True); by default every converted layer keeps its "
                        "largest 1 - gamma, as DropIT does")
    parser.add_argument("--eval-windows", type=int, default=512,
                        help="validation windows of context + 1 bytes")
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--corpus-dir", default=CORPUS_DIR)
    parser.add_argument("--out-dir", default="text_results")
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.steps, args.batch, args.context = args.seeds[:2], 40, 8, 32
        args.width, args.layers, args.heads, args.warmup = 64, 2, 2, 5
        args.eval_windows, args.eval_every, args.lr = 64, 20, 3e-3
        args.threads = args.threads or 1
    return args


def main(argv=None) -> List[List[TextRun]]:
    args = parse_args(argv)
    threads = torch.get_num_threads()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    try:
        return experiment(args, argv)
    finally:
        torch.set_num_threads(threads)


def experiment(args, argv=None) -> List[List[TextRun]]:
    commit = _commit()
    text = load_corpus(args.corpus_dir)
    train, val = split(text)
    windows = validation_windows(val, args.eval_windows, args.context)
    print(f"corpus: {len(text.encode('utf-8'))} bytes; {len(train)} for training, {len(val)} "
          f"held out ({args.eval_windows} windows of {args.context + 1} bytes evaluated)")

    pairs = []
    for seed in args.seeds:
        torch.manual_seed(seed)
        dense = Decoder(args.width, args.layers, args.heads, args.context)
        model = copy.deepcopy(dense)
        # The one dropit line: every nn.Linear now caches the largest 10 % of its input.
        example, _ = next(batches(train, 1, args.batch, args.context, seed))
        report = dropit.convert(model, gamma=args.gamma, example_input=example,
                                recompute=args.recompute)
        if seed == args.seeds[0]:
            print(report)
        pairs.append(train_pair({"dense": dense, "dropit": model}, train, windows, args, seed))

    parameters = sum(p.numel() for p in dense.parameters())
    command = "python3 examples/python/train_text.py" + "".join(f" {a}" for a in (argv or
                                                                                  sys.argv[1:]))
    header = "\n".join([
        f"Command: `{command}`; torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{harness.machine()}" + (f"; dropit at commit {commit}." if commit else "."),
        "",
        f"Corpus: the World English Bible from Debian's {CORPUS_PACKAGE} "
        f"({CORPUS_DIR}), {len(text.encode('utf-8'))} bytes of text; byte-level tokens; every "
        f"tenth 64 KiB piece held out ({len(val)} bytes), of which {args.eval_windows} evenly "
        f"spaced windows of {args.context} predicted bytes are evaluated.",
        "",
        f"Model: GPT-style decoder, {args.layers} pre-LayerNorm blocks, width {args.width}, "
        f"{args.heads} heads, context {args.context}, {parameters} parameters. Training: "
        f"{args.steps} steps of {args.batch} x {args.context} bytes, AdamW (lr {args.lr}, betas "
        f"0.9/0.95, weight decay {args.weight_decay}), {args.warmup} warm-up steps then cosine to "
        f"a tenth. dropit: `dropit.convert(model, gamma={args.gamma}, "
        f"recompute={args.recompute})` on a copy of the dense "
        f"model's initial weights; both take their steps in turn on the same batches. Seeds: "
        f"{', '.join(map(str, args.seeds))} (each sets the initial weights and the batch order).",
    ])
    print(write_results(pairs, args.out_dir, header))
    print(f"(results.md, results.csv, curves.csv and curves.png in {args.out_dir})")
    return pairs


if __name__ == "__main__":
    main()
