"""The lowering check's pure parts and the UB model of the KV-cache write and of the norm across
heads (no triton-ascend here: ``python -m vllm_ascend_ext.ops.ascend_lowering`` runs the lowering
itself, under .venv/ascend)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from vllm_ascend_ext.ops import ascend_lowering as al
from vllm_ascend_ext.ops._check_common import in_argument_order, kv_cache_call
from vllm_ascend_ext.ops.device import ascend_facts
from vllm_ascend_ext.ops.models import geometry_table, model
from vllm_ascend_ext.ops.tiling import KernelShape, ascend, next_pow2

# A lowered function's text in the shape triton-ascend 3.2 prints it: two leading arguments, then
# the kernel's. %arg2 is read, %arg3 an output, %arg4 a cache. The two sibling regions reuse the
# name %view: in the first it views the input, in the second the output.
LINALG = """\
  func.func @kernel(%arg0: memref<?xi8>, %arg1: memref<?xi8>, %arg2: memref<?xbf16>, %arg3: memref<?xbf16>, \
%arg4: memref<?xi8>, %arg5: i32) {
    scf.if %c {
      %cast = memref.reinterpret_cast %arg2 to offset: [%o], sizes: [4, 64], strides: [%s, 1] : x
      %view = memref.subview %cast[0, 0] [%n, 64] [1, 1] : x
      memref.copy %view, %alloc : x
    } else {
      %cast_1 = memref.reinterpret_cast %arg3 to offset: [%o], sizes: [4, 64], strides: [%s, 1] : x
      %view = memref.subview %cast_1[0, 0] [%n, 64] [1, 1] : x
      bufferization.materialize_in_destination %t in writable %view : (tensor<?x64xbf16>, memref<x>) -> ()
      %cast_2 = memref.reinterpret_cast %arg4 to offset: [%e], sizes: [1], strides: [1] : x
      bufferization.materialize_in_destination %one in writable %cast_2 : (tensor<1xi8>, memref<1xi8>) -> ()
      bufferization.materialize_in_destination %one in writable %cast_2 : (tensor<1xi8>, memref<1xi8>) -> ()
    }
"""
ARGS = {"%arg2": "qkv_ptr", "%arg3": "q_out_ptr", "%arg4": "k_cache_ptr"}


def test_accesses_follow_views_to_their_argument_in_printed_order():
    counts = al._accesses(LINALG, ARGS)
    assert counts["read", "qkv_ptr"] == 1
    assert counts["read", "q_out_ptr"] == 0  # %view is the output's only after the copy
    assert counts["element store", "k_cache_ptr"] == 2
    assert counts["element store", "q_out_ptr"] == 0  # a block store


def test_a_copy_out_of_an_output_counts_as_its_read():
    text = LINALG.replace("memref.copy %view, %alloc", "memref.copy %alloc, %view").replace(
        "bufferization.materialize_in_destination %t in writable %view", "memref.copy %view, %alloc2")
    counts = al._accesses(text, ARGS)
    assert counts["read", "qkv_ptr"] == 0
    assert counts["read", "q_out_ptr"] == 1


def test_lowered_arguments_are_checked_against_the_signature():
    signature = {"qkv_ptr": "*bf16", "q_out_ptr": "*bf16", "k_cache_ptr": "*i8", "num_tokens": "i32"}
    al._check_arguments(LINALG, list(signature), signature)
    with pytest.raises(ValueError, match="%arg4 is i8, expected v_cache_ptr"):
        al._check_arguments(LINALG, ["qkv_ptr", "q_out_ptr", "v_cache_ptr"], signature | {"v_cache_ptr": "*bf16"})


def test_signatures_are_put_in_the_kernels_argument_order():
    params = [SimpleNamespace(name=n, is_constexpr=n == "B") for n in ("x", "y", "n", "B")]
    kernel = SimpleNamespace(__name__="k", arg_names=[p.name for p in params], params=params)
    assert list(in_argument_order(kernel, {"n": "i32", "y": "*bf16", "x": "*bf16"})) == ["x", "y", "n"]
    assert list(in_argument_order(kernel, {"B": "constexpr", "n": "i32", "y": "*i8", "x": "*i8"})) == [
        "x", "y", "n", "B"]
    with pytest.raises(KeyError, match=r"lacks run-time ones \['n'\]"):
        in_argument_order(kernel, {"x": "*bf16", "y": "*bf16"})
    with pytest.raises(KeyError, match="unknown arguments"):
        in_argument_order(kernel, {"x": "*bf16", "y": "*bf16", "n": "i32", "z": "i32"})


@pytest.mark.parametrize("layout,cache,chunk", [("nhd", "bf16", 0), ("nz", "bf16", 16), ("nz", "int8", 32)])
def test_kv_cache_call_is_the_validators(layout, cache, chunk):
    geometry = model("Qwen3-8B").shard(1)
    call = kv_cache_call(geometry, "bf16", "fp32", layout=layout, cache_dtype=cache,
                         per_channel=cache == "int8", return_kv=True, q_norm=True, k_norm=True)
    assert call.shape == replace(KernelShape.of(geometry, 2, 4), kv_cache=True)
    assert call.kv_cache.layout == layout and call.kv_cache.return_kv
    assert call.kv_cache.key_strides.chunk_width == chunk
    assert call.kv_cache.per_channel is (cache == "int8")


def test_every_kv_form_is_lowered_on_qwen3_8b_and_the_cover_forms_everywhere_else():
    assert len(set(al.KV_ALL)) == 12
    cover = al.KV_COVER
    assert {kv.layout for kv in cover} == {"nhd", "nz"}
    assert {(kv.int8, kv.per_channel) for kv in cover} == {(False, False), (True, False), (True, True)}
    assert {kv.return_kv for kv in cover} == {False, True}
    lowered: dict = {}
    for label, _, variant in al.plan_jobs(kv_only=True):
        feature = variant.name if variant.name != variant.kv.name else ""  # a prologue variant's name
        lowered.setdefault((label.split(" [")[0], feature), set()).add(variant.kv)
    assert lowered.pop(("Qwen3-8B tp1", "")) == set(al.KV_ALL)
    table = {(f"{name} tp{tp}", "") for name, tp, _ in geometry_table() if name in al.KV_TABLE_MODELS}
    families = {(f"{v.base} tp1", v.name) for v in al.KV_FAMILIES}
    assert set(lowered) == (table | families) - {("Qwen3-8B tp1", "")}
    assert all(forms == set(cover) for forms in lowered.values())


def _shape(name: str, kv: bool) -> KernelShape:
    return replace(KernelShape.of(model(name).shard(1), 2, 4), kv_cache=kv)


def _bytes(buffers, name: str, source: str | None = None) -> int:
    return sum(b.nbytes for b in buffers if b.name.startswith(name) and source in (None, b.source))


@pytest.mark.parametrize("name", ["Qwen3-8B", "Qwen3-Next-80B-A3B", "MiMo-V2-Flash-qk", "Gemma-4-31B:full"])
def test_the_cache_write_adds_the_v_arm_slots_scales_and_store_buffers(name):
    bt, bh = 4, 2
    without, with_kv = _shape(name, False), _shape(name, True)
    before, after = ascend.ub_buffers(without, bt, bh), ascend.ub_buffers(with_kv, bt, bh)
    rows, row_lanes = bt * bh, next_pow2(with_kv.head_dim)
    widest = max(with_kv.padded_head_dim, row_lanes)
    assert ascend.arm_width(with_kv, "v") == row_lanes
    # v's tile, as a whole row, unless v was tiled already (v-norm)
    v_tile = 0 if without.v_norm else rows * row_lanes * 2
    assert _bytes(after, "qkv tile (", "gm") - _bytes(before, "qkv tile (", "gm") == v_tile
    assert _bytes(after, "slots (k + v arms)", "gm") == 2 * bt * 8
    assert _bytes(after, "slots (k + v arms)", "multibuffer") == 2 * bt * 8
    assert _bytes(after, "per-channel scales (k + v arms)") == bh * (with_kv.padded_head_dim + row_lanes) * 4
    # the widest cache form, int8 per channel: fp32 quotient + fp32 scales + 2 int8 tiles + a mask per element
    assert _bytes(after, "quantised fp32") + _bytes(after, "per-channel scales broadcast") \
        + _bytes(after, "cache tile") + _bytes(after, "cache store masks") == rows * widest * 11
    assert not any(b.name.startswith(("slots", "per-channel", "cache", "quantised")) for b in before)
    scales = next(b for b in after if b.name == "per-channel scales (k + v arms)")
    assert scales.worst_case and scales.source == "gm"


def test_kv_plans_fit_the_budget_and_tile_no_more_than_the_prologue():
    facts = ascend_facts()
    for name in ("Qwen3-8B", "Qwen3-Next-80B-A3B", "Gemma-4-31B:full", "Phi-3-mini"):
        plain, kv = ascend.plan(_shape(name, False), facts), ascend.plan(_shape(name, True), facts)
        assert kv.ub_bytes <= ascend.ub_budget(facts)
        assert kv.block_tokens * kv.block_heads <= plain.block_tokens * plain.block_heads


# ---------------------------------------------------------------------------------------------
# split_qkv_tp_rmsnorm_rope (MiniMax-M2's norm across heads): its UB model and its rows of the check


def test_ub_model_across_heads_has_weight_tiles_and_sums():
    shape = KernelShape.of(model("MiniMax-M2").shard(1), 2, 4)
    per_head = replace(shape, norm_across_heads=False)
    bt, bh = 4, 8
    across, before = ascend.ub_buffers(shape, bt, bh), ascend.ub_buffers(per_head, bt, bh)
    named = {b.name: b for b in across}
    assert named["weights [block_heads, D] (q + k arms)"].nbytes == 2 * bh * shape.padded_head_dim * 4
    assert named["sums of squares (q + k arms)"].nbytes == 2 * bt * 4
    assert named["sums of squares (q + k arms) (2nd buffer)"].source == "multibuffer"
    assert "weights + biases" in {b.name for b in before} and "weights + biases" not in named
    facts = ascend_facts(None)
    for tp in (1, 2, 4, 8, 16):
        g = model("MiniMax-M2").shard(tp)
        s = KernelShape.of(g, 2, 4)
        assert s.norm_across_heads
        assert ascend.plan(s, facts).ub_bytes <= ascend.ub_budget(facts)
        assert ascend.sums_plan(s, facts).ub_bytes <= ascend.ub_budget(facts)


def test_lowering_check_covers_both_kernels_of_the_minimax_rows():
    labels = {label for label, _, _ in al.plan_jobs()}
    for name in ("MiniMax-M2", "MiniMax-M2.5"):
        for tp in (1, 2, 4, 8, 16):
            assert {f"{name} tp{tp}", f"{name} tp{tp} [sums]"} <= labels
