#!/usr/bin/env python3
"""What ``dropit.plan_memory`` costs to plan: wall-clock seconds, the loss's forwards run alone and
its training steps (forward and backward), counted here from the loss's calls and the backward
passes through it, on a model of ``bench_frontier.py`` (same batch and loss), with the plan it made
(bytes held and the tools). One plan per model and budget, in this process; a JSON line each.

    python3 benchmarks/python/bench_plan_cost.py --models vit --budgets 0.5 0.3

To compare two versions of the package, run it with PYTHONPATH naming each; "reported" is what the
plan itself says it cost (none before the package reported it).
"""

import argparse
import json
import time

import torch

import dropit
from bench_frontier import Workload


def plan_cost(name: str, budget: float) -> dict:
    workload = Workload(name)
    model = workload.model
    model.train()
    # Counted here, whatever the package reports: the loss's calls, and the backward passes
    # through it.
    calls = {"loss": 0, "backward": 0}

    def count_backward(grad):
        calls["backward"] += 1

    def loss_fn():
        calls["loss"] += 1
        loss = workload.loss(model)
        loss.register_hook(count_backward)
        return loss

    start = time.perf_counter()
    plan = dropit.plan_memory(model, loss_fn, budget=budget)
    seconds = time.perf_counter() - start
    return {"model": name, "budget": budget, "seconds": seconds,
            "forwards_alone": calls["loss"] - calls["backward"], "steps": calls["backward"],
            "reported": [getattr(plan, "planning_forwards", None),
                         getattr(plan, "planning_steps", None)],
            "held_ratio": plan.held_ratio, "met": plan.met,
            "tools": [block.tool for block in plan.blocks]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["vit"])
    parser.add_argument("--budgets", nargs="+", type=float, default=[0.5, 0.3])
    args = parser.parse_args()
    torch.manual_seed(0)
    for name in args.models:
        for budget in args.budgets:
            print(json.dumps({"package": dropit.__file__, **plan_cost(name, budget)}), flush=True)


if __name__ == "__main__":
    main()
