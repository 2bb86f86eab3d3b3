"""The memory planner: for each block of a model one tool — keep it dense, ``convert`` it (exact
recomputation where cheap producers allow, a DropIT cache for the rest), recompute (converted, and
recomputing through layers: ``convert``'s recompute_layers) or checkpoint it — so that the model
holds no more than a budget of its dense activation bytes after forward, at the least
measured step time. The search is the LibTorch planner's (``dropit::torch::plan_memory``), shared
through the extension; the measurements are made here, on the caller's own training step.

    plan = dropit.plan_memory(model, lambda: F.cross_entropy(model(x), y), budget=0.5)
    print(plan)   # every block's tool, the bytes it frees and the time it adds

Bytes are measured at the allocator (``dropit.memory``) with the whole model in each configuration
tried; times are measured too: each block's forward (what a checkpoint repeats) and the converted
model's step against the dense one, interleaved.
"""

import copy
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Sequence, Tuple

import torch
from torch import nn

from . import _C, memory
from .convert import convert
from .nn import Checkpoint

__all__ = ["BlockPlan", "MemoryPlan", "plan_memory"]

# The search's tools, in its order: keep, convert, recompute (convert with recompute_layers) and
# checkpoint.
TOOLS = ("keep", "convert", "recompute", "checkpoint")


@dataclass
class BlockPlan:
    name: str
    tool: str = "keep"
    # Per tool, with this block alone changed: bytes held after forward it frees (measured) and
    # seconds it adds to a step (checkpoint: the block's forward, timed; convert: its share, by
    # forward time, of what converting every block adds; recompute: that, and its share of what
    # recomputing through layers adds to converting). Tools that do not apply are absent.
    freed_bytes: Dict[str, int] = field(default_factory=dict)
    added_seconds: Dict[str, float] = field(default_factory=dict)


@dataclass
class MemoryPlan:
    budget: float
    dense_held: int = 0  # bytes held after forward (the loss excluded), dense
    planned_held: int = 0  # ... and as planned
    dense_seconds: float = 0.0  # median step (forward and backward), dense
    planned_seconds: float = 0.0  # ... and as planned, timed interleaved with dense
    met: bool = False  # whether the planned model holds no more than the budget
    blocks: List[BlockPlan] = field(default_factory=list)
    # What planning cost: the loss's forwards run alone (bytes of each configuration tried, once;
    # block times), its training steps (forward and backward: one to warm up, the rest timed), and
    # the wall-clock seconds of it all.
    planning_forwards: int = 0
    planning_steps: int = 0
    planning_seconds: float = 0.0

    @property
    def held_ratio(self) -> float:
        return self.planned_held / self.dense_held if self.dense_held > 0 else 0.0

    @property
    def time_ratio(self) -> float:
        return self.planned_seconds / self.dense_seconds if self.dense_seconds > 0 else 0.0

    def __str__(self) -> str:
        lines = [f"memory plan for budget {self.budget:.3f} of dense: holds {self.held_ratio:.3f}x "
                 f"({self.planned_held} of {self.dense_held} B) at {self.time_ratio:.3f}x step time"
                 + ("" if self.met else " -- budget NOT met: every block at its most frugal tool "
                    "holds more")
                 + f"; planned in {self.planning_seconds:.1f} s ({self.planning_forwards} "
                 f"forwards, {self.planning_steps} steps)"]
        for block in self.blocks:
            line = f"  {block.name}: {block.tool}"
            if block.tool != "keep":
                line += (f" (alone: frees {block.freed_bytes[block.tool]} B, adds "
                         f"{1e3 * block.added_seconds[block.tool]:.1f} ms)")
            lines.append(line)
        return "\n".join(lines)


_CONTAINERS = (nn.Sequential, nn.ModuleList)


def _containers(root: nn.Module, names: Sequence[str]) -> List[Tuple[str, nn.Module]]:
    """The containers whose children are the blocks: those named, else the root if it is a
    Sequential, else the outermost Sequentials and ModuleLists inside it."""
    if names:
        found = []
        for name in names:
            try:
                container = root.get_submodule(name)
            except AttributeError:
                raise ValueError(f"plan_memory: the model has no submodule '{name}' (containers "
                                 "names the Sequentials whose children are the blocks)") from None
            if not isinstance(container, _CONTAINERS):
                raise ValueError(f"plan_memory: '{name}' is a {type(container).__name__}; expected "
                                 "an nn.Sequential or nn.ModuleList whose children are the blocks")
            found.append((name, container))
        return found
    if isinstance(root, _CONTAINERS):
        return [("", root)]
    found = []
    for name, module in root.named_modules():
        if (module is not root and isinstance(module, _CONTAINERS)
                and not any(name.startswith(outer + ".") for outer, _ in found)):
            found.append((name, module))
    return found


class _Block:
    """One slot of a container and the module each tool puts there."""

    def __init__(self, container: nn.Module, key: str, qualified: str):
        self.container, self.key, self.name = container, key, qualified
        self.original = container._modules[key]
        self.modules = {"keep": self.original}

    def install(self, tool: str):
        self.container._modules[self.key] = self.modules[tool]


def _synchronize(device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _Bench:
    """The caller's training step on the model in any configuration of tools."""

    def __init__(self, model: nn.Module, blocks: List[_Block], loss_fn: Callable,
                 device: torch.device, rounds: int):
        self.model, self.blocks, self.loss_fn = model, blocks, loss_fn
        self.device, self.rounds = device, rounds
        self.held_bytes: Dict[Tuple[str, ...], int] = {}
        self.loss_calls = self.steps = 0  # a step is one of the calls, with its backward

    def apply(self, tools: Sequence[str]):
        for block, tool in zip(self.blocks, tools):
            block.install(tool)

    @property
    def forwards(self) -> int:
        """The loss's forwards run alone (bytes, block times)."""
        return self.loss_calls - self.steps

    def loss(self) -> torch.Tensor:
        self.loss_calls += 1
        loss = self.loss_fn()
        if not isinstance(loss, torch.Tensor) or not loss.requires_grad:
            what = ("a tensor that requires no gradient" if isinstance(loss, torch.Tensor)
                    else f"a {type(loss).__name__}")
            raise ValueError(f"plan_memory: the loss function returned {what}; expected the "
                             "training loss of the model")
        if loss.numel() != 1:
            raise ValueError(f"plan_memory: the loss has {loss.numel()} elements; expected a "
                             "scalar")
        return loss

    def held(self, tools: Sequence[str]) -> int:
        """Bytes the graph holds after the loss's forward (the loss itself excluded), measured once
        per configuration (the allocator's count does not vary between forwards). The graph is
        dropped unused: a backward would free nothing more and cost about twice the forward."""
        key = tuple(tools)
        if key not in self.held_bytes:
            self.apply(tools)
            self.model.zero_grad(set_to_none=True)
            with memory.measure(self.device) as measured:
                loss = self.loss()
            self.held_bytes[key] = measured.retained_bytes - loss.element_size() * loss.numel()
        return self.held_bytes[key]

    def warm_up(self, tools: Sequence[str]):
        """One training step of ``tools``, untimed: allocations and kernels' first-call set-up."""
        self.apply(tools)
        self.step_seconds()

    def forward_seconds(self) -> List[float]:
        """Median seconds of each block's forward in the dense model, during the loss's forward."""
        self.apply(["keep"] * len(self.blocks))
        started, seconds = {}, [[] for _ in self.blocks]
        handles = []
        for b, block in enumerate(self.blocks):
            def before(module, args, b=b):
                _synchronize(self.device)
                started[b] = time.perf_counter()

            def after(module, args, output, b=b):
                _synchronize(self.device)
                seconds[b][-1] += time.perf_counter() - started[b]

            handles += [block.original.register_forward_pre_hook(before),
                        block.original.register_forward_hook(after)]
        try:
            for _ in range(self.rounds):
                for per_block in seconds:
                    per_block.append(0.0)
                self.model.zero_grad(set_to_none=True)
                self.loss()  # the graph is dropped unused
        finally:
            for handle in handles:
                handle.remove()
        return [statistics.median(per_block) for per_block in seconds]

    def step_seconds(self) -> float:
        self.model.zero_grad(set_to_none=True)
        _synchronize(self.device)
        start = time.perf_counter()
        self.loss().backward()
        self.steps += 1
        _synchronize(self.device)
        return time.perf_counter() - start

    def time(self, tools: Sequence[str]) -> Tuple[float, float]:
        """Median seconds of the dense step and median ratio of ``tools``'s step to it, timed in
        alternation."""
        dense, ratios = [], []
        for _ in range(self.rounds):
            self.apply(["keep"] * len(self.blocks))
            base = self.step_seconds()
            self.apply(tools)
            ratios.append(self.step_seconds() / base)
            dense.append(base)
        return statistics.median(dense), statistics.median(ratios)


def plan_memory(model: nn.Module, loss_fn: Callable[[], torch.Tensor], budget: float = 0.5, *,
                containers: Iterable[str] = (), gamma: float = 0.9, timing_rounds: int = 5,
                **convert_options) -> MemoryPlan:
    """Plans and applies, in place, one tool per block (keep, convert, recompute, checkpoint) so
    that ``model`` holds no more than ``budget`` (in (0, 1]) of its dense activation bytes after
    forward, at the least measured step time. ``loss_fn()`` runs one forward of the model on a
    representative batch and returns the scalar loss; the planner calls it once for each
    configuration of tools it measures (up to a few hundred forwards, whose graphs it drops unused)
    and steps (forward and backward) up to 1 + 6 × ``timing_rounds`` times; the plan reports both.

    containers: qualified names of the nn.Sequential / nn.ModuleList modules whose children are the
        blocks. Empty: the model itself if it is one, else the outermost ones inside it.
    gamma, convert_options: how a block the planner converts is converted (:func:`dropit.convert`'s
        arguments, names counted from the model; ``skip_first`` defaults to False here).
    timing_rounds: timed repetitions of each block's forward and of the steps compared.

    Converted blocks share the model's parameters; a checkpointed block is wrapped in
    :class:`dropit.nn.Checkpoint`, whose state dict is the block's own. The blocks' buffers
    (BatchNorm's running statistics) are restored afterwards and the parameters' gradients cleared;
    random generators advance. Should ``loss_fn`` raise, the model is left as it came.
    """
    if not 0.0 < budget <= 1.0:
        raise ValueError(f"plan_memory: budget {budget} is outside (0, 1]; it is the fraction of "
                         "the dense model's activation bytes the model may hold")
    if timing_rounds < 1:
        raise ValueError(f"plan_memory: timing_rounds {timing_rounds} must be at least 1")
    if not callable(loss_fn):
        raise ValueError(f"plan_memory: loss_fn is a {type(loss_fn).__name__}; expected a function "
                         "that runs the model and returns its scalar loss")
    parameters = list(model.parameters())
    if not parameters:
        raise ValueError(f"plan_memory: {type(model).__name__} has no parameters to train")
    if not model.training:
        raise ValueError(f"plan_memory: {type(model).__name__} is in eval mode; plan in training "
                         "mode, where activations are kept")
    if isinstance(containers, str):
        containers = [containers]

    planning_start = time.perf_counter()
    blocks = []
    for prefix, container in _containers(model, list(containers)):
        for key in list(container._modules):
            blocks.append(_Block(container, key, f"{prefix}.{key}" if prefix else key))
    if not blocks:
        raise ValueError("plan_memory: the model holds no nn.Sequential or nn.ModuleList whose "
                         "children could be planned as blocks; name them with containers=")

    # The model converted once, as a twin sharing its parameters and buffers, so that exclude
    # patterns count from the root as convert counts them; each block's converted form is the
    # twin's module at the block's place. (deepcopy fills the memo it is given: each copy gets its
    # own, or the second would be the first.)
    shared = {id(t): t for t in list(model.parameters()) + list(model.buffers())}
    try:
        twin = copy.deepcopy(model, memo=dict(shared))
    except Exception as error:
        raise ValueError(f"plan_memory: {type(model).__name__} cannot be copied ({error}); the "
                         "planner converts a copy of the model's modules that shares its "
                         "parameters, so plan the model before wrapping it") from error
    options = {"skip_first": False, **convert_options}
    report = convert(twin, gamma=gamma, **{**options, "recompute_layers": False})
    # A second twin recomputing through layers too: the recompute tool.
    deep_twin = copy.deepcopy(model, memo=dict(shared))
    convert(deep_twin, gamma=gamma, **{**options, "recompute_layers": True})
    converted = [layer.name for layer in report.converted]
    plans = []
    for block in blocks:
        if any(name == block.name or name.startswith(block.name + ".") for name in converted):
            block.modules["convert"] = twin.get_submodule(block.name)
            block.modules["recompute"] = deep_twin.get_submodule(block.name)
        block.modules["checkpoint"] = Checkpoint(block.original)
        plans.append(BlockPlan(block.name))

    buffers = [(buffer, buffer.detach().clone()) for buffer in model.buffers()]
    bench = _Bench(model, blocks, loss_fn, parameters[0].device, timing_rounds)
    plan = MemoryPlan(budget)
    dense_tools = ["keep"] * len(blocks)
    try:
        bench.warm_up(dense_tools)
        plan.dense_held = bench.held(dense_tools)
        forward = bench.forward_seconds()
        for b, block in enumerate(blocks):
            freed = plans[b].freed_bytes
            for tool in ("convert", "recompute", "checkpoint"):
                if tool in block.modules:
                    alone = list(dense_tools)
                    alone[b] = tool
                    freed[tool] = plan.dense_held - bench.held(alone)
            # Recomputing through layers applies where it frees more than converting.
            if "recompute" in freed and freed["recompute"] <= freed["convert"]:
                del block.modules["recompute"], freed["recompute"]
        convertible = [b for b, block in enumerate(blocks) if "convert" in block.modules]
        recomputable = [b for b, block in enumerate(blocks) if "recompute" in block.modules]
        convert_all = ["convert" if b in convertible else "keep" for b in range(len(blocks))]
        plan.dense_seconds, convert_ratio = bench.time(convert_all)
        convert_seconds = max(0.0, convert_ratio - 1.0) * plan.dense_seconds
        convertible_forward = sum(forward[b] for b in convertible)
        recomputable_forward = sum(forward[b] for b in recomputable)
        recompute_seconds = 0.0
        if recomputable_forward > 0:
            recompute_all = ["recompute" if b in recomputable else tool
                             for b, tool in enumerate(convert_all)]
            recompute_seconds = (max(0.0, bench.time(recompute_all)[1] - convert_ratio)
                                 * plan.dense_seconds)
        for b, block in enumerate(blocks):
            costs = plans[b]
            costs.added_seconds = {"keep": 0.0, "checkpoint": forward[b]}
            if b in convertible:
                costs.added_seconds["convert"] = (convert_seconds * forward[b] / convertible_forward
                                                  if convertible_forward > 0 else 0.0)
            if b in recomputable:
                costs.added_seconds["recompute"] = (
                    costs.added_seconds["convert"]
                    + recompute_seconds * forward[b] / recomputable_forward)

        codes, plan.met = _C.plan_search(
            [[tool in costs.added_seconds for tool in TOOLS] for costs in plans],
            [[costs.added_seconds.get(tool, 0.0) for tool in TOOLS] for costs in plans],
            plan.dense_held, plan.dense_seconds, budget,
            lambda tools: bench.held([TOOLS[code] for code in tools]))
        tools = [TOOLS[code] for code in codes]
        for costs, tool in zip(plans, tools):
            costs.tool = tool
        plan.planned_held = bench.held(tools)
        plan.planned_seconds = bench.time(tools)[1] * plan.dense_seconds
        bench.apply(tools)
    except BaseException:
        bench.apply(dense_tools)
        raise
    finally:
        with torch.no_grad():
            for buffer, saved in buffers:
                buffer.copy_(saved)
        model.zero_grad(set_to_none=True)
    plan.blocks = plans
    plan.planning_forwards, plan.planning_steps = bench.forwards, bench.steps
    plan.planning_seconds = time.perf_counter() - planning_start
    return plan
