set -u
S=$SECONDS
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
mkdir -p build/gpu-site && rm -rf build/gpu-site/* && cp -r vllm_ascend_ext build/gpu-site/ && cp -r ops build/gpu-site/vllm_ascend_ext/ops
export PYTHONPATH=$PWD/build/gpu-site
timeout 100 python3 -P scripts/bench_split_qkv_rmsnorm_rope.py --providers ours --no-progress --out $OUT/bench > $OUT/v16-4-bench-h200.txt 2>&1; echo "bench rc=$? $((SECONDS-S))s"
timeout 170 python3 -P scripts/bench_split_qkv_rmsnorm_rope_kv_cache.py --no-progress --out $OUT/bench-kv > $OUT/v16-4-kv-bench-h200.txt 2>&1; echo "kvbench rc=$? $((SECONDS-S))s"
rm -f $OUT/bench/*.json $OUT/bench-kv/*.json $OUT/bench-kv/*.txt
grep "^bar" $OUT/v16-4-bench-h200.txt $OUT/v16-4-kv-bench-h200.txt
timeout 140 bash scripts/gpu_tests.sh tests/ops/test_split_qkv_rmsnorm_rope.py -x -k "cuda-small or dependent or graph" > $OUT/v16-4-gpu-tests-h200.txt 2>&1; echo "gpu-pro rc=$? $((SECONDS-S))s"; tail -n 2 $OUT/v16-4-gpu-tests-h200.txt
timeout 140 bash scripts/gpu_tests.sh tests/ops/test_split_qkv_rmsnorm_rope_kv_cache.py -x -k "Next or whole or cuda-small or graph or quantised or test_large" > $OUT/v16-4-gpu-kv-h200.txt 2>&1; echo "gpu-kv rc=$? $((SECONDS-S))s"; tail -n 2 $OUT/v16-4-gpu-kv-h200.txt
