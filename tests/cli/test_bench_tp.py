"""The benchmark's multi-rank mode (``split_qkv_tp_rmsnorm_rope``, issue 12): spawned gloo ranks on CPU.

The CUDA path (NCCL, one GPU per rank, the collective captured in a CUDA graph) runs only on a
machine with GPUs (``scripts/bench_split_qkv_tp_rmsnorm_rope.py --ranks 2``); here two real
processes in a gloo group run the kernels through the interpreter at tiny sizes, and the pure
parts (the unfused path's math, the sharded geometry, the bar, the report) are checked directly.
"""

import csv
import json
import math

import pytest
import torch

from vllm_ascend_ext.bench import cases, catalog, harness, report, tp
from vllm_ascend_ext.ops import reference
from vllm_ascend_ext.ops.models import AttentionGeometry, model

from cli_helpers import load_script

TINY = AttentionGeometry(4, 2, 16, 8, qk_norm_across_heads=True)
#: One kv head over two ranks: replicated (each rank holds the same head).
TINY_REPLICATED = AttentionGeometry(4, 1, 16, 8, qk_norm_across_heads=True)


def _rel_err(out, ref) -> float:
    return max((o.double() - r).abs().max().item() / (r.abs().max().item() or 1.0) for o, r in zip(out, ref))


@pytest.mark.parametrize("geometry", [TINY, TINY_REPLICATED, model("MiniMax-M2")], ids=["tiny", "kv1", "minimax"])
def test_unfused_tp_at_tp1_matches_the_full_reference(geometry):
    """``unfused_tp`` (vLLM's PyTorch spelling) on the whole layer, no collective, against the
    float64 full-layer reference; GPT-J rotary on the tiny row too."""
    gen = torch.Generator().manual_seed(3)
    for is_neox in (True, False) if geometry is TINY else (True,):
        full = reference.make_tp_inputs(geometry, 7, max_position=catalog.MAX_POSITION, generator=gen)
        full["positions"].clamp_(0, catalog.MAX_POSITION - 1)
        full["is_neox"] = is_neox
        out = tp.unfused_tp(**full)
        ref = reference.split_qkv_tp_rmsnorm_rope_full(**full)
        assert _rel_err(out, ref) < 2.0**-6
        v_start = (geometry.num_q_heads + geometry.num_kv_heads) * geometry.head_dim
        assert out[2].data_ptr() == full["qkv"][:, v_start:].data_ptr()  # v is a view of qkv


def test_unfused_tp_reduces_the_means_through_the_callable():
    """Two identical ranks stood for by a callable doubling the [T, 2] tensor: the same outputs
    as TP 1 (the sum of two equal means divided by tp_size 2), and the tensor handed to the
    all-reduce is the flattened fp32 [T, 2] of vLLM's ``_all_reduce_variance``."""
    full = reference.make_tp_inputs(TINY, 5, max_position=catalog.MAX_POSITION, dtype=torch.float32,
                                    generator=torch.Generator().manual_seed(4))
    full["positions"].clamp_(0, catalog.MAX_POSITION - 1)
    seen = []

    def double(t):
        seen.append((t.shape, t.dtype))
        return t * 2

    one = tp.unfused_tp(**full)
    two = tp.unfused_tp(**full, tp_size=2, all_reduce=double)
    assert seen == [((10,), torch.float32)]
    for a, b in zip(one, two):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_local_geometry_shards_heads_as_vllm():
    """MiniMax-M2 at TP 2, 8 and 16 (kv replicated at 16), and the inputs of one rank are its
    ``shard_minimax`` slice of the same full layer on every rank."""
    m2 = model("MiniMax-M2")
    assert [(g.num_q_heads, g.num_kv_heads) for g in (cases.tp_local_geometry(m2, size) for size in (2, 8, 16))] == [
        (24, 4), (6, 1), (3, 1)]
    assert cases.tp_local_geometry(m2, 2).label == "24/4/128 R64 tpnorm"
    args0, ref0 = cases.make_tp_inputs(TINY_REPLICATED, 6, 2, 0, "cpu", seed=9)
    args1, ref1 = cases.make_tp_inputs(TINY_REPLICATED, 6, 2, 1, "cpu", seed=9)
    assert args0["num_q_heads"] == args1["num_q_heads"] == 2 and args0["num_kv_heads"] == 1
    assert not torch.equal(args0["qkv"][:, :32], args1["qkv"][:, :32])  # different q heads
    assert torch.equal(args0["qkv"][:, 32:], args1["qkv"][:, 32:])  # the one kv head, replicated
    assert torch.equal(ref0[1], ref1[1]) and not torch.equal(ref0[0], ref1[0])
    assert (args0["positions"] >= 0).all() and (args0["positions"] < catalog.MAX_POSITION).all()


def _row(tokens, rank, provider, us, err=0.0):
    return harness.TPRow("M", 2, rank, "24/4/128", tokens, provider, us, err, 1000, "graph")


def _result(rows, device="NVIDIA H200"):
    return {"rows": rows, "meta": {"op": catalog.TP_OP, "tp": 2, "collective": "nccl", "device": device,
                                   "timing": ["graph"], "capture_fallbacks": []}}


def test_bar_verdict_takes_the_worst_rank_and_lists_rows_over_the_bar():
    rows = [_row(1, r, "ours_tp", 6.0) for r in (0, 1)] + [_row(1, 0, "unfused_tp", 10.0),
                                                           _row(1, 1, "unfused_tp", 8.0)]
    rows += [_row(4096, r, "ours_tp", 11.0) for r in (0, 1)] + [_row(4096, r, "copy+allreduce", 10.0) for r in (0, 1)]
    lines = tp.tp_bar_verdict(_result(rows))
    assert lines[0].startswith("T<=64: ours_tp/unfused_tp worst 0.75 over 2 (T, rank) rows (FAIL <= 0.7")
    assert lines[1] == "  over: M 24/4/128 T=1 rank 1 0.75"
    assert lines[2].startswith("T>=4096: ours_tp/(copy+allreduce) worst 1.10 over 2 (T, rank) rows (PASS <= 1.2")
    assert len(lines) == 3
    assert tp.tp_bar_verdict(_result(rows[:4])) == lines[:2]  # no large-T rows: no large-T line


def test_report_prints_the_bar_on_a_gpu_and_the_disclaimer_on_cpu_and_names_failed_ranks():
    rows = [_row(8, 0, "ours_tp", 5.0), _row(8, 0, "unfused_tp", 10.0), _row(8, 1, "ours_tp", 5.0, err=0.5),
            _row(8, 1, "unfused_tp", 10.0, err=0.5)]
    text, failures = tp.tp_report(_result(rows))
    assert failures == ["M tp2 T=8 rank 1 ours_tp: rel err 5.00e-01 > 1.6e-02"]  # unfused_tp is not held to it
    assert "bar: T<=64: ours_tp/unfused_tp worst 0.50 over 2 (T, rank) rows (PASS" in text
    assert text.splitlines()[-1] == "CHECK FAILED: " + failures[0]
    cpu_text, _ = tp.tp_report(_result(rows[:2], device="cpu"))
    assert report.CPU_DISCLAIMER in cpu_text and "bar:" not in cpu_text


def test_run_tp_ranks_refuses_bad_arguments_by_name():
    with pytest.raises(ValueError, match="ranks"):
        tp.run_tp_ranks(1, "cpu")
    with pytest.raises(ValueError, match="backend"):
        tp.run_tp_ranks(2, "npu")
    with pytest.raises(ValueError, match="providers"):
        tp.run_tp_ranks(2, "cpu", providers=("ours",))


def test_two_gloo_ranks_check_time_and_write(tmp_path, capfd):
    """Two spawned processes in a gloo group, the kernels through the interpreter: every rank's
    rows (checked against the float64 reference of its shard, replicated kv included), rank 0's
    table and files, each rank's progress lines."""
    result = tp.run_tp_ranks(2, "cpu", tokens=(1, 5), geometries=(("tiny", TINY), ("kv1", TINY_REPLICATED)),
                               out=tmp_path, reps=1)
    out = capfd.readouterr().out
    rows = result["rows"]
    assert len(rows) == 2 * 2 * 2 * 3
    assert {(r.model, r.tokens, r.rank, r.provider) for r in rows} == {
        (m, t, k, p) for m in ("tiny", "kv1") for t in (1, 5) for k in (0, 1) for p in catalog.TP_PROVIDERS}
    assert {r.tp for r in rows} == {2} and {r.timing for r in rows} == {"wall"}
    assert {r.geometry for r in rows} == {"2/1/16 R8 tpnorm"}
    for r in rows:
        assert r.us > 0 and r.bytes == cases.bytes_moved(cases.tp_local_geometry(TINY, 2), r.tokens)
        if r.provider == "copy+allreduce":
            assert math.isnan(r.max_rel_err)
        else:
            assert 0 < r.max_rel_err < 2.0**-6
    assert harness.check_rows(rows) == []
    assert result["meta"]["collective"] == "gloo" and result["meta"]["capture_fallbacks"] == []
    for rank in (0, 1):
        assert out.count(f"[rank {rank}] ") == 12  # the ranks' lines may interleave
    assert report.CPU_DISCLAIMER in out
    text = (tmp_path / "bench_split_qkv_tp_rmsnorm_rope.txt").read_text()
    assert text.startswith("split_qkv_tp_rmsnorm_rope: 2 ranks (gloo) on cpu") and text in out
    with (tmp_path / "bench_split_qkv_tp_rmsnorm_rope.csv").open() as fh:
        assert len(list(csv.DictReader(fh))) == len(rows)
    assert len(json.loads((tmp_path / "bench_split_qkv_tp_rmsnorm_rope.json").read_text())["rows"]) == len(rows)


def test_script_runs_two_ranks_of_a_given_geometry(tmp_path, capfd):
    script = load_script("bench_split_qkv_tp_rmsnorm_rope")
    code = script.main(["--backend", "cpu", "--ranks", "2", "--tokens", "3", "--geometry", "4/2/16/8",
                        "--providers", "ours_tp,copy+allreduce", "--reps", "1", "--out", str(tmp_path)])
    out = capfd.readouterr().out
    assert code == 0
    rows = json.loads((tmp_path / "bench_split_qkv_tp_rmsnorm_rope.json").read_text())["rows"]
    assert sorted((r["rank"], r["provider"]) for r in rows) == [
        (0, "copy+allreduce"), (0, "ours_tp"), (1, "copy+allreduce"), (1, "ours_tp")]
    assert "custom" in out and "2/1/16 R8 tpnorm" in out
    with pytest.raises(SystemExit):
        script.main(["--geometry", "4/2/16"])
