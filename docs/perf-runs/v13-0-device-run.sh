set -u
mkdir -p build/gpu-site && rm -rf build/gpu-site/* && cp -r vllm_ascend_ext build/gpu-site/ && cp -r ops build/gpu-site/vllm_ascend_ext/ops
export PYTHONPATH=$PWD/build/gpu-site
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 330 python3 -P build/v13-0-probe.py > $OUT/v13-0-probe-h200.log 2>&1; echo "probe0 rc=$?"
timeout 200 python3 -P build/v13-1-probe.py > $OUT/v13-1-probe-h200.log 2>&1; echo "probe1 rc=$?"
tail -3 $OUT/v13-0-probe-h200.log $OUT/v13-1-probe-h200.log
