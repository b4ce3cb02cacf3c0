set -u
for v in c0 c5 c6; do
  mkdir -p build/site-$v && rm -rf build/site-$v/* && cp -r vllm_ascend_ext build/site-$v/ && cp -r ops build/site-$v/vllm_ascend_ext/ops && cp build/ab/$v.py build/site-$v/vllm_ascend_ext/ops/split_qkv_rmsnorm_rope.py
done
for r in 0 1; do
  for v in c0 c5 c6; do
    PYTHONPATH=$PWD/build/site-$v timeout 120 python3 -P build/v13-5-ab.py "r$r-$v" >> $OUT/v13-5-ab-h200.log 2>&1 || echo "r$r-$v rc=$?"
  done
done
echo done; grep -c . $OUT/v13-5-ab-h200.log; grep -i "error\|Traceback" $OUT/v13-5-ab-h200.log | head
