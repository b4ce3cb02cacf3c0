"""The AscendC path and autograd, through the host build: never a silently wrong gradient.

As for the Triton op (``tests/ops/test_autograd.py``): the in-place write bumps ``qkv``'s version
counter (the dispatcher does not do it for the custom ``(a!)`` op), and tensors that require
grad are refused while grad mode is on, naming the tensor.
"""

from __future__ import annotations

import pytest
import torch

from vllm_ascend_ext.kernels import ascendc, custom_ops, impl
from vllm_ascend_ext.ops import reference
from vllm_ascend_ext.ops.models import AttentionGeometry

GEOMETRY = AttentionGeometry(num_q_heads=4, num_kv_heads=2, head_dim=64, rotary_dim=32)
ARG_NAMES = ("qkv", "q_weight", "k_weight", "cos_sin_cache", "positions", "num_q_heads", "num_kv_heads",
             "head_dim", "eps")


def _inputs(*, bias=False) -> dict:
    return reference.make_inputs(GEOMETRY, 6, dtype=torch.bfloat16, bias=bias)


def _positional(kwargs: dict) -> tuple[tuple, dict]:
    return (tuple(kwargs[n] for n in ARG_NAMES), {n: v for n, v in kwargs.items() if n not in ARG_NAMES})


def _api_inplace(kwargs):
    ascendc.split_qkv_rmsnorm_rope(**kwargs, inplace=True)


def _ascendc_op_inplace(kwargs):
    args, rest = _positional(kwargs)
    getattr(torch.ops.vllm_ascend_ext, ascendc.INPLACE_OP_NAME)(*args, **rest)


def _selected_custom_op_inplace(kwargs):
    args, rest = _positional(kwargs)
    custom_ops.inplace_op()(*args, **rest)


def _api(kwargs):
    return ascendc.split_qkv_rmsnorm_rope(**kwargs)[:2]


def _ascendc_op(kwargs):
    args, rest = _positional(kwargs)
    return getattr(torch.ops.vllm_ascend_ext, ascendc.OP_NAME)(*args, **rest)


IN_PLACE = {"api": _api_inplace, "ascendc op": _ascendc_op_inplace, "custom op": _selected_custom_op_inplace}
EVERY_FORM = {**{f"{k} inplace": v for k, v in IN_PLACE.items()}, "api": _api, "ascendc op": _ascendc_op}


@pytest.fixture(autouse=True)
def _ascendc_selected(monkeypatch, host_sim):
    monkeypatch.setenv(impl.ENV_IMPL, "ascendc")


@pytest.mark.parametrize("run", IN_PLACE.values(), ids=IN_PLACE.keys())
def test_inplace_write_invalidates_a_saved_qkv(host_sim, run):
    kwargs = _inputs()
    qkv = kwargs["qkv"]
    before = qkv.clone()
    w = torch.randn(qkv.shape, requires_grad=True)
    y = (w * qkv).sum()  # saves qkv for w's gradient
    version = qkv._version
    with torch.no_grad():
        run(kwargs)
    assert host_sim.tiling.numTokens == 6  # the host build ran
    assert not torch.equal(qkv, before)
    assert qkv._version > version
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


@pytest.mark.parametrize("run", IN_PLACE.values(), ids=IN_PLACE.keys())
def test_inplace_on_an_inference_tensor(host_sim, run):
    with torch.inference_mode():
        kwargs = _inputs()
        before = kwargs["qkv"].clone()
        run(kwargs)
    assert kwargs["qkv"].is_inference() and not torch.equal(kwargs["qkv"], before)


@pytest.mark.parametrize("name", ["qkv", "k_weight", "q_bias"])
@pytest.mark.parametrize("run", EVERY_FORM.values(), ids=EVERY_FORM.keys())
def test_grad_requiring_tensor_is_refused_under_grad_mode(host_sim, run, name):
    kwargs = _inputs(bias=True)
    kwargs[name].requires_grad_()
    before = kwargs["qkv"].detach().clone()
    with pytest.raises(ValueError, match=f"{name} requires grad"):
        run(kwargs)
    assert torch.equal(kwargs["qkv"].detach(), before)


@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("bad,match", [
    (dict(dtype=torch.float32), "bf16/fp16"),
    (dict(positions=3), "positions has 3 tokens"),
    (dict(weight_dtype=torch.float16), "weights/biases in qkv's dtype"),
])
def test_fake_rejects_what_the_kernel_rejects(inplace, bad, match):
    from torch._subclasses.fake_tensor import FakeTensorMode

    kwargs = reference.make_inputs(GEOMETRY, 6, dtype=bad.get("dtype", torch.bfloat16))
    if "positions" in bad:
        kwargs["positions"] = kwargs["positions"][:bad["positions"]]
    if "weight_dtype" in bad:
        kwargs["q_weight"] = kwargs["q_weight"].to(bad["weight_dtype"])
    args, rest = _positional(kwargs)
    op = getattr(torch.ops.vllm_ascend_ext, ascendc.INPLACE_OP_NAME if inplace else ascendc.OP_NAME)
    with FakeTensorMode() as mode:
        fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        fake_rest = {k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for k, v in rest.items()}
        with pytest.raises(ValueError, match=match):
            op(*fake_args, **fake_rest)
