set -u
S=$SECONDS
mkdir -p build/gpu-site && rm -rf build/gpu-site/* && cp -r vllm_ascend_ext build/gpu-site/ && cp -r ops build/gpu-site/vllm_ascend_ext/ops
export PYTHONPATH=$PWD/build/gpu-site
timeout 400 python3 -P build/ab16/sweep3.py > $OUT/v15-3-sweep-h200.log 2>&1; echo "sweep rc=$? $((SECONDS-S))s"
tail -n 12 $OUT/v15-3-sweep-h200.log | cut -c1-300
