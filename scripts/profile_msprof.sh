#!/usr/bin/env bash
# Profile the benchmark workload on an Ascend NPU with msprof, in both of its forms.
#
#   scripts/profile_msprof.sh OUT_DIR [workload options]
#
# workload options go to `python -m vllm_ascend_ext.cli.workload` (--model, --tp, --tokens,
# --iterations, --warmup); `vllm-ascend-ext profile` calls this script with them.
# Environment: PYTHON (default python3), PROVIDERS (default "eager compile ours"),
# KERNEL (the fused kernel's name for `msprof op`, default split_qkv_rmsnorm_rope_kernel),
# LAUNCH_COUNT (kernel launches `msprof op` collects, 1..100, default 5),
# DRY_RUN=1 (print the commands instead of running them).
#
# 1. Application form, once per provider: every kernel of the run with its duration, in
#    OUT_DIR/msprof/<provider>/PROF_*/mindstudio_profiler_output/op_summary_*.csv; the workload
#    writes OUT_DIR/msprof/<provider>/workload.json beside it for `vllm-ascend-ext report`.
#      msprof --application="<app and its arguments>" --output=<dir> [options]
#    --task-time=on (task durations into op_summary), --ai-core=on with the default
#    --aic-metrics=PipeUtilization (vector / MTE pipe ratios per kernel).
#    CANN docs, "General Collection Commands" (method 2, --application) and "Profiling Runtime
#    Data of AI Tasks" (--task-time, --ai-core, --aic-metrics):
#    https://www.hiascend.com/document/detail/en/canncommercial/850/devaids/profiling/atlasprofiling_16_1166.html
#    https://www.hiascend.com/document/detail/en/canncommercial/850/devaids/profiling/atlasprofiling_16_0011.html
# 2. Operator form, the fused kernel alone: `msprof op [options] app [arguments]` collects
#    --launch-count launches of the kernels whose names start with --kernel-name, into
#    OUT_DIR/msprof_op/OPPROF_*/ (OpBasicInfo.csv, PipeUtilization.csv, Memory.csv, ...,
#    visualize_data.bin for MindStudio Insight). CANN docs, msProf "Tool Usage" / options table:
#    https://www.hiascend.com/document/detail/en/canncommercial/850/devaids/optool/atlasopdev_16_00851.html
#    https://www.hiascend.com/document/detail/zh/canncommercial/850/devaids/optool/atlasopdev_16_0082.html
set -euo pipefail

if [[ $# -lt 1 || "$1" == -h || "$1" == --help ]]; then
    sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
    [[ $# -lt 1 ]] && exit 2 || exit 0
fi
out=$1
shift
python=${PYTHON:-python3}
providers=${PROVIDERS:-eager compile ours}
kernel=${KERNEL:-split_qkv_rmsnorm_rope_kernel}
launch_count=${LAUNCH_COUNT:-5}
workload="$python -m vllm_ascend_ext.cli.workload"

run() {
    if [[ "${DRY_RUN:-0}" == 1 ]]; then
        local arg line=""
        for arg in "$@"; do
            if [[ "$arg" == --*=*" "* ]]; then
                arg="${arg%%=*}=\"${arg#*=}\""
            elif [[ "$arg" == *" "* ]]; then
                arg="\"$arg\""
            fi
            line+="${line:+ }$arg"
        done
        printf '%s\n' "$line"
    else
        "$@"
    fi
}

if [[ "${DRY_RUN:-0}" != 1 ]] && ! command -v msprof >/dev/null; then
    echo "profile_msprof.sh: msprof is not on PATH: source CANN's set_env.sh first" >&2
    exit 1
fi

for provider in $providers; do
    dir="$out/msprof/$provider"
    run mkdir -p "$dir"
    run msprof --application="$workload --provider $provider --out $dir $*" --output="$dir" \
        --task-time=on --ai-core=on --aic-metrics=PipeUtilization
done

run mkdir -p "$out/msprof_op"
run msprof op --output="$out/msprof_op" --kernel-name="$kernel" --launch-count="$launch_count" \
    $workload --provider ours --out "$out/msprof_op" "$@"
