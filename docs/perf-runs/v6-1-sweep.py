"""One-off H200 sweep for issue 10 (not shipped): two-piece tails and mRoPE plans."""
import json, sys, itertools
import torch
from vllm_ascend_ext import bench
from vllm_ascend_ext.ops import split_qkv_rmsnorm_rope as op
from vllm_ascend_ext.ops.models import AttentionGeometry as G
from vllm_ascend_ext.ops.tiling import KernelShape, forced, cuda
from vllm_ascend_ext.ops.tiling.cuda import CudaPlan
from vllm_ascend_ext.ops import device as dev

device = torch.device("cuda")
timer = bench._Timer(device, 50)
log = open(sys.argv[1], "w", buffering=1)
facts = dev.cuda_facts(0)
geos = {
    "16/2/256 R64 w+1": G(16, 2, 256, 64, weight_offset=1.0),
    "16/2/256 R64 w+1 gate": G(16, 2, 256, 64, weight_offset=1.0, q_gate=True),
    "32/4/512 R128 vnorm": G(32, 4, 512, 128, v_norm=True),
    "32/8/128 mrope-i": G(32, 8, 128, 128, mrope_section=(24, 20, 20), mrope_interleaved=True),
}
for name, g in geos.items():
    shape = KernelShape.of(g, 2, 4)
    for T in (1, 64, 256, 4096, 16384):
        args = bench.make_inputs(g, T, device, seed=T)
        copy = bench.copy_replay(device, timer, bench.bytes_moved(g, T))
        default = timer(lambda: op(**args))
        print(dict(geo=name, T=T, plan="default", us=round(default, 2), ratio=round(default / copy, 3)), file=log)
        bts = (1, 2) if T <= 256 else (2, 4, 8)
        for bt, warps, late, two in itertools.product(bts, (2, 4, 8), (False, True), (False, True)):
            if two and shape.pass_dim == 0:
                continue
            if not two and shape.pass_dim:
                continue  # the default chunked plans were swept in v5
            plan = CudaPlan(block_tokens=bt, block_heads=8, max_programs=facts.num_sms * 8,
                            kv_block_heads=min(8, max(1, g.num_kv_heads)), num_warps=warps,
                            late_rows=late, two_piece_tail=two)
            with forced(plan=plan):
                us = timer(lambda: op(**args))
            print(dict(geo=name, T=T, bt=bt, warps=warps, late=late, two=two, us=round(us, 2),
                       ratio=round(us / copy, 3)), file=log)
