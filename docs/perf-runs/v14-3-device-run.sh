set -u
S=$SECONDS
mkdir -p build/gpu-site && rm -rf build/gpu-site/* && cp -r vllm_ascend_ext build/gpu-site/ && cp -r ops build/gpu-site/vllm_ascend_ext/ops
export PYTHONPATH=$PWD/build/gpu-site
timeout 330 python3 -P build/ab14/ab.py > $OUT/v14-3-ab-h200.log 2>&1; echo "ab rc=$? $((SECONDS-S))s"
L=$((560-SECONDS)); echo "probe budget $L"
timeout $L python3 -P build/v14-2-probe.py > $OUT/v14-2-probe-h200.log 2>&1; echo "probe rc=$? $((SECONDS-S))s"
