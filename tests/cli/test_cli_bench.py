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


def test_bar_verdict_holds_each_over_bar_row_against_the_same_bytes_copy():
    """Rows over issue 2's bar are listed with what a plain copy of their bytes reached."""
    from vllm_ascend_ext.bench import Row, bar_verdict

    def row(tokens, provider, us, copy_us, floor_us=10.0, launch_us=4.0):
        return Row("m", 1, "g", tokens, provider, us, 0.0, 0, floor_us, launch_us, copy_us)

    lines = bar_verdict({"rows": [
        row(4096, "ours", 20.0, 19.5), row(4096, "compile", 30.0, 19.5),     # copy over the bar too
        row(16384, "ours", 14.0, 11.0), row(16384, "compile", 13.0, 11.0),   # copy within it; slower
        row(1, "ours", 5.0, 4.8),                                            # within the bar
    ]})
    assert lines[0] == "T>=4096: ours/floor worst 2.00 (FAIL <= 1.3)"
    assert lines[1] == "  over: g T=4096 2.00 (same-bytes copy 1.95: the copy is over the bar too)"
    assert lines[2] == "  over: g T=16384 1.40 (same-bytes copy 1.10: the copy is within it)"
    assert lines[3] == "T<=64: ours/launch worst 1.25 (PASS <= 1.3)"
    assert lines[4] == "ours faster than torch.compile at every T: FAIL (g T=16384)"
