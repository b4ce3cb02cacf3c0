# v12 call 2: build/split_e12.py as in v12-0-device-run.sh, build/cuda_head.py is
# ops/tiling/cuda.py at 879afe7, build/ab2.py is v12-2-ab.py; site D is the tree at 4d8110f plus
# the small-batch grid rule of d6c322f.
# C: E1 + E2 with HEAD's tiling; D: the working tree (E1 + E2 + E3 v before k's stores, small plans 16/SM)
mkdir -p build/site-C build/site-D && rm -rf build/site-C/* build/site-D/*
for n in C D; do cp -r vllm_ascend_ext build/site-$n/ && cp -r ops build/site-$n/vllm_ascend_ext/ops; done
cp build/split_e12.py build/site-C/vllm_ascend_ext/ops/split_qkv_rmsnorm_rope.py
cp build/cuda_head.py build/site-C/vllm_ascend_ext/ops/tiling/cuda.py
S=$SECONDS
for r in 0 1; do for n in C D; do PYTHONPATH=$PWD/build/site-$n timeout 150 python3 -P build/ab2.py $n$r >> $OUT/ab2.log 2>&1; echo "ab $n$r rc=$? $((SECONDS-S))s"; done; done
export PYTHONPATH=$PWD/build/site-D
timeout 100 python3 -P scripts/bench_split_qkv_rmsnorm_rope.py --providers ours --no-progress --out $OUT/bench > $OUT/v12-bench-h200.txt 2>&1; echo "bench rc=$? $((SECONDS-S))s"
timeout 170 python3 -P scripts/bench_split_qkv_rmsnorm_rope_kv_cache.py --no-progress --out $OUT/bench-kv > $OUT/v12-kv-bench-h200.txt 2>&1; echo "kvbench rc=$? $((SECONDS-S))s"
rm -f $OUT/bench/*.json $OUT/bench-kv/*.json $OUT/bench-kv/*.png
L=$((585-SECONDS)); echo "tests budget $L"
timeout $L bash scripts/gpu_tests.sh tests/ops/test_split_qkv_rmsnorm_rope_kv_cache.py -x -k "Next or whole or cuda-small or graph or quantised or test_large" > $OUT/v12-gpu-kv-h200.txt 2>&1; echo "tests rc=$? $((SECONDS-S))s"
tail -3 $OUT/v12-gpu-kv-h200.txt
