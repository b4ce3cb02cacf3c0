set -u
S=$SECONDS
for v in c0 c5 c7; do
  mkdir -p build/site-$v && rm -rf build/site-$v/* && cp -r vllm_ascend_ext build/site-$v/ && cp -r ops build/site-$v/vllm_ascend_ext/ops && cp build/ab/$v.py build/site-$v/vllm_ascend_ext/ops/split_qkv_rmsnorm_rope.py
done
for v in c0 c5 c7 c0; do
  PYTHONPATH=$PWD/build/site-$v timeout 60 python3 -P build/v13-6-ab.py "r0-$v" >> $OUT/v13-6-ab-h200.log 2>&1 || echo "$v rc=$?"
done
echo "ab $((SECONDS-S))s"
mkdir -p build/gpu-site && rm -rf build/gpu-site/* && cp -r vllm_ascend_ext build/gpu-site/ && cp -r ops build/gpu-site/vllm_ascend_ext/ops
export PYTHONPATH=$PWD/build/gpu-site
timeout 100 python3 -P scripts/bench_split_qkv_rmsnorm_rope.py --providers ours --no-progress --out $OUT/bench > $OUT/v13-bench-h200.txt 2>&1; echo "bench rc=$? $((SECONDS-S))s"
timeout 170 python3 -P scripts/bench_split_qkv_rmsnorm_rope_kv_cache.py --no-progress --out $OUT/bench-kv > $OUT/v13-kv-bench-h200.txt 2>&1; echo "kvbench rc=$? $((SECONDS-S))s"
rm -f $OUT/bench/*.json $OUT/bench-kv/*.json $OUT/bench-kv/*.png $OUT/bench-kv/*.txt
timeout 130 bash scripts/gpu_tests.sh tests/ops/test_split_qkv_rmsnorm_rope_kv_cache.py -x -k "Next or whole or cuda-small or graph or quantised or test_large" > $OUT/v13-gpu-kv-h200.txt 2>&1; echo "gpu-kv rc=$? $((SECONDS-S))s"; tail -n 2 $OUT/v13-gpu-kv-h200.txt
L=$((585-SECONDS)); echo "tests budget $L"
timeout $L bash scripts/gpu_tests.sh tests/ops/test_split_qkv_rmsnorm_rope.py -x -k "Next or whole or cuda-small or graph or test_large" > $OUT/v13-gpu-tests-h200.txt 2>&1; echo "tests rc=$? $((SECONDS-S))s"
tail -n 3 $OUT/v13-gpu-tests-h200.txt
