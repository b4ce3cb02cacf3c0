"""``scripts/tune_mla_plan.py`` (the MLA plan sweep behind ``cuda.mla_plan``'s constants) on the CPU:
its byte counts against the benchmark's, its candidate plans, and its refusal without a GPU."""

import argparse
import subprocess
import sys

import pytest
import torch

from vllm_ascend_ext.bench import cases
from vllm_ascend_ext.ops import device as device_facts
from vllm_ascend_ext.ops import tiling
from vllm_ascend_ext.ops.models import mla_model
from vllm_ascend_ext.ops.tiling import MLAShape, cuda

from cli_helpers import SCRIPTS, load_script

SCRIPT = SCRIPTS / "tune_mla_plan.py"


@pytest.fixture(scope="module")
def tune():
    return load_script("tune_mla_plan")


@pytest.mark.parametrize("name, heads", [("DeepSeek-V3", 16), ("DeepSeek-V2-Lite", 16)])
def test_bytes_are_the_benchmarks_split_in_two(tune, name, heads):
    spec = mla_model(name)
    prologue, q_side = tune._bytes(spec, heads, 100)
    assert prologue + q_side == cases.mla_bytes_moved(spec, heads, 100)


def test_candidates_vary_what_the_flags_say(tune):
    spec = mla_model("DeepSeek-V3")
    case = cases.make_mla_case(spec, 16, 3, torch.device("cpu"))
    prologue, q_side = tune._shapes(case)
    assert not prologue.q_rope and q_side.q_rope and q_side.num_heads == 16
    facts = device_facts.CudaFacts(name="test", num_sms=132, source="test")
    flags = argparse.Namespace(block_tokens=[2, 4], q_block_tokens=[1, 2], warps=[2], q_warps=[4], per_sm=[8, 16],
                               block_heads=[4, 8], q_chunk=[512, 2048], max_registers=[0, 96])
    plans = tune._candidates(cuda.mla_plan(prologue, facts), False, facts, flags)
    assert {(p.block_tokens, p.q_chunk, p.max_programs, p.max_registers) for p in plans} == {
        (t, c, s * 132, r) for t in (2, 4) for c in (512, 2048) for s in (8, 16) for r in (0, 96)}
    assert {p.launch_options.get("maxnreg") for p in plans} == {None, 96}
    assert tune._label(cuda.mla_plan(prologue, facts), facts) == "4t/1h/512q/2w/16ps/0r"  # as results/*.txt name it
    small = cuda.mla_small_plan(prologue, facts)  # a program a tile: --per-sm is not swept
    assert {(p.max_programs, p.one_tile) for p in tune._candidates(small, False, facts, flags)} == {(16 * 132, True)}
    assert tune._label(small, facts) == "1t/1h/2048q/2w/pt/0r"
    q_plans = tune._candidates(cuda.mla_plan(q_side, facts), True, facts, flags)
    assert {(p.block_tokens, p.block_heads, p.num_warps) for p in q_plans} == {
        (t, h, 4) for t in (1, 2) for h in (4, 8)}


@pytest.mark.kernel
@pytest.mark.parametrize("name", ["DeepSeek-V3", "DeepSeek-V2-Lite"])
def test_pattern_copies_move_each_launchs_bytes(tune, name):
    """``--floor``'s no-math copies: the q side leaves ``q`` as it was (read and written back), the
    prologue's outputs are ``qkv_lora``'s column ranges and the cache rows at the slots ``cat(kv_c,
    k_pe)``, every other cache row untouched."""
    spec = mla_model(name)
    case = cases.make_mla_case(spec, 3, 5, torch.device("cpu"))
    q_before, cache_before = case["q"].clone(), case["kv_cache"].clone()
    prologue, q_side = tune.pattern_copies(case, q_block_rows=4, block_tokens=2, chunk=256)
    q_side()
    assert torch.equal(case["q"], q_before)
    q_c, kv_c, k_pe = prologue()
    x, lq, lkv = case["args"]["qkv_lora"], spec.q_lora_rank, spec.kv_lora_rank
    assert torch.equal(q_c, x[:, :lq]) and torch.equal(kv_c, x[:, lq:lq + lkv]) and torch.equal(k_pe, x[:, lq + lkv:])
    rows = case["kv_cache"].view(-1, lkv + spec.rope_dim)
    slots = case["slot_mapping"].long()
    assert torch.equal(rows[slots], x[:, lq:])
    untouched = torch.ones(rows.shape[0], dtype=torch.bool)
    untouched[slots] = False
    assert torch.equal(rows[untouched], cache_before.view(-1, lkv + spec.rope_dim)[untouched])


def test_two_copies_time_one_copy_a_launch_in_one_timing(tune, monkeypatch):
    """``--floor``'s two-launch copy: each timing runs a copy of the prologue's bytes then one of the
    q side's (the same copy configuration), and the faster configuration counts."""
    ran = []
    monkeypatch.setattr(tune, "copy_calls", lambda device, nbytes: [lambda c=c: ran.append((nbytes, c))
                                                                     for c in range(2)])
    times = iter([5.0, 3.0])

    def timer(fn):
        fn()
        return next(times)

    assert tune.two_copies(torch.device("cpu"), timer, (100, 40)) == 3.0
    assert ran == [(100, 0), (40, 0), (100, 1), (40, 1)]


def test_refuses_without_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the script would run the sweep")
    out = subprocess.run([sys.executable, "-P", str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "needs a CUDA GPU" in out.stderr


def test_both_launches_forces_the_plan_on_the_prologue_only(tune):
    """``--both``: the candidate plan is forced while the prologue runs and dropped before the q side."""
    plan = tiling.MLAPlan(block_tokens=2, block_heads=1, q_chunk=512, kv_chunk=512, max_programs=8, num_warps=2,
                          max_registers=64)
    seen = []
    run = tune.both_launches(lambda: seen.append(("prologue", tiling._forced_plan)),
                             lambda: seen.append(("q_side", tiling._forced_plan)), plan)
    run()
    run()
    assert seen == [("prologue", plan), ("q_side", None)] * 2


def test_a_failing_candidate_is_reported_and_skipped(tune, capsys):
    """The sweep and ``--both`` time a candidate through ``_timed``: its times at each count of calls,
    or ``None`` and one line naming the launch and the error when it fails to compile or launch."""
    plan = cuda.mla_plan(MLAShape(0, 512, 64, 2, 4), device_facts.CudaFacts(name="test", num_sms=132, source="test"))
    assert tune._timed(lambda fn, n: 1.5 * n, lambda: None, "prologue", plan, (1, 20)) == [1.5, 30.0]

    def broken(fn, n):
        raise RuntimeError("out of registers\nmore")
    assert tune._timed(broken, lambda: None, "both", plan) is None
    line = capsys.readouterr().out
    assert line.startswith("  both MLAPlan(") and line.endswith("RuntimeError: out of registers\n")
