"""The launch cache: one full validation per key, the full path again when the key changes, and
the same ValueError for a bad call after a good one (vllm_ascend_ext.ops.launch_cache).

Most tests run on ``meta`` tensors: the ops validate, allocate their outputs and launch nothing
there, so a thousand calls cost microseconds and the cache is all that is exercised. Launches
through the cache are covered by every kernel test (they all go through it); the GPU tests here
check the direct launch (Triton 3.6/3.7 on CUDA) and that no op syncs the host.
"""

import importlib
import subprocess
import sys
import threading

import pytest
import torch

from vllm_ascend_ext.ops import launch_cache, reference, validation
from vllm_ascend_ext.ops.models import AttentionGeometry

pytestmark = pytest.mark.kernel

GEOMETRY = AttentionGeometry(num_q_heads=4, num_kv_heads=2, head_dim=16, rotary_dim=16)


def _op(name):
    return getattr(importlib.import_module("vllm_ascend_ext.ops"), name)


def _args(tokens: int, device="meta", **overrides) -> dict:
    args = reference.make_inputs(GEOMETRY, tokens, device="cpu")
    args = {name: value.to(device) if isinstance(value, torch.Tensor) else value for name, value in args.items()}
    args.update(overrides)
    return args


@pytest.fixture
def count_validations(monkeypatch):
    """How many times the prologue's validator ran (a list of one counter)."""
    count = [0]
    real = validation.split_qkv_rmsnorm_rope

    def counting(*args, **kwargs):
        count[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(validation, "split_qkv_rmsnorm_rope", counting)
    return count


def test_one_validation_for_many_token_counts(count_validations):
    op = _op("split_qkv_rmsnorm_rope")
    generator = torch.Generator().manual_seed(0)
    for _ in range(1000):
        tokens = int(torch.randint(2, 300, (1,), generator=generator))
        q, k, v = op(**_args(tokens))
        assert q.shape == (tokens, 4 * 16) and q.device.type == "meta"
    assert count_validations[0] == 1
    entries, misses, hits = launch_cache.stats()["split_qkv_rmsnorm_rope"]
    assert (entries, misses, hits) == (1, 1, 999)


@pytest.mark.parametrize("change", ["dtype", "row_stride", "flag", "scalar", "weight_dtype", "alignment",
                                    "positions_dtype", "bool_for_int"])
def test_a_changed_key_validates_again(change, count_validations, device):
    op = _op("split_qkv_rmsnorm_rope")
    base = _args(8)
    op(**base)
    op(**_args(5))
    assert count_validations[0] == 1
    changed = dict(base)
    if change == "dtype":
        changed["qkv"] = base["qkv"].to(torch.float16)
        changed["q_weight"] = base["q_weight"].to(torch.float16)
        changed["k_weight"] = base["k_weight"].to(torch.float16)
    elif change == "row_stride":
        changed["qkv"] = torch.empty(8, base["qkv"].shape[1] + 8, dtype=base["qkv"].dtype,
                                     device="meta")[:, :base["qkv"].shape[1]]
    elif change == "flag":
        changed["is_neox"] = not base.get("is_neox", True)
    elif change == "scalar":
        changed["eps"] = 1e-5
    elif change == "weight_dtype":
        changed["q_weight"] = base["q_weight"].float()
    elif change == "alignment":  # meta tensors have no address: two small CPU calls
        aligned = _args(2, device=device)
        op(**aligned)
        count_validations[0] = 1
        width = aligned["qkv"].shape[1]
        shifted = torch.empty(2 * width + 1, dtype=aligned["qkv"].dtype, device=aligned["qkv"].device)
        shifted[1:].copy_(aligned["qkv"].reshape(-1))
        changed = dict(aligned, qkv=shifted[1:].view(2, width))
    elif change == "positions_dtype":
        changed["positions"] = base["positions"].to(torch.int32)
    elif change == "bool_for_int":  # True == 1 to a dict, not to the validator
        geometry = AttentionGeometry(num_q_heads=1, num_kv_heads=1, head_dim=16, rotary_dim=16)
        args = reference.make_inputs(geometry, 4, device="cpu")
        args = {n: t.to("meta") if isinstance(t, torch.Tensor) else t for n, t in args.items()}
        op(**args)
        count_validations[0] = 1
        with pytest.raises(ValueError, match="num_q_heads must be a positive int"):
            op(**dict(args, num_q_heads=True))
        return
    op(**changed)
    assert count_validations[0] == 2


@pytest.mark.parametrize("bad", ["positions_tokens", "nan_eps", "requires_grad", "slots_short", "wrong_device"])
def test_a_bad_call_after_a_good_one_raises_the_same(bad):
    if bad == "slots_short":
        op = _op("split_qkv_rmsnorm_rope_kv_cache")
        args = _kv_args(6)
        op(**args)
        op(**_kv_args(3))
        with pytest.raises(ValueError, match="slot_mapping must be"):
            op(**dict(_kv_args(6), slot_mapping=torch.zeros(5, dtype=torch.int64, device="meta")))
        return
    op = _op("split_qkv_rmsnorm_rope")
    op(**_args(6))
    args = _args(6)
    if bad == "positions_tokens":
        args["positions"] = torch.zeros(5, dtype=torch.int64, device="meta")
        match = "positions has 5 tokens, qkv has 6"
    elif bad == "nan_eps":
        args["eps"] = float("nan")
        match = "eps must be a finite"
    elif bad == "requires_grad":
        args["q_weight"] = args["q_weight"].clone().requires_grad_()
        match = "q_weight requires grad"
    else:
        args["k_weight"] = torch.ones(16, dtype=torch.bfloat16, device="cpu")
        match = "k_weight is on cpu"
    with pytest.raises(ValueError, match=match):
        op(**args)


def _kv_args(tokens: int) -> dict:
    args = _args(tokens)
    blocks, block_size = 4, 4
    cache = torch.empty(blocks, block_size, GEOMETRY.num_kv_heads, GEOMETRY.head_dim, dtype=torch.bfloat16,
                        device="meta")
    return dict(args, key_cache=cache, value_cache=torch.empty_like(cache),
                slot_mapping=torch.zeros(tokens, dtype=torch.int64, device="meta"))


def test_meta_tensors_get_the_validators_outputs():
    """Every tensor on the meta device: the outputs as the custom op's fake gives them, no launch."""
    gated = dict(_args(3), q_gate=True, qkv=torch.empty(3, (8 + 4) * 16, dtype=torch.bfloat16, device="meta"))
    q, k, v, gate = _op("split_qkv_rmsnorm_rope")(**gated)
    assert [t.shape for t in (q, k, v, gate)] == [(3, 64), (3, 32), (3, 32), (3, 64)]
    assert all(t.device.type == "meta" for t in (q, k, v, gate))
    q, k, v = _op("split_qkv_rmsnorm_rope_kv_cache")(**_kv_args(2))
    assert q.shape == (2, 64) and k.shape == (2, 0)


def test_threads_share_one_entry(count_validations):
    op = _op("split_qkv_rmsnorm_rope")
    errors = []

    def work(seed):
        try:
            for tokens in range(2, 60):
                assert op(**_args(tokens + seed))[0].shape[0] == tokens + seed
        except Exception as exc:  # noqa: BLE001 -- reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert 1 <= count_validations[0] <= 4  # racing first calls may each validate; never more
    assert launch_cache.stats()["split_qkv_rmsnorm_rope"][0] == 1


def test_clear_and_bound(monkeypatch, count_validations):
    op = _op("split_qkv_rmsnorm_rope")
    monkeypatch.setattr(launch_cache, "MAX_ENTRIES", 3)
    for eps in (1e-6, 2e-6, 3e-6, 4e-6, 5e-6):
        op(**dict(_args(4), eps=eps))
    assert launch_cache.stats()["split_qkv_rmsnorm_rope"][0] == 3
    launch_cache.clear()
    assert launch_cache.stats()["split_qkv_rmsnorm_rope"] == (0, 0, 0)
    op(**_args(4))
    assert count_validations[0] == 6


def test_which_launch_path_this_triton_takes():
    """The interpreter and triton-ascend take the plain path (kernel[grid]); Triton 3.6/3.7 on
    CUDA the direct one (checked on the GPU below)."""
    from vllm_ascend_ext.ops import split_qkv_rmsnorm_rope as _  # noqa: F401  (defines the kernel)
    from vllm_ascend_ext.ops import triton_launcher

    kernel = sys.modules["vllm_ascend_ext.ops.split_qkv_rmsnorm_rope"].split_qkv_rmsnorm_rope_kernel
    reason = triton_launcher.direct_unavailable_reason(kernel)
    import triton

    if triton_launcher.interpreted(kernel):
        assert reason == "Triton's interpreter runs the kernel"
    if triton.__version__.startswith("3.2"):
        assert "triton-ascend" in triton_launcher.direct_unavailable_reason()
    elif triton.__version__.split(".")[:2] in (["3", "6"], ["3", "7"]):
        assert triton_launcher.direct_unavailable_reason() is None


def test_interpret_set_after_triton_was_imported():
    """TRITON_INTERPRET set after Triton was imported: the op's own error, naming the variable and
    what to do, not Triton's "0 active drivers"."""
    code = (
        "import os, torch, triton\n"
        "os.environ['TRITON_INTERPRET'] = '1'\n"
        "from vllm_ascend_ext.ops import reference, split_qkv_rmsnorm_rope\n"
        "from vllm_ascend_ext.ops.models import AttentionGeometry\n"
        "g = AttentionGeometry(num_q_heads=2, num_kv_heads=1, head_dim=16, rotary_dim=16)\n"
        "try:\n"
        "    split_qkv_rmsnorm_rope(**reference.make_inputs(g, 2))\n"
        "except ValueError as exc:\n"
        "    print('ValueError:', exc)\n")
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert "ValueError:" in out.stdout, out.stderr[-2000:]
    assert "TRITON_INTERPRET" in out.stdout and "before Triton is imported" in out.stdout


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("op_name", ["split_qkv_rmsnorm_rope", "split_qkv_rmsnorm_rope_kv_cache",
                                     "split_qkv_tp_rmsnorm_rope", "inplace"])
def test_cuda_direct_launch_and_no_host_sync(op_name, device):
    """On CUDA (Triton 3.6/3.7) calls after the first go straight to the compiled kernel, give the
    plain path's results, and never sync the host (CUDA's sync debug mode raises on a sync). In
    place, k's address is qkv's plus its column's bytes (no view is made for the launch)."""
    if device.type != "cuda":
        pytest.skip("the kernels run through the interpreter here")
    inplace = op_name == "inplace"
    op_name = "split_qkv_rmsnorm_rope" if inplace else op_name
    op = _op(op_name)
    args = _args(37, device="cuda")
    if inplace:
        source = args["qkv"]
        args["inplace"] = True
        op = lambda **kw: _op(op_name)(**dict(kw, qkv=source.clone()))  # noqa: E731 -- a fresh qkv each call
    if op_name == "split_qkv_rmsnorm_rope_kv_cache":
        cache = torch.zeros(8, 16, GEOMETRY.num_kv_heads, GEOMETRY.head_dim, dtype=torch.bfloat16, device="cuda")
        args.update(key_cache=cache, value_cache=torch.zeros_like(cache),
                    slot_mapping=torch.randperm(128, device="cuda")[:37], return_kv=True)
    if op_name == "split_qkv_tp_rmsnorm_rope":
        h = GEOMETRY.head_dim
        args = {n: args[n] for n in ("qkv", "cos_sin_cache", "positions", "num_q_heads", "num_kv_heads",
                                     "head_dim", "eps")}
        args.update(q_weight=torch.rand(4 * h, device="cuda", dtype=torch.bfloat16),
                    k_weight=torch.rand(2 * h, device="cuda", dtype=torch.bfloat16))
    first = [t.clone() for t in op(**args)]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            again = op(**args)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for a, b in zip(first, again):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    cache = next(c for c in launch_cache._caches if c.name == op_name)
    entry = next(iter(cache._entries.values()))
    prologue = getattr(entry, "prologue", entry)
    assert prologue._bound and all(bound.direct for bound in prologue._bound.values())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_mla_direct_launch_and_no_host_sync(device):
    """The MLA prologue (with its cache write) and its q side, and the prologue without a q latent
    given q (one launch): direct launches after the first, the same results, no host sync."""
    if device.type != "cuda":
        pytest.skip("the kernels run through the interpreter here")
    prologue, q_rope = _op("split_qkv_rmsnorm_rope_mla"), _op("mla_q_rope_")
    args = reference.make_mla_inputs(64, 32, 16, 37, device="cuda", out_of_range=False)
    args.update(reference.make_mla_cache(args))
    lite = reference.make_mla_inputs(0, 32, 16, 37, device="cuda", out_of_range=False)
    lite.update(reference.make_mla_cache(lite))
    q = torch.randn(37, 4, 48, device="cuda", dtype=torch.bfloat16)

    def calls() -> list:
        q_side, q_lite = q.clone(), q.clone()
        outputs = [*prologue(**args), q_rope(q_side, args["cos_sin_cache"], args["positions"], 16)]
        return [t.clone() for t in (*outputs, *prologue(**lite, q=q_lite), q_lite)]

    first = calls()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        again = calls()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for a, b in zip(first, again):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for name in ("split_qkv_rmsnorm_rope_mla", "mla_q_rope_"):
        cache = next(c for c in launch_cache._caches if c.name == name)
        assert all(b.direct for entry in cache._entries.values() for b in entry._bound.values())


def _count_allocations(monkeypatch) -> list:
    """Out-of-place outputs allocated by the prologue's launcher (a list of their widths)."""
    module = importlib.import_module("vllm_ascend_ext.ops.split_qkv_rmsnorm_rope")
    widths, real = [], module._new_output

    def counting(qkv, num_tokens, columns):
        widths.append(columns)
        return real(qkv, num_tokens, columns)

    monkeypatch.setattr(module, "_new_output", counting)
    return widths


def _prepared(op: str, args: dict):
    """The op's call object for ``args`` (made directly, as the launch cache makes it)."""
    from vllm_ascend_ext.ops.split_qkv_rmsnorm_rope import Prepared

    return Prepared(getattr(validation, op)(**args), args)


def test_functional_outputs_alias_nothing_and_share_their_empties(monkeypatch):
    """The functional form: q and k new, v and the gate [T, 0] tensors of their own (no view of
    qkv is made), the same [T, 0] tensors on every call of a token count, none an inference tensor."""
    widths = _count_allocations(monkeypatch)
    args = _args(5)
    entry = _prepared("split_qkv_rmsnorm_rope", args)
    with torch.inference_mode():
        q, k, v, gate = entry.run(args, functional=True)
        again = entry.run(args, functional=True)
    assert widths == [64, 32, 64, 32]  # q and k, per call
    assert q.shape == (5, 64) and k.shape == (5, 32) and v.shape == gate.shape == (5, 0)
    assert v is not gate and again[2] is v and again[3] is gate and again[0] is not q
    assert not v.is_inference() and not gate.is_inference()
    other = entry.run(_args(3), functional=True)
    assert other[2].shape == (3, 0) and other[2] is not v
    api = entry.run(args)
    assert len(api) == 3 and api[2].shape == (5, 32) and api[2]._base is args["qkv"]  # the API's v: a view


def test_outputs_are_allocated_once(monkeypatch):
    """The KV-cache write without return_kv allocates q alone (k and v are shared [T, 0]); in place
    the functional form allocates nothing and returns nothing."""
    widths = _count_allocations(monkeypatch)
    args = _kv_args(4)
    entry = _prepared("split_qkv_rmsnorm_rope_kv_cache", dict(args, return_kv=False))
    q, k, v = entry.run(args)
    assert widths == [64] and k is v and k.shape == (4, 0)
    q, k, v, gate = entry.run(args, functional=True)
    assert widths == [64, 64] and len({id(k), id(v), id(gate)}) == 3 and k.shape == v.shape == gate.shape == (4, 0)
    inplace = dict(_args(4), inplace=True)
    assert _prepared("split_qkv_rmsnorm_rope", inplace).run(inplace, functional=True) is None
    assert widths == [64, 64]


def test_key_plans_follow_names_and_types():
    """The key sees each argument's name and type: the same values under other names, a list for a
    tuple, or a changed tensor inside a sequence are other keys; equal calls are one key."""
    t = torch.empty(2, 8, device="meta")
    key = launch_cache.call_key
    keys = launch_cache.TOKEN_KEYS
    assert key({"qkv": t, "a": 1}, keys) == key({"qkv": torch.empty(5, 8, device="meta"), "a": 1}, keys)
    assert key({"qkv": t, "a": 1}, keys) != key({"a": 1, "qkv": t}, keys)
    assert key({"qkv": t, "a": (1, 2)}, keys) != key({"qkv": t, "a": [1, 2]}, keys)
    assert key({"qkv": t, "a": 1}, keys) != key({"qkv": t, "a": True}, keys)
    pair = (torch.empty(4, 4, device="meta"), None)
    assert key({"qkv": t, "c": pair}, keys) != key({"qkv": t, "c": (pair[0].half(), None)}, keys)
    with torch.enable_grad():
        assert key({"qkv": t.clone().requires_grad_(), "a": 1}, keys) is None
    # The written-out key: the scalars, each plain tensor as tensor_key reads it, the token-sized
    # ones through their functions, the sequences.
    w, cache = torch.empty(8, dtype=torch.float16)[1:], torch.empty(3, 4)[:, ::2]
    got = key({"qkv": t, "w": w, "n": 3, "eps": 0.5, "cache": cache, "s": [w, None]}, keys)
    assert got[1:] == ((3, 0.5), (launch_cache.tensor_key(w), launch_cache.tensor_key(cache)),
                       (launch_cache.rows_key(t),), ((launch_cache.tensor_key(w), (None, type(None))),))


class _FakeCompiled:
    """A compiled kernel whose launcher records its arguments."""

    function, packed_metadata = 0, None

    def __init__(self, launches):
        self.launches = launches

    def _init_handles(self):
        pass

    def run(self, *args):
        self.launches.append(("direct", args[9:]))


class _FakeKernel:
    """A ``@triton.jit`` kernel's stand-in: two pointers (one a column of a 2-D source), the token
    count (run time) and a constexpr."""

    arg_names = ["x_ptr", "col_ptr", "n", "C"]

    def __init__(self):
        self.launches = []

    def warmup(self, grid, **kwargs):
        return _FakeCompiled(self.launches)

    def __getitem__(self, grid):
        return lambda **kwargs: self.launches.append(("plain", kwargs))


def test_direct_launch_fills_addresses_and_falls_back(monkeypatch):
    """The direct path's arguments: each pointer the source's address (plus its column's bytes),
    the run-time integer, the constexprs (a replay too); a source less aligned than the first call's, or a launch
    hook, takes ``kernel[grid]`` with the column as a view."""
    import types

    import triton.runtime

    from vllm_ascend_ext.ops import triton_launcher

    if triton_launcher.direct_unavailable_reason() is not None:
        pytest.skip(triton_launcher.direct_unavailable_reason())
    active = types.SimpleNamespace(get_current_device=lambda: 0, get_current_stream=lambda device: 0)
    monkeypatch.setattr(triton.runtime, "driver", types.SimpleNamespace(active=active))
    kernel = _FakeKernel()
    x = torch.zeros(4, 16, dtype=torch.bfloat16)
    bound = triton_launcher.BoundKernel(kernel, {"x_ptr": 0, "col_ptr": (0, 8)}, {"n": 4, "C": 7}, (x,),
                                        runtime=("n",), grid=2)
    assert bound.direct
    y = torch.zeros(3, 16, dtype=torch.bfloat16)
    bound(2, (y,), (3,))
    assert kernel.launches[-1] == ("direct", (y.data_ptr(), y.data_ptr() + 16, 3, 7))
    replay = bound.replay(2, (x,), (4,))  # the host benchmark's launch alone: this call's arguments, fixed
    replay()
    assert kernel.launches[-1] == ("direct", (x.data_ptr(), x.data_ptr() + 16, 4, 7))
    shifted = torch.zeros(3 * 16 + 1, dtype=torch.bfloat16)[1:].view(3, 16)
    bound(2, (shifted,), (3,))
    path, kwargs = kernel.launches[-1]
    assert path == "plain" and kwargs["n"] == 3 and kwargs["C"] == 7 and kwargs["x_ptr"] is shifted
    assert kwargs["col_ptr"].data_ptr() == shifted.data_ptr() + 16
    monkeypatch.setattr(triton_launcher, "launch_hooked", lambda: True)
    bound(2, (y,), (3,))
    assert kernel.launches[-1][0] == "plain"
