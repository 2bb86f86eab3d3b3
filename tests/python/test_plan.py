"""dropit.plan_memory: the model it leaves holds no more than the budget (measured here at the
allocator, apart from the planner's own numbers), trains to the dense gradients wherever a block is
kept or checkpointed, saves and loads as the dense model, and bad arguments name the value. The
shared search (dropit._C.plan_search) is checked against an exhaustive search on small cases."""

import copy
import itertools
import threading

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dropit
from dropit import _C
from dropit.plan import TOOLS


def _block(channels: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1), nn.BatchNorm2d(channels),
                         nn.ReLU(), nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU())


def _model() -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
                         nn.Sequential(*[_block(8) for _ in range(4)]),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))


def _batch(device):
    return (torch.randn(4, 3, 16, 16, device=device), torch.randint(0, 10, (4,), device=device))


def _held(model, x, y, device) -> int:
    model.zero_grad(set_to_none=True)
    with dropit.memory.measure(device) as measured:
        loss = F.cross_entropy(model(x), y)
    loss.backward()
    return measured.retained_bytes - loss.element_size()


def _gradients(model, x, y):
    model.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()
    # A checkpointed block's parameters are named through its wrapper's "block".
    return {name.replace(".block.", "."): p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("budget", [0.6, 0.4])
def test_plan_meets_its_budget_and_trains_as_dense_where_exact(device, budget):
    model = _model().to(device)
    x, y = _batch(device)
    dense = copy.deepcopy(model)
    dense_held = _held(dense, x, y, device)
    dense_state = copy.deepcopy(model.state_dict())

    plan = dropit.plan_memory(model, lambda: F.cross_entropy(model(x), y), budget=budget,
                              containers=["2"], timing_rounds=2)

    # Planning restored the buffers (BatchNorm's running statistics) and left no gradients.
    for key, value in model.state_dict().items():
        assert torch.equal(value, dense_state[key]), key
    assert all(p.grad is None for p in model.parameters())
    assert plan.met, str(plan)
    assert [block.name for block in plan.blocks] == [f"2.{b}" for b in range(4)]
    assert any(block.tool != "keep" for block in plan.blocks)
    held = _held(model, x, y, device)
    assert held <= budget * dense_held, (held, dense_held, str(plan))
    assert "memory plan for budget" in str(plan)

    # Kept and checkpointed blocks, and everything outside the blocks, get dense gradients: the
    # input gradient of a converted layer is exact, only its own weight gradient is approximate.
    want, got = _gradients(dense, x, y), _gradients(model, x, y)
    exact = [name for name in want if not any(
        name.startswith(block.name + ".") for block in plan.blocks
        if block.tool in ("convert", "recompute"))]
    assert len(exact) >= 4
    for name in exact:
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-5, msg=name)


def test_plan_offers_recompute_where_a_batch_norm_follows_a_recomputing_convolution():
    # Blocks conv -> BatchNorm -> ReLU -> conv -> BatchNorm -> ReLU: converted, the second
    # convolution recomputes its input; recomputing through it, the second BatchNorm keeps none of
    # its input either.
    def block():
        return nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8),
                             nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1, bias=False),
                             nn.BatchNorm2d(8), nn.ReLU())

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
                          nn.Sequential(block(), block(), block()), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(8, 10))
    x, y = _batch("cpu")
    dense_held = _held(copy.deepcopy(model), x, y, "cpu")
    plan = dropit.plan_memory(model, lambda: F.cross_entropy(model(x), y), budget=0.4,
                              containers=["2"], timing_rounds=1)
    for block_plan in plan.blocks:
        assert block_plan.freed_bytes["recompute"] > block_plan.freed_bytes["convert"], str(plan)
        assert "recompute" in block_plan.added_seconds
    assert plan.met, str(plan)
    assert _held(model, x, y, "cpu") <= 0.4 * dense_held


def test_budget_one_keeps_every_block():
    model = _model()
    x, y = _batch("cpu")
    plan = dropit.plan_memory(model, lambda: F.cross_entropy(model(x), y), budget=1.0,
                              containers=["2"], timing_rounds=1)
    assert plan.met
    assert [block.tool for block in plan.blocks] == ["keep"] * 4
    assert all(type(m) is nn.Sequential for m in model[2])


def test_plan_measures_bytes_by_forwards_alone_and_reports_its_cost():
    model = _model()
    x, y = _batch("cpu")
    calls = {"forwards": 0, "backwards": 0}

    def loss_fn():
        calls["forwards"] += 1
        loss = F.cross_entropy(model(x), y)
        loss.register_hook(lambda grad: calls.__setitem__("backwards", calls["backwards"] + 1))
        return loss

    def plan_at(budget):
        calls.update(forwards=0, backwards=0)
        plan = dropit.plan_memory(model, loss_fn, budget=budget, containers=["2"],
                                  timing_rounds=2)
        assert plan.planning_steps == calls["backwards"]
        assert plan.planning_forwards == calls["forwards"] - calls["backwards"]
        assert plan.planning_seconds > 0
        assert f"{plan.planning_forwards} forwards, {plan.planning_steps} steps" in str(plan)
        return plan

    loose, tight = plan_at(1.0), plan_at(0.4)
    # A tighter budget tries more configurations, each measured by a forward alone; the steps
    # (forward and backward) are the timing's only: one to warm up, two a round of each comparison.
    assert tight.planning_forwards > loose.planning_forwards
    assert tight.planning_steps == loose.planning_steps <= 1 + 6 * 2


def test_default_blocks_are_the_outermost_sequentials():
    model = nn.Module()
    model.stem = nn.Linear(6, 6)
    model.stages = nn.Sequential(nn.Sequential(nn.Linear(6, 6), nn.ReLU()),
                                 nn.Sequential(nn.Linear(6, 6), nn.ReLU()))
    model.forward = lambda x: model.stages(model.stem(x))
    x = torch.randn(3, 6)
    plan = dropit.plan_memory(model, lambda: model(x).square().sum(), budget=1.0, timing_rounds=1)
    assert [block.name for block in plan.blocks] == ["stages.0", "stages.1"]


def test_checkpoint_module_keeps_the_state_dict_and_gradients():
    block = _block(4)
    wrapped = dropit.nn.Checkpoint(copy.deepcopy(block))
    assert list(wrapped.state_dict()) == list(block.state_dict())
    wrapped.load_state_dict(block.state_dict())
    x = torch.randn(2, 4, 8, 8, requires_grad=True)
    block(x).square().sum().backward()
    x_grad = x.grad.clone()
    x.grad = None
    wrapped(x).square().sum().backward()
    torch.testing.assert_close(x.grad, x_grad)
    for (name, p), q in zip(block.named_parameters(), wrapped.block.parameters()):
        torch.testing.assert_close(q.grad, p.grad, msg=name)


@pytest.mark.parametrize("arguments, message", [
    (dict(budget=0.0), "budget 0.0 is outside (0, 1]"),
    (dict(budget=1.5), "budget 1.5 is outside (0, 1]"),
    (dict(timing_rounds=0), "timing_rounds 0 must be at least 1"),
    (dict(containers=["nowhere"]), "no submodule 'nowhere'"),
    (dict(containers=["0"]), "'0' is a Conv2d; expected an nn.Sequential"),
])
def test_bad_arguments_name_the_value(arguments, message):
    model = _model()
    x, y = _batch("cpu")
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace(".", r"\.")):
        dropit.plan_memory(model, lambda: F.cross_entropy(model(x), y), **arguments)


def test_bad_models_and_losses_leave_the_model_as_it_came():
    model = _model()
    x, y = _batch("cpu")
    with pytest.raises(ValueError, match="the loss has 10 elements; expected a scalar"):
        dropit.plan_memory(model, lambda: model(x)[0], containers=["2"])
    assert all(type(m) is nn.Sequential for m in model[2])
    with pytest.raises(ValueError, match="requires no gradient"):
        dropit.plan_memory(model, lambda: torch.zeros(()), containers=["2"])
    model.eval()
    with pytest.raises(ValueError, match="is in eval mode"):
        dropit.plan_memory(model, lambda: F.cross_entropy(model(x), y))


def test_a_model_that_cannot_be_copied_gets_a_clear_error():
    model = _model()
    model.lock = threading.Lock()  # deepcopy cannot copy a lock
    x, y = _batch("cpu")
    with pytest.raises(ValueError, match="Sequential cannot be copied"):
        dropit.plan_memory(model, lambda: F.cross_entropy(model(x), y), containers=["2"])
    assert all(type(m) is nn.Sequential for m in model[2])


def _exhaustive(available, seconds, held, budget, dense_held):
    """The least added time over every assignment of tools that meets the budget."""
    best = None
    for tools in itertools.product(range(len(TOOLS)), repeat=len(available)):
        if not all(available[b][t] for b, t in enumerate(tools)):
            continue
        if held(list(tools)) <= budget * dense_held:
            cost = sum(seconds[b][t] for b, t in enumerate(tools))
            if best is None or cost < best[0]:
                best = (cost, list(tools))
    return best


@pytest.mark.parametrize("budget", [0.9, 0.7, 0.5, 0.3])
def test_search_finds_the_cheapest_plan_on_additive_costs(budget):
    # Five blocks whose tools free bytes independently: 100 B held per block dense; convert frees
    # 60 B at 1 s, recompute 75 B at 1.8 s, checkpoint 90 B at 3 s (block 3 has nothing to
    # recompute through a layer, block 4 no layer to convert).
    available = [[True, True, True, True]] * 3 + [[True, True, False, True],
                                                  [True, False, False, True]]
    seconds = [[0.0, 1.0, 1.8, 3.0]] * 5
    freed = [0, 60, 75, 90]

    def held(tools):
        return sum(100 - freed[t] for t in tools)

    tools, met = _C.plan_search(available, seconds, 500, 10.0, budget, held)
    assert met == (_exhaustive(available, seconds, held, budget, 500) is not None)
    cost, cheapest = _exhaustive(available, seconds, held, budget, 500)
    assert held(tools) <= budget * 500
    assert sum(seconds[b][t] for b, t in enumerate(tools)) == cost, (tools, cheapest)


def test_search_reports_an_unreachable_budget():
    checkpoint = TOOLS.index("checkpoint")
    tools, met = _C.plan_search([[True, False, False, True]], [[0.0, 0.0, 0.0, 1.0]], 100, 1.0,
                                0.1, lambda tools: 100 - 50 * (tools[0] == checkpoint))
    assert not met
    assert tools == [checkpoint]
    with pytest.raises(ValueError, match="2 blocks' tools available but 1 blocks' seconds"):
        _C.plan_search([[True] * 4] * 2, [[0.0] * 4], 100, 1.0, 0.5, lambda tools: 0)
    with pytest.raises(ValueError, match="block 0 has 3 and 3 entries; expected 4"):
        _C.plan_search([[True] * 3], [[0.0] * 3], 100, 1.0, 0.5, lambda tools: 0)
