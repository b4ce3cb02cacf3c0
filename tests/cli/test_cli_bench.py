"""``bench``: the benchmark core behind a progress bar, on the detected device (CPU here)."""

import io
import json

import pytest

from cli_helpers import assert_one_line_error
from vllm_ascend_ext.cli.common import Progress, detect_backend
from vllm_ascend_ext.ops.models import BENCH_GEOMETRIES

pytestmark = pytest.mark.skipif(detect_backend().name != "cpu", reason="sizes chosen for the CPU interpreter")


def test_cpu_bench_checks_times_and_writes_outputs(cli, tmp_path):
    result = cli("bench", "--tokens", "1", "--providers", "ours", "--out", tmp_path)
    assert result.code == 0, result.err
    assert "mean nothing for NPU or GPU speed" in result.err + result.out
    table = [line for line in result.out.splitlines() if line.split() and line.split()[-1].endswith(("e-03", "e-04"))]
    assert len(table) == len(BENCH_GEOMETRIES)
    bar_lines = [line for line in result.err.splitlines() if line.startswith("bench [")]
    assert bar_lines[-1].startswith(f"bench [{'#' * Progress.WIDTH}] {len(BENCH_GEOMETRIES)}/{len(BENCH_GEOMETRIES)}")
    rows = json.loads((tmp_path / "bench_split_qkv_rmsnorm_rope.json").read_text())["rows"]
    assert {row["provider"] for row in rows} == {"ours"} and len(rows) == len(BENCH_GEOMETRIES)
    assert (tmp_path / "bench_split_qkv_rmsnorm_rope.csv").is_file()


def test_no_progress_draws_no_bar(cli, tmp_path):
    result = cli("bench", "--tokens", "1", "--providers", "ours", "--out", tmp_path, "--no-progress")
    assert result.code == 0
    assert "bench [" not in result.err


@pytest.mark.parametrize("argv, fragment", [
    (("--providers", "ours,fast"), "--providers"),
    (("--tokens", "0"), "--tokens"),
    (("--tokens", "a"), "--tokens"),
    (("--backend", "tpu"), "--backend"),
])
def test_bad_arguments_are_one_line_errors(cli, argv, fragment):
    assert_one_line_error(cli("bench", *argv), 2, fragment)


def test_progress_bar_lines_off_a_terminal():
    stream = io.StringIO()
    bar = Progress(3, label="x", stream=stream)
    for name in ("a", "b", "c"):
        bar.begin(name)
    assert bar.active
    bar.finish()
    lines = stream.getvalue().splitlines()
    assert [line.split()[2] for line in lines] == ["0/3", "1/3", "2/3", "3/3"]
    assert lines[-1].startswith("x [" + "#" * Progress.WIDTH + "]") and lines[-1].endswith("done")
    assert not bar.active


def test_progress_bar_redraws_in_place_on_a_terminal():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    stream = Tty()
    bar = Progress(2, stream=stream)
    bar.begin("a")
    bar.begin("b")
    bar.finish()
    text = stream.getvalue()
    assert text.count("\r\x1b[2K") == 3 and text.endswith("done\n") and text.count("\n") == 1
