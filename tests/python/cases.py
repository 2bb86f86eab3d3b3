"""The policies, dtypes and layers the tests run through, named once."""

import torch
from torch import nn

POLICIES = [
    dict(policy="chunked_min_k", chunk_size=256),
    dict(policy="min_k"),
    dict(policy="min_k", granularity="channel"),
    dict(policy="random", chunk_size=128, seed=7),
    dict(policy="random", chunk_size=128, seed=7, rescale=True),
]

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


class Conv1D(nn.Module):
    """Hugging Face's transformers.pytorch_utils.Conv1D, as it is written there: a linear layer
    with its weight stored [nx, nf]."""

    def __init__(self, nf, nx):
        super().__init__()
        self.nf, self.nx = nf, nx
        self.weight = nn.Parameter(torch.empty(nx, nf))
        self.bias = nn.Parameter(torch.zeros(nf))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x):
        size_out = x.size()[:-1] + (self.nf,)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return x.view(size_out)


class Sequence(nn.Module):
    """Every other layer convert replaces: Conv3d (densified weight gradient), Conv1d,
    nn.TransformerEncoderLayer's attention, Hugging Face's Conv1D."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.video = nn.Conv3d(2, 4, 3, padding=1)
        self.signal = nn.Conv1d(4, 16, 3, padding=1)
        self.encoder = nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, dropout=0.0,
                                                  batch_first=True)
        self.head = Conv1D(10, 16)

    def forward(self, x):
        h = self.signal(self.video(x).mean(dim=(3, 4))).transpose(1, 2)
        return self.head(self.encoder(h)).mean(dim=1)


class ProducerStack(nn.Module):
    """linear -> LayerNorm -> linear -> GELU -> linear: the last two layers read producers'
    outputs."""

    def __init__(self, width=256):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.norm = nn.Linear(64, width), nn.LayerNorm(width)
        self.b, self.act, self.c = nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, 64)

    def forward(self, x):
        return self.c(self.act(self.b(self.norm(self.a(x)))))
