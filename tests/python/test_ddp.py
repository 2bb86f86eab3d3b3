"""Data-parallel training with torch.distributed (Gloo, two processes on this machine) over a
dropit-converted model, with DistributedDataParallel and with FSDP2 (fully_shard): one step's
averaged weight gradient equals the single-process gradient of the same dropit model on the
concatenated batch, and the ranks stay in sync while training.

The per-rank gradients can only match the concatenated-batch ones if both select the same
elements: chunked min-k decides per chunk of the flattened input, so every converted layer's
per-rank input holds a whole number of chunks (sizes below), and a chunk never straddles ranks.
"""

import os
import socket
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import dropit

WORLD = 2
BATCH = 8  # per rank
CHUNK = 128  # divides every converted layer's per-rank input: 4*8*8*8 = 2048 and 4*512 = 2048


def make_model():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(8, 8, 3, padding=1, stride=2), nn.ReLU(), nn.Flatten(),
                          nn.Linear(8 * 8 * 8, 10))
    report = dropit.convert(model, gamma=0.8, chunk_size=CHUNK,
                            example_input=torch.randn(1, 3, 16, 16))
    assert [layer.name for layer in report.converted] == ["1", "2", "3", "5"]
    return model


def data():
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(WORLD * BATCH, 3, 16, 16, generator=generator)
    y = torch.randint(0, 10, (WORLD * BATCH,), generator=generator)
    return x, y


def fully_shard_or_none():
    """FSDP2's fully_shard where this torch has it (public from 2.6)."""
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        return None
    return fully_shard


def wrap(model, wrapper):
    if wrapper == "ddp":
        return nn.parallel.DistributedDataParallel(model)
    fully_shard = fully_shard_or_none()
    for layer in model:
        if isinstance(layer, (dropit.nn.Linear, dropit.nn.Conv2d)):
            fully_shard(layer)
    return fully_shard(model)


def full(tensor):
    """A whole tensor from a sharded one (FSDP2's DTensor) or itself."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def worker(rank, port, out_dir, wrapper):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        model = wrap(make_model(), wrapper)
        x, y = data()
        mine = slice(rank * BATCH, (rank + 1) * BATCH)
        loss_fn = nn.CrossEntropyLoss()
        loss_fn(model(x[mine]), y[mine]).backward()
        first_grads = [full(p.grad).clone() for p in model.parameters()]
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        losses = []
        for _ in range(5):
            optimizer.step()
            optimizer.zero_grad()
            loss = loss_fn(model(x[mine]), y[mine])
            loss.backward()
            losses.append(loss.item())
        params = [full(p.detach()).clone() for p in model.parameters()]
        torch.save({"grads": first_grads, "params": params, "losses": losses},
                   os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("wrapper", ["ddp", "fsdp2"])
def test_data_parallel_gradient_equals_single_process_gradient_on_the_whole_batch(wrapper):
    if wrapper == "fsdp2" and fully_shard_or_none() is None:
        pytest.skip(f"torch {torch.__version__} has no torch.distributed.fsdp.fully_shard (FSDP2)")
    with tempfile.TemporaryDirectory() as out_dir:
        mp.spawn(worker, args=(free_port(), out_dir, wrapper), nprocs=WORLD, join=True)
        ranks = [torch.load(os.path.join(out_dir, f"rank{r}.pt")) for r in range(WORLD)]

    model = make_model()
    x, y = data()
    nn.CrossEntropyLoss()(model(x), y).backward()
    for (name, p), ddp_grad in zip(model.named_parameters(), ranks[0]["grads"]):
        torch.testing.assert_close(ddp_grad, p.grad, rtol=1e-4, atol=1e-5, msg=name)
    for a, b in zip(ranks[0]["params"], ranks[1]["params"]):
        assert torch.equal(a, b)  # the replicas stay identical
    for rank in ranks:
        assert rank["losses"][-1] < rank["losses"][0]
