"""``report``: msprof / torch_npu / torch.profiler layouts, bytes, bandwidth, side by side, PNG."""

import json
import shutil

import pytest

from cli_helpers import assert_one_line_error
from vllm_ascend_ext.bench.cases import bytes_moved
from vllm_ascend_ext.cli.profile_readers import FUSED_PATTERN, UNFUSED_PATTERN, tensor_bytes
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
    ours = kernels[("ours", "split_qkv_rmsnorm_rope_kernel")]
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
    assert any(line.startswith("ours ") and "split_qkv_rmsnorm_rope_kernel" in line for line in lines)
    assert "device peak: 1600 GB/s (--peak-gbps)" in result.out
    assert "x fastest" in result.out


def test_kernel_details_grouped_by_pattern(cli, fixtures):
    data, kernels, groups = _report(cli, fixtures / "torch_npu" / "kernel_details.csv",
                                    "--model", "Qwen3-8B", "--tokens", "64")
    assert set(groups) == {"fused", "unfused", "other"}
    assert kernels[("fused", "split_qkv_rmsnorm_rope_kernel")]["nbytes"] == bytes_moved(
        model("Qwen3-8B").shard(1), 64, 2, 4)
    matmul = kernels[("other", "aclnnMatmul_MatMulCommon_MatMulV2")]
    assert matmul["nbytes"] == 2 * (64 * 4096 + 6144 * 4096 + 64 * 6144)
    assert groups["unfused"]["kernels"] == 2
    assert data["iterations"] is None


def test_msprof_op_basic_info(cli, fixtures):
    data, kernels, _ = _report(cli, fixtures / "msprof_op", "--model", "Qwen3-8B", "--tokens", "4096")
    fused = kernels[("fused", "split_qkv_rmsnorm_rope_kernel")]
    assert fused["calls"] == 1 and fused["total_us"] == pytest.approx(61.25)


def test_torch_profiler_trace_uses_the_gpu_peak(cli, fixtures):
    data, kernels, groups = _report(cli, fixtures / "torch")
    assert data["peak_gbps"] == 4800.0
    ours = kernels[("ours", "split_qkv_rmsnorm_rope_kernel")]
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


def _trace(path, dur):
    """A one-kernel Chrome trace whose kernel event has ``dur`` written as the JSON text given."""
    path.write_text('{"traceEvents": [{"cat": "kernel", "ph": "X", "name": "k", "ts": 0, "dur": %s}]}' % dur)
    return path


@pytest.mark.parametrize("dur", ["NaN", "Infinity", "-Infinity", "-2.5", '"nan"', "true", '"21.5"', "9" * 400])
def test_trace_durations_that_are_not_durations_are_refused(cli, tmp_path, dur):
    path = _trace(tmp_path / "trace.json", dur)
    assert_one_line_error(cli("report", path, "--no-png"), 2, str(path), "'dur'")


def test_trace_duration_of_zero_is_a_duration(cli, tmp_path):
    data, kernels, _ = _report(cli, _trace(tmp_path / "trace.json", "0"))
    assert kernels[("other", "k")]["total_us"] == 0.0


@pytest.mark.parametrize("field, value", [("tokens", "abc"), ("dtype", "int8"), ("iterations", "x"), ("tp", "two"),
                                          ("tp", 0), ("tokens", -4), ("cache_dtype", 4), ("model", 7),
                                          ("iterations", 10 ** 400), ("tokens", 2 ** 31), ("tp", True)],
                         ids=lambda v: f"{str(v)[:8]}...{len(str(v))}" if len(str(v)) > 12 else None)
def test_malformed_workload_fields_name_the_file_and_field(cli, fixtures, tmp_path, field, value):
    shutil.copytree(fixtures / "torch", tmp_path / "run")
    sidecar = tmp_path / "run" / "ours" / "workload.json"
    meta = json.loads(sidecar.read_text())
    meta[field] = value
    sidecar.write_text(json.dumps(meta))
    assert_one_line_error(cli("report", tmp_path / "run", "--no-png"), 2, str(sidecar), repr(field))


@pytest.mark.parametrize("name", ["out.xyz", "noext", "report.png.txt"])
def test_png_must_be_a_png_file(cli, fixtures, tmp_path, name):
    pytest.importorskip("matplotlib")
    result = cli("report", fixtures / "msprof", "--png", tmp_path / name)
    assert_one_line_error(result, 2, "--png", ".png")
    assert list(tmp_path.iterdir()) == []


def test_png_in_an_unwritable_place_is_refused_before_reading(cli, fixtures, tmp_path):
    pytest.importorskip("matplotlib")
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert_one_line_error(cli("report", tmp_path / "missing-profile", "--png", blocker / "r.png"), 2, "--png")


def test_png_upper_case_suffix_is_written_where_printed(cli, fixtures, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "R.PNG"
    result = cli("report", fixtures / "msprof", "--png", png)
    assert result.code == 0, result.err
    assert f"plot: {png}\n" in result.out and png.read_bytes()[:4] == b"\x89PNG"


def test_csv_field_over_the_csv_modules_limit_is_one_line(cli, tmp_path):
    import csv

    path = tmp_path / "op_summary_huge.csv"
    path.write_text('Op Name,Task Duration(us)\n"' + "x" * (csv.field_size_limit() + 1) + '",1.0\n')
    assert_one_line_error(cli("report", path, "--no-png"), 2, str(path), "line")


def test_tp_zero_is_refused(cli, fixtures):
    result = cli("report", fixtures / "torch_npu" / "kernel_details.csv", "--no-png", "--model", "Qwen3-8B",
                 "--tokens", "64", "--tp", "0")
    assert_one_line_error(result, 2, "--tp")


def test_tp_without_model_is_refused(cli, fixtures):
    assert_one_line_error(cli("report", fixtures / "torch_npu" / "kernel_details.csv", "--no-png", "--tp", "2"),
                          2, "--tp")


def test_tp_is_applied_to_the_geometry(cli, fixtures):
    data, _, _ = _report(cli, fixtures / "torch_npu" / "kernel_details.csv", "--model", "Qwen3-8B",
                         "--tokens", "64", "--tp", "2")
    assert data["floor_bytes"] == bytes_moved(model("Qwen3-8B").shard(2), 64, 2, 4)


def test_negative_tensor_sizes_are_refused(cli, tmp_path):
    path = tmp_path / "op_summary_neg.csv"
    path.write_text("Op Name,Task Duration(us),Input Shapes,Input Data Types,Output Shapes,Output Data Types\n"
                    'k,2.0,"-4096,128",DT_BF16,"4096,128",DT_BF16\n')
    assert_one_line_error(cli("report", path, "--no-png"), 2, str(path), "line 2", "negative")
    with pytest.raises(ValueError, match="shapes"):
        tensor_bytes("4,-1", "FLOAT")


def test_model_whose_geometry_the_op_refuses_is_one_line(cli, fixtures, tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 15}))
    result = cli("report", fixtures / "torch_npu" / "kernel_details.csv", "--no-png", "--model", config,
                 "--tokens", "8")
    assert_one_line_error(result, 2, str(config), "head_dim")


def test_arguments_give_run_the_subcommands_defaults(fixtures, tmp_path, capsys):
    """What ``profile`` calls in-process: ``report``'s own options, here with a PNG."""
    pytest.importorskip("matplotlib")
    from vllm_ascend_ext.cli import report

    png = tmp_path / "report.png"
    args = report.arguments(fixtures / "msprof", png=png)
    assert (args.fused, args.unfused, args.tp, args.no_png) == (FUSED_PATTERN, UNFUSED_PATTERN, None, False)
    assert report.run(args) == 0
    assert png.read_bytes()[:4] == b"\x89PNG" and f"plot: {png}" in capsys.readouterr().out


# Issue 29: the JSON files report reads (traces, workload.json) are read as plan reads a config.

def test_trace_nested_too_deep_names_the_file_field_and_line(cli, tmp_path):
    path = tmp_path / "trace.json"
    path.write_text('{"traceEvents": [\n{"cat": "kernel", "ph": "X", "name": "k", "dur": 1, "args": '
                    + "[" * 100_000 + "]" * 100_000 + "}]}")
    assert_one_line_error(cli("report", path, "--no-png"), 2, str(path), "traceEvents[0].args", "line 2",
                          "more than 64 levels")


def test_trace_integer_too_long_for_python_names_the_file_and_field(cli, tmp_path):
    path = _trace(tmp_path / "trace.json", "1" * 5000)
    assert_one_line_error(cli("report", path, "--no-png"), 2, str(path), "traceEvents[0].dur", "5000 digits")


@pytest.mark.parametrize("text, fragments", [
    ('{"tokens": %s}' % ("4" * 5000), ["tokens", "5000 digits"]),
    ('{"tokens": ' + "[" * 100_000 + "]" * 100_000 + "}", ["tokens[0]", "more than 64 levels"]),
    ("", ["is empty"]),
    ("{tokens", ["not valid JSON"]),
], ids=["long-int", "deep", "empty", "invalid"])
def test_workload_json_that_is_not_json_names_the_file(cli, fixtures, tmp_path, text, fragments):
    shutil.copytree(fixtures / "torch", tmp_path / "run")
    sidecar = tmp_path / "run" / "ours" / "workload.json"
    sidecar.write_text(text)
    result = cli("report", tmp_path / "run", "--no-png")
    assert_one_line_error(result, 2, str(sidecar), *fragments)
    assert len(result.err) < 300
