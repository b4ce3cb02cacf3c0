"""The op has no backward: it must never leave a silently wrong gradient (issue 9, section 5).

Two guarantees, for the Python op and for the custom ops a compiled graph calls:

* an in-place write bumps ``qkv``'s autograd version counter, so a graph that saved ``qkv``
  before the write refuses to backpropagate (the dispatcher does not bump it for a custom
  ``(a!)`` op by itself; the implementation does);
* a tensor that requires grad is refused while grad mode is on, with a ``ValueError`` naming it.

The AscendC kernel's in-place path is checked the same way through its host build
(``tests/csrc/test_ascendc_autograd.py``).
"""

from __future__ import annotations

import pytest
import torch

from vllm_ascend_ext.kernels import custom_ops
from vllm_ascend_ext.ops import reference, split_qkv_rmsnorm_rope
from vllm_ascend_ext.ops.models import AttentionGeometry

#: The op's kernel runs in these tests (what the triton-ascend suite reruns: ``-m kernel``).
pytestmark = pytest.mark.kernel

GEOMETRY = AttentionGeometry(num_q_heads=4, num_kv_heads=2, head_dim=32, rotary_dim=16)
#: Issue 10's variants that write in place: v-norm (v's columns too), with mRoPE positions.
VARIANT = AttentionGeometry(num_q_heads=4, num_kv_heads=2, head_dim=32, rotary_dim=16, v_norm=True,
                            mrope_section=(4, 2, 2), mrope_interleaved=True)
ARG_NAMES = ("qkv", "q_weight", "k_weight", "cos_sin_cache", "positions", "num_q_heads", "num_kv_heads",
             "head_dim", "eps")


def _inputs(device, *, bias=False, geometry=GEOMETRY) -> dict:
    return reference.make_inputs(geometry, 5, device=device, dtype=torch.float32, bias=bias)


def _positional(kwargs: dict) -> tuple[tuple, dict]:
    args = tuple(kwargs[name] for name in ARG_NAMES)
    rest = {name: value for name, value in kwargs.items() if name not in ARG_NAMES}
    return args, rest


def _python_op_inplace(kwargs):
    split_qkv_rmsnorm_rope(**kwargs, inplace=True)


def _custom_op_inplace(kwargs):
    args, rest = _positional(kwargs)
    custom_ops.inplace_op()(*args, **rest)


def _python_op(kwargs):
    return split_qkv_rmsnorm_rope(**kwargs)[:2]


def _custom_op(kwargs):
    args, rest = _positional(kwargs)
    return custom_ops.functional_op()(*args, **rest)[:2]  # (q, k, v, gate): v and gate are [T, 0] here


IN_PLACE = {"python op": _python_op_inplace, "custom op": _custom_op_inplace}
OUT_OF_PLACE = {"python op": _python_op, "custom op": _custom_op}
EVERY_FORM = {**{f"{k} inplace": v for k, v in IN_PLACE.items()}, **OUT_OF_PLACE}


@pytest.mark.parametrize("geometry", [GEOMETRY, VARIANT], ids=lambda g: g.label)
@pytest.mark.parametrize("run", IN_PLACE.values(), ids=IN_PLACE.keys())
def test_inplace_write_invalidates_a_saved_qkv(device, run, geometry):
    kwargs = _inputs(device, geometry=geometry)
    qkv = kwargs["qkv"]
    want = torch.cat(reference.split_qkv_rmsnorm_rope(**kwargs), dim=1)  # q, k, v: qkv after the write
    w = torch.randn(qkv.shape, device=device, requires_grad=True)
    y = (w * qkv).sum()  # saves qkv for w's gradient
    version = qkv._version
    with torch.no_grad():
        run(kwargs)
    assert qkv._version > version
    torch.testing.assert_close(qkv.double(), want, atol=1e-4, rtol=1e-4)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


@pytest.mark.parametrize("run", OUT_OF_PLACE.values(), ids=OUT_OF_PLACE.keys())
def test_out_of_place_leaves_a_saved_qkv_usable(device, run):
    kwargs = _inputs(device)
    qkv = kwargs["qkv"]
    w = torch.randn(qkv.shape, device=device, requires_grad=True)
    y = (w * qkv).sum()
    version = qkv._version
    with torch.no_grad():
        run(kwargs)
    assert qkv._version == version
    y.backward()
    assert torch.equal(w.grad, qkv)


@pytest.mark.parametrize("run", IN_PLACE.values(), ids=IN_PLACE.keys())
def test_inplace_on_an_inference_tensor(device, run):
    with torch.inference_mode():
        kwargs = _inputs(device)
        want_q, want_k, *_ = reference.split_qkv_rmsnorm_rope(**kwargs)
        run(kwargs)
    qkv, q_cols = kwargs["qkv"], want_q.shape[1]
    assert qkv.is_inference()
    torch.testing.assert_close(qkv[:, q_cols:q_cols + want_k.shape[1]].double(), want_k, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", ["qkv", "q_weight", "k_weight", "q_bias", "cos_sin_cache"])
@pytest.mark.parametrize("run", EVERY_FORM.values(), ids=EVERY_FORM.keys())
def test_grad_requiring_tensor_is_refused_under_grad_mode(device, run, name):
    kwargs = _inputs(device, bias=True, geometry=VARIANT)
    kwargs[name].requires_grad_()
    before = kwargs["qkv"].detach().clone()
    with pytest.raises(ValueError, match=f"{name} requires grad"):
        run(kwargs)
    assert torch.equal(kwargs["qkv"].detach(), before)


@pytest.mark.parametrize("run", OUT_OF_PLACE.values(), ids=OUT_OF_PLACE.keys())
def test_grad_requiring_tensors_are_accepted_without_grad_mode(device, run):
    kwargs = _inputs(device, bias=True)
    for name in ("qkv", "q_weight", "k_bias"):
        kwargs[name].requires_grad_()
    want_q, want_k, *_ = reference.split_qkv_rmsnorm_rope(**kwargs)
    with torch.no_grad():
        q, k = run(kwargs)
    assert not q.requires_grad and not k.requires_grad
    torch.testing.assert_close(q.double(), want_q, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(k.double(), want_k, atol=1e-4, rtol=1e-4)
