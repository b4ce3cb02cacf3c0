"""``report``: msprof / torch_npu / torch.profiler layouts, bytes, bandwidth, side by side, PNG."""

import json
import shutil

import pytest

from cli_helpers import assert_one_line_error
from vllm_ascend_ext.bench import bytes_moved
from vllm_ascend_ext.cli.report import tensor_bytes
from vllm_ascend_ext.ops.models import model

#: The fixtures' run: Qwen3-8B at tp 1, 4096 tokens, bf16 qkv, fp32 cache, 5 prologues.
FLOOR = bytes_moved(model("Qwen3-8B").shard(1), 4096, 2, 4)


def _report(cli, path, *argv):
    result = cli("report", path, "--json", "--no-png", *argv)
    assert result.code == 0, result.err
    data = json.loads(result.out)
    kernels = {(k["group"], k["name"]): k for k in data["kernels"]}
    groups = {g["group"]: g for g in data["groups"]}
    return data, kernels, groups


def _durations(path, column):
    import csv

    with open(path, newline="") as handle:
        return [float(row[column]) for row in csv.DictReader(handle)]


def test_msprof_runs_side_by_side(cli, fixtures):
    data, kernels, groups = _report(cli, fixtures / "msprof")
    assert data["floor_bytes"] == FLOOR and data["iterations"] == 5
    ours = kernels[("ours", "_split_qkv_rmsnorm_rope_kernel")]
    csv_path = next((fixtures / "msprof" / "ours").rglob("op_summary_*.csv"))
    expected = _durations(csv_path, "Task Duration(us)")[2:]  # the first two rows are set-up
    assert ours["calls"] == 5
    assert ours["total_us"] == pytest.approx(sum(expected))
    assert ours["nbytes"] == FLOOR and ours["bytes_from"] == "geometry"
    assert ours["gbps"] == pytest.approx(FLOOR / (sum(expected) / 5) / 1e3)
    norm = kernels[("eager", "aclnnRmsNorm_RmsNorm_RmsNorm")]
    q_bytes = 2 * (4096 * 32 * 128 * 2) + 128 * 2 + 4096 * 32 * 4
    k_bytes = 2 * (4096 * 8 * 128 * 2) + 128 * 2 + 4096 * 8 * 4
    assert norm["calls"] == 10 and norm["bytes_from"] == "shapes"
    assert norm["nbytes"] == (q_bytes + k_bytes) // 2
    # set-up kernels (fewer launches than prologues) are listed but not compared
    assert ("ours/setup", "aclnnCast_Cast_Cast") in kernels
    assert set(groups) == {"ours", "eager"}
    assert groups["ours"]["launches_per_prologue"] == 1
    assert groups["eager"]["launches_per_prologue"] == 6
    assert groups["ours"]["us_per_prologue"] == pytest.approx(sum(expected) / 5)
    assert groups["eager"]["vs_fastest"] > 1 == groups["ours"]["vs_fastest"]


def test_text_report_and_peak(cli, fixtures):
    result = cli("report", fixtures / "msprof", "--no-png", "--peak-gbps", "1600")
    assert result.code == 0
    lines = result.out.splitlines()
    assert lines[0].split()[:3] == ["group", "kernel", "calls"]
    assert any(line.startswith("ours ") and "_split_qkv_rmsnorm_rope_kernel" in line for line in lines)
    assert "device peak: 1600 GB/s (--peak-gbps)" in result.out
    assert "x fastest" in result.out


def test_kernel_details_grouped_by_pattern(cli, fixtures):
    data, kernels, groups = _report(cli, fixtures / "torch_npu" / "kernel_details.csv",
                                    "--model", "Qwen3-8B", "--tokens", "64")
    assert set(groups) == {"fused", "unfused", "other"}
    assert kernels[("fused", "_split_qkv_rmsnorm_rope_kernel")]["nbytes"] == bytes_moved(
        model("Qwen3-8B").shard(1), 64, 2, 4)
    assert kernels[("other", "aclnnMatmul_MatMulCommon_MatMulV2")]["nbytes"] == 2 * (64 * 4096 + 6144 * 4096 + 64 * 6144)
    assert groups["unfused"]["kernels"] == 2
    assert data["iterations"] is None


def test_msprof_op_basic_info(cli, fixtures):
    data, kernels, _ = _report(cli, fixtures / "msprof_op", "--model", "Qwen3-8B", "--tokens", "4096")
    fused = kernels[("fused", "_split_qkv_rmsnorm_rope_kernel")]
    assert fused["calls"] == 1 and fused["total_us"] == pytest.approx(61.25)


def test_torch_profiler_trace_uses_the_gpu_peak(cli, fixtures):
    data, kernels, groups = _report(cli, fixtures / "torch")
    assert data["peak_gbps"] == 4800.0
    ours = kernels[("ours", "_split_qkv_rmsnorm_rope_kernel")]
    assert ours["calls"] == 5 and ours["total_us"] == pytest.approx(5 * 21.5 + 0.1 * (0 + 1 + 2 + 3 + 4))


def test_png_is_written(cli, fixtures, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "out" / "report.png"
    result = cli("report", fixtures / "msprof", "--png", png)
    assert result.code == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"plot: {png}" in result.out


@pytest.mark.parametrize("name, fragment", [
    ("op_summary_empty.csv", "is empty"),
    ("op_summary_header_only.csv", "no rows"),
    ("op_summary_missing_duration.csv", "missing column 'Task Duration(us)'"),
    ("op_summary_bad_number.csv", "'fast' is not a number"),
    ("kernel_details.csv", "missing column 'Name'"),
    ("notes.csv", "not a profile CSV"),
    ("trace_invalid.json", "not valid JSON"),
    ("trace_no_kernels.json", "no GPU kernel events"),
])
def test_bad_files_are_one_line_errors(cli, fixtures, name, fragment):
    assert_one_line_error(cli("report", fixtures / "bad" / name, "--no-png"), 2, fragment)


def test_bad_file_inside_a_folder_is_named(cli, fixtures, tmp_path):
    shutil.copytree(fixtures / "msprof", tmp_path / "run")
    target = next((tmp_path / "run" / "eager").rglob("op_summary_*.csv"))
    target.write_text("")
    assert_one_line_error(cli("report", tmp_path / "run", "--no-png"), 2, str(target))


@pytest.mark.parametrize("argv, fragment", [
    (("--model", "Qwen3-8B"), "--tokens"),
    (("--tokens", "64"), "--model"),
    (("--model", "Nope", "--tokens", "4"), "unknown model"),
    (("--peak-gbps", "-1"), "--peak-gbps"),
    (("--fused", "("), "regular expression"),
])
def test_bad_options_are_one_line_errors(cli, fixtures, argv, fragment):
    path = fixtures / "torch_npu" / "kernel_details.csv"
    assert_one_line_error(cli("report", path, "--no-png", *argv), 2, fragment)


def test_missing_path_and_empty_folder(cli, tmp_path):
    assert_one_line_error(cli("report", tmp_path / "nowhere", "--no-png"), 2, "no such file")
    assert_one_line_error(cli("report", tmp_path, "--no-png"), 2, "no op_summary")


@pytest.mark.parametrize("shapes, dtypes, expected", [
    ("4096,6144;128", "DT_BF16;FLOAT", 4096 * 6144 * 2 + 128 * 4),
    ("4096", "INT64", 4096 * 8),
    (";4,4", "FLOAT16;FLOAT16", 2 + 32),
    ("N/A", "N/A", None),
    ("4,4;4", "FLOAT", None),
    ("4,4", "COMPLEX_WEIRD", None),
])
def test_tensor_bytes(shapes, dtypes, expected):
    assert tensor_bytes(shapes, dtypes) == expected
