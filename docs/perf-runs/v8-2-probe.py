"""v8 probe 3: mRoPE lane rows on/off with the KV write, same run; run once per kernel source."""
import dataclasses, sys
import torch
from vllm_ascend_ext.bench import _Timer, bytes_moved, copy_replay, make_kv_inputs
from vllm_ascend_ext.ops import split_qkv_rmsnorm_rope_kv_cache, tiling
from vllm_ascend_ext.ops.device import cuda_facts
from vllm_ascend_ext.ops.models import model
from vllm_ascend_ext.ops.tiling import KernelShape, cuda
device = torch.device("cuda"); timer = _Timer(device, 0); facts = cuda_facts(torch.cuda.current_device())
R = dataclasses.replace
for name, tp in (("Qwen3-VL-8B", 1), ("Qwen3-8B", 1), ("Qwen3-32B", 8)):
    g = model(name).shard(tp)
    shape = R(KernelShape.of(g, 2, 4), kv_cache=True)
    for n in (256, 4096, 16384):
        copy = copy_replay(device, timer, bytes_moved(g, n, kv_cache=True))
        args, cache = make_kv_inputs(g, n, device)
        base = cuda.plan_for_tokens(shape, facts, n)
        for rep in range(2):
            for label, plan in {"lane": R(base, lane_rows=True), "blocks": R(base, lane_rows=False)}.items():
                if label == "lane" and g.mrope_section is None:
                    continue
                with tiling.forced(plan=plan):
                    us = timer(lambda: split_qkv_rmsnorm_rope_kv_cache(**args, **cache))
                print(f"{sys.argv[1]} {g.label:28} T={n:5d} {label:7} rep{rep} {us:8.2f} copy {copy:8.2f} {us / copy:5.2f}", flush=True)
