set -u
S=$SECONDS
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
mkdir -p build/gpu-site && rm -rf build/gpu-site/* && cp -r vllm_ascend_ext build/gpu-site/ && cp -r ops build/gpu-site/vllm_ascend_ext/ops
export PYTHONPATH=$PWD/build/gpu-site
timeout 200 python3 -P build/ab16/ab1.py > $OUT/v16-1-ab-h200.log 2>&1; echo "ab rc=$? $((SECONDS-S))s"
timeout 180 python3 -P scripts/bench_split_qkv_rmsnorm_rope_kv_cache.py --no-progress --out $OUT/bench-kv > $OUT/v16-2-kv-bench-h200.txt 2>&1; echo "kvbench rc=$? $((SECONDS-S))s"
rm -f $OUT/bench-kv/*.json $OUT/bench-kv/*.txt
timeout 150 bash scripts/gpu_tests.sh tests/ops/test_split_qkv_rmsnorm_rope_kv_cache.py -x -k "Next or whole or cuda-small or graph or quantised or test_large" > $OUT/v16-2-gpu-kv-h200.txt 2>&1; echo "gpu-kv rc=$? $((SECONDS-S))s"; tail -n 2 $OUT/v16-2-gpu-kv-h200.txt
timeout 40 bash scripts/gpu_tests.sh tests/ops/test_split_qkv_rmsnorm_rope.py -x -k "dependent or graph" > $OUT/v16-2-gpu-graph-h200.txt 2>&1; echo "gpu-graph rc=$? $((SECONDS-S))s"; tail -n 2 $OUT/v16-2-gpu-graph-h200.txt
