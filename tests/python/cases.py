"""The policies and dtypes the layer and CUDA tests run through, named once."""

import torch

POLICIES = [
    dict(policy="chunked_min_k", chunk_size=256),
    dict(policy="min_k"),
    dict(policy="min_k", granularity="channel"),
    dict(policy="random", chunk_size=128, seed=7),
    dict(policy="random", chunk_size=128, seed=7, rescale=True),
]

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
