"""v13 probe 3: what an argument list costs a launch. Two kernels that do nothing (a store no program
reaches), one with 4 pointer arguments, one with 16 pointers and 36 int32 scalars (the prologue's
kernel has 17 and 38), 1055 programs of 2 warps (8/1/128's grid at T = 4096) and 1 program; one call
a graph and 20; three interleaved repeats."""
import sys, torch
sys.path.insert(0, "build")
from v13_args import few, many  # v13-3-args.py, run as build/v13_args.py
from vllm_ascend_ext.bench import _Timer
timer = _Timer(torch.device("cuda"), 0)
buf = torch.zeros(16, device="cuda")
ints = list(range(3, 39))
for rep in range(3):
    for grid in (1, 1055):
        for calls in (1, 20):
            f = timer(lambda: few[(grid,)](buf, buf, buf, buf, num_warps=2), calls)
            m = timer(lambda: many[(grid,)](*([buf] * 16), *ints, num_warps=2), calls)
            print(f"rep{rep} grid {grid:5d} x{calls:<2d} few {f:6.2f} many {m:6.2f} us", flush=True)
