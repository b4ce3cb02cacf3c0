"""Issue-10 leftovers on the H200: (a) where the small-batch plan should hand over to the large one
for chunked-tail and mRoPE geometries; (b) large-plan knobs at T >= 4096. Prints one line a timing."""
import dataclasses
import itertools
import sys

import torch

from vllm_ascend_ext.bench import _Timer, copy_bandwidth, bytes_moved, make_inputs
from vllm_ascend_ext.ops import split_qkv_rmsnorm_rope, tiling
from vllm_ascend_ext.ops.device import cuda_facts
from vllm_ascend_ext.ops.models import model
from vllm_ascend_ext.ops.tiling import KernelShape, cuda

device = torch.device("cuda")
timer = _Timer(device, 0)
facts = cuda_facts(torch.cuda.current_device())
bw = copy_bandwidth(device, timer)
GEOS = [("Qwen3-Next-80B-A3B", 1), ("Qwen3-VL-8B", 1), ("Qwen3-32B", 8)]
part = sys.argv[1]


def t(g, n, plan):
    inputs = make_inputs(g, n, device)
    with tiling.forced(plan=plan):
        return timer(lambda: split_qkv_rmsnorm_rope(**inputs))


for name, tp in GEOS:
    g = model(name).shard(tp)
    shape = KernelShape.of(g, 2, 4)
    if part == "handover":
        small, large = cuda.small_batch_plan(shape, facts), cuda.plan(shape, facts)
        print(g.label, "handover now at", cuda.small_batch_max_tokens(shape, facts), flush=True)
        for n in (128, 192, 256, 384, 512, 768, 1024, 2048):
            floor = bytes_moved(g, n) / bw * 1e6
            print(f"{g.label:24} T={n:5d} small {t(g, n, small):7.2f} large {t(g, n, large):7.2f} copy-floor {floor:6.2f}",
                  flush=True)
    else:
        for n in (4096, 16384):
            floor = bytes_moved(g, n) / bw * 1e6
            now = t(g, n, cuda.plan(shape, facts))
            print(f"{g.label:24} T={n:5d} current {now:7.2f} floor {floor:6.2f}", flush=True)
            knobs = itertools.product((2048, 4096, 8192), (32,), (4, 8, 16),
                                      (128, 1024) if shape.pass_dim else (128,))
            for tile, per_thread, per_sm, chunk in knobs:
                p = cuda.plan(shape, facts, tile_elements=tile, elements_per_thread=per_thread,
                              programs_per_sm=per_sm, chunk_tail_min_lanes=chunk)
                for late in sorted({p.late_rows, not p.late_rows}):
                    q = dataclasses.replace(p, late_rows=late)
                    print(f"{g.label:24} T={n:5d} tile={tile} pt={per_thread} psm={per_sm} chunk={chunk} "
                          f"late={late} warps={q.num_warps} bt={q.block_tokens} {t(g, n, q):7.2f}", flush=True)
