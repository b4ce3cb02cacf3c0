mkdir -p build/gpu-site && rm -rf build/gpu-site/* && cp -r vllm_ascend_ext build/gpu-site/ && cp -r ops build/gpu-site/vllm_ascend_ext/ops
export PYTHONPATH=$PWD/build/gpu-site
S=$SECONDS
timeout 130 python3 -P scripts/bench_split_qkv_rmsnorm_rope.py --providers ours --no-progress --out $OUT/bench > $OUT/v12-bench-h200.txt 2>&1; echo "bench rc=$? $((SECONDS-S))s"
timeout 200 python3 -P scripts/bench_split_qkv_rmsnorm_rope_kv_cache.py --no-progress --out $OUT/bench-kv > $OUT/v12-kv-bench-h200.txt 2>&1; echo "kvbench rc=$? $((SECONDS-S))s"
rm -f $OUT/bench/*.json $OUT/bench-kv/*.json $OUT/bench-kv/*.png $OUT/bench-kv/*.txt
L=$((585-SECONDS)); echo "tests budget $L"
timeout $L bash scripts/gpu_tests.sh tests/ops/test_split_qkv_rmsnorm_rope.py -x -k "Next or 3.5 or whole or cuda-small or graph or recompile or test_large" > $OUT/v12-gpu-tests-h200.txt 2>&1; echo "tests rc=$? $((SECONDS-S))s"
tail -3 $OUT/v12-gpu-tests-h200.txt
