set -u
S=$SECONDS
mkdir -p build/gpu-site && rm -rf build/gpu-site/* && cp -r vllm_ascend_ext build/gpu-site/ && cp -r ops build/gpu-site/vllm_ascend_ext/ops
export PYTHONPATH=$PWD/build/gpu-site
timeout 110 python3 -P scripts/bench_split_qkv_rmsnorm_rope.py --providers ours --no-progress --out $OUT/bench > $OUT/v14-4-bench-h200.txt 2>&1; echo "bench rc=$? $((SECONDS-S))s"
timeout 180 python3 -P scripts/bench_split_qkv_rmsnorm_rope_kv_cache.py --no-progress --out $OUT/bench-kv > $OUT/v14-4-kv-bench-h200.txt 2>&1; echo "kvbench rc=$? $((SECONDS-S))s"
rm -f $OUT/bench/*.json $OUT/bench-kv/*.json $OUT/bench-kv/*.png $OUT/bench-kv/*.txt $OUT/bench/*.txt
timeout 90 bash scripts/gpu_tests.sh tests/ops/test_split_qkv_rmsnorm_rope_kv_cache.py -x -k "mrope or Qwen3-VL or cuda-small or graph" > $OUT/v14-4-gpu-kv-mrope-h200.txt 2>&1; echo "gpu-kv rc=$? $((SECONDS-S))s"; tail -n 1 $OUT/v14-4-gpu-kv-mrope-h200.txt
L=$((585-SECONDS)); echo "tests budget $L"
timeout $L bash scripts/gpu_tests.sh tests/ops/test_split_qkv_rmsnorm_rope.py -x -k "Next or whole or cuda-small or graph or test_large" > $OUT/v14-4-gpu-tests-h200.txt 2>&1; echo "tests rc=$? $((SECONDS-S))s"
tail -n 2 $OUT/v14-4-gpu-tests-h200.txt
