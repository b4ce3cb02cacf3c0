# v12 call 1 (run from the repository root with build/ carried): build/split_head.py is
# ops/split_qkv_rmsnorm_rope.py at 879afe7, split_e1.py that file with v12-0-e1.patch applied,
# split_e12.py with v12-0-e2.patch applied on top; build/ab.py and sweep1.py are v12-0-ab.py and
# v12-1-sweep.py.
# sites A (HEAD), B (E1: positions only for q/k tiles), C (E1 + E2: second-pass prefetch)
for v in A:split_head B:split_e1 C:split_e12; do
  n=${v%%:*}; f=${v##*:}
  mkdir -p build/site-$n && rm -rf build/site-$n/* && cp -r vllm_ascend_ext build/site-$n/ && cp -r ops build/site-$n/vllm_ascend_ext/ops && cp build/$f.py build/site-$n/vllm_ascend_ext/ops/split_qkv_rmsnorm_rope.py
done
bash build/mksites.sh
S=$SECONDS
for r in 0 1; do for n in A B C; do PYTHONPATH=$PWD/build/site-$n timeout 170 python3 -P build/ab.py $n$r >> $OUT/ab.log 2>&1; echo "ab $n$r rc=$? $((SECONDS-S))s"; done; done
PYTHONPATH=$PWD/build/site-C timeout $((580-SECONDS)) python3 -P build/sweep1.py > $OUT/sweep1.log 2>&1; echo "sweep rc=$? $((SECONDS-S))s"
