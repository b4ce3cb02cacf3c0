set -u
mkdir -p build/gpu-site && rm -rf build/gpu-site/* && cp -r vllm_ascend_ext build/gpu-site/ && cp -r ops build/gpu-site/vllm_ascend_ext/ops
export PYTHONPATH=$PWD/build/gpu-site
timeout 60 python3 -P build/v13-3-probe.py > $OUT/v13-3-probe-h200.log 2>&1; echo "probe3 rc=$?"
for w in kv pro copy2048 copy8192; do
  echo "=== $w"
  timeout 90 /usr/local/cuda/bin/ncu --cache-control none --clock-control none --launch-skip 20 --launch-count 1 -k regex:'_split_qkv|copy_kernel' --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis --section SchedulerStats python3 -P build/v13-4-ncu.py $w 2>&1 | grep -v "^==PROF==\|^\[" 
done > $OUT/v13-4-ncu-h200.txt 2>&1; echo "ncu rc=$?"
timeout 300 python3 -P build/v13-2-probe.py > $OUT/v13-2-probe-h200.log 2>&1; echo "probe2 rc=$?"
tail -n 3 $OUT/v13-2-probe-h200.log; cat $OUT/v13-3-probe-h200.log
