"""Data-parallel training of a dropit model with torch.distributed: DistributedDataParallel over
Gloo, one process per rank on this machine (with NCCL and one GPU per rank it is the same code).

dropit layers are ordinary autograd functions, so DDP needs nothing special: convert the model,
wrap it, train. Each rank trains on its own shard of Fashion-MNIST; at the end the ranks check that
their replicas are identical.

    python3 examples/python/train_ddp.py [--world-size 2] [--steps 100]
"""

import argparse
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

import dropit
import fashion_mnist_harness as harness


def make_model():
    return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))


def run(rank, args, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(max(1, torch.get_num_threads() // args.world_size))
    dist.init_process_group("gloo", rank=rank, world_size=args.world_size)
    torch.manual_seed(0)  # DDP also broadcasts rank 0's weights; same seed keeps it obvious
    model = make_model()
    report = dropit.convert(model, gamma=args.gamma)
    if rank == 0:
        print(report)
    model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    images, labels = harness.load_split("train", 0, args.data_dir)
    shard = slice(rank, None, args.world_size)  # every rank its own images
    images, labels = images[shard], labels[shard]
    order = torch.Generator().manual_seed(rank)
    for step in range(args.steps):
        index = torch.randint(0, len(images), (args.batch,), generator=order)
        loss = F.cross_entropy(model(images[index]), labels[index])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # DDP averages the gradients across ranks here
        optimizer.step()
        if step % 20 == 0 or step == args.steps - 1:
            print(f"rank {rank} step {step:4d} loss {loss.item():.4f}", flush=True)

    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    low, high = flat.clone(), flat.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    in_sync = torch.equal(low, high)
    if rank == 0:
        print(f"replicas identical on {args.world_size} ranks: {in_sync}")
    dist.destroy_process_group()
    if not in_sync:
        raise SystemExit(1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch", type=int, default=64, help="per rank")
    parser.add_argument("--gamma", type=float, default=0.9)
    parser.add_argument("--data-dir", default=harness.DATA_DIR)
    args = parser.parse_args()
    with socket.socket() as s:  # a free loopback port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(run, args=(args, port), nprocs=args.world_size, join=True)


if __name__ == "__main__":
    main()
