"""Compile one geometry's CUDA plan (argv: model, TP, kv|pro, small|large, output stem) on the CPU and
write its cubin, TTGIR and SASS (cuobjdump): how the v13 load order was read and how the landed kernel
was compared with b0b08ef and the A/B variants, instruction for instruction."""
import sys, re, subprocess, glob
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from vllm_ascend_ext.ops import cuda_compile
from vllm_ascend_ext.ops.cuda_compile import _kernel, _DIVISIBLE, TARGET_ARCH
from vllm_ascend_ext.ops.split_qkv_rmsnorm_rope import _split_qkv_rmsnorm_rope_kernel as kernel
from vllm_ascend_ext.ops.models import model
name, tp, kvs, small, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == "small", sys.argv[5]
g = model(name).shard(tp)
kv = cuda_compile.KVForm("nhd", "bf16", False) if kvs == "kv" else None
shape, plan, signature, constexprs = _kernel(g, small, None, kv)
attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(signature) if n in _DIVISIBLE}
signature |= {n: "constexpr" for n in constexprs}
c = triton.compile(ASTSource(kernel, signature, constexprs=constexprs, attrs=attrs), target=GPUTarget("cuda", TARGET_ARCH, 32), options=plan.launch_options)
open(out + ".cubin", "wb").write(c.asm["cubin"]); open(out + ".ttgir", "w").write(c.asm["ttgir"])
cuobj = glob.glob(".venv/main/lib/python3*/site-packages/triton/backends/nvidia/bin/cuobjdump")[0]
open(out + ".sass", "w").write(subprocess.run([cuobj, "-sass", out + ".cubin"], capture_output=True, text=True).stdout)
print(plan)
