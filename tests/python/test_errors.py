"""Bad arguments raise a Python exception carrying the library's message, which names the value."""

import math

import pytest
import torch

import dropit

BAD_POLICIES = [
    (dict(gamma=math.nan), "gamma = nan"),
    (dict(gamma=-0.1), "gamma = -0.1"),
    (dict(gamma=1.0), "gamma = 1"),
    (dict(policy="topk"), "'topk'"),
    (dict(granularity="row"), "'row'"),
    (dict(chunk_size=0), "D = 0"),
    (dict(chunk_size=65537), "D = 65537"),
    (dict(policy="chunked_min_k", granularity="channel"), "channel granularity"),
]


@pytest.mark.parametrize("fields,message", BAD_POLICIES, ids=[m for _, m in BAD_POLICIES])
@pytest.mark.parametrize("entry", ["Policy", "nn.Linear", "nn.Conv2d", "convert",
                                   "functional.linear"])
def test_bad_policy_is_refused_at_every_entry_point(fields, message, entry):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        if entry == "Policy":
            dropit.Policy(**fields)
        elif entry == "nn.Linear":
            dropit.nn.Linear(4, 4, **fields)
        elif entry == "nn.Conv2d":
            dropit.nn.Conv2d(2, 2, 3, **fields)
        elif entry == "convert":
            dropit.convert(torch.nn.Sequential(torch.nn.Linear(2, 2)), **fields)
        else:
            w = torch.randn(3, 4, requires_grad=True)
            dropit.functional.linear(torch.randn(2, 4), w, **fields)


def grad_weight(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype).requires_grad_(True)


BAD_CALLS = [
    ("float64 input", lambda: dropit.functional.linear(
        torch.randn(2, 4, dtype=torch.float64), grad_weight(3, 4, dtype=torch.float64)),
     "dtype Double; expected float32, float16 or bfloat16"),
    ("int input to compress", lambda: dropit.functional.compress(torch.ones(4, dtype=torch.int32)),
     "dtype Int; expected float32, float16 or bfloat16"),
    ("features mismatch", lambda: dropit.functional.linear(torch.randn(2, 5), grad_weight(3, 4)),
     "does not end in 4 features"),
    ("conv rank", lambda: dropit.functional.conv2d(torch.randn(2, 3, 5), grad_weight(4, 3, 3, 3)),
     r"must be \[N, C, H, W\]"),
    ("conv channels", lambda: dropit.functional.conv2d(torch.randn(1, 5, 6, 6),
                                                       grad_weight(4, 3, 3, 3)),
     "has 5 channels; the weight expects 3"),
    ("string padding", lambda: dropit.functional.conv2d(torch.randn(1, 3, 6, 6),
                                                        grad_weight(4, 3, 3, 3), padding="same"),
     "numeric padding"),
    ("stride triple", lambda: dropit.functional.conv2d(torch.randn(1, 3, 6, 6),
                                                       grad_weight(4, 3, 3, 3), stride=(1, 1, 1)),
     "must be an int or a pair"),
    ("cache layout from elsewhere", lambda: dropit.functional.densify(
        dropit.functional.Cache(torch.zeros(3), torch.zeros(1, dtype=torch.int32), [1, 2])),
     "packed cache layout has 2 words"),
    ("memory on an unknown device", lambda: dropit.memory.measure("meta"),
     "cpu and cuda devices, not meta"),
    ("conv1d rank", lambda: dropit.nn.Conv1d(2, 3, 3)(torch.randn(2, 2, 5, 5)),
     r"Conv1d: input of shape \[2, 2, 5, 5\]; expected 3 dimensions"),
    ("conv3d rank", lambda: dropit.nn.Conv3d(2, 3, 3)(torch.randn(2, 5)),
     r"Conv3d: input of shape \[2, 5\]; expected 5 dimensions"),
    ("attention mask dtype", lambda: dropit.nn.MultiheadAttention(8, 2)(
        *[torch.randn(3, 2, 8)] * 3, key_padding_mask=torch.zeros(2, 3, dtype=torch.int32)),
     "key_padding_mask of dtype torch.int32; only bool and floating-point"),
    ("attention mask shape", lambda: dropit.nn.MultiheadAttention(8, 2)(
        *[torch.randn(3, 2, 8)] * 3, attn_mask=torch.zeros(4, 4, dtype=torch.bool)),
     r"attn_mask of shape \(4, 4\); expected \(3, 3\)"),
    ("attention with add_bias_kv", lambda: dropit.nn.MultiheadAttention(8, 2, add_bias_kv=True),
     "does not support add_bias_kv"),
    ("both policy and fields", lambda: dropit.functional.linear(
        torch.randn(2, 4), grad_weight(3, 4), dropit_policy=dropit.Policy(), gamma=0.5),
     "either dropit_policy= or the policy fields"),
]


@pytest.mark.parametrize("what,call,message", BAD_CALLS, ids=[b[0] for b in BAD_CALLS])
def test_bad_call_raises_with_the_library_message(what, call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call()


def test_cuda_tensor_on_a_build_without_cuda_is_refused_clearly():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: the same check is exercised with the meta device above")
    if dropit._C.built_with_cuda:
        pytest.skip("this build takes CUDA tensors (test_cuda.py tests them)")
    with pytest.raises(ValueError, match="is on cuda.*built without the CUDA backend"):
        dropit.functional.compress(torch.randn(8, device="cuda"))
