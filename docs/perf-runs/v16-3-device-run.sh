set -u
S=$SECONDS
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
mkdir -p build/gpu-site && rm -rf build/gpu-site/* && cp -r vllm_ascend_ext build/gpu-site/ && cp -r ops build/gpu-site/vllm_ascend_ext/ops
export PYTHONPATH=$PWD/build/gpu-site
timeout 300 python3 -P build/ab16/ab3.py > $OUT/v16-3-ab-h200.log 2>&1; echo "ab rc=$? $((SECONDS-S))s"
tail -n 3 $OUT/v16-3-ab-h200.log
