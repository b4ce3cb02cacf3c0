"""``bench``: the benchmark core behind a progress bar, on the detected device (CPU here)."""

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cli_helpers import assert_one_line_error
from vllm_ascend_ext import bench as core
from vllm_ascend_ext.backends import detect_backend
from vllm_ascend_ext.cli.common import Progress
from vllm_ascend_ext.ops.models import BENCH_GEOMETRIES

pytestmark = pytest.mark.skipif(detect_backend().name != "cpu", reason="sizes chosen for the CPU interpreter")


def test_cpu_bench_checks_times_and_writes_outputs(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = cli("bench", "--tokens", "1", "--providers", "ours", "--out", "out")
    assert result.code == 0, result.err
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # nothing written outside the output folder
    tmp_path = tmp_path / "out"
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


@pytest.fixture
def no_measuring(monkeypatch):
    """Make any measurement fail the test: what must be refused is refused before the run."""
    def measured(*args, **kwargs):
        raise AssertionError("the benchmark ran")

    monkeypatch.setattr(core, "run", measured)


def test_unwritable_out_is_refused_before_measuring(cli, tmp_path, no_measuring):
    blocker = tmp_path / "file"
    blocker.write_text("")
    for out in (blocker, blocker / "sub"):
        assert_one_line_error(cli("bench", "--tokens", "1", "--out", out), 2, "--out", str(out))


@pytest.mark.parametrize("name, value", [("VLLM_ASCEND_EXT_NUM_SMS", "garbage"), ("VLLM_ASCEND_EXT_SOC", "garbage"),
                                         ("VLLM_ASCEND_EXT_UB_BYTES", "1")])
def test_malformed_environment_is_refused_before_measuring(cli, tmp_path, monkeypatch, no_measuring, name, value):
    monkeypatch.setenv(name, value)
    assert_one_line_error(cli("bench", "--tokens", "1", "--out", tmp_path / "out"), 2, f"{name}={value!r}")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("backend, device", [("cuda", "CUDA GPU"), ("npu", "Ascend NPU")])
def test_absent_device_is_one_line_pointing_at_doctor(cli, tmp_path, no_measuring, backend, device):
    from vllm_ascend_ext.backends import unavailable_reason

    if unavailable_reason(backend) is None:
        pytest.skip(f"this machine has a {device}")
    result = cli("bench", "--backend", backend, "--out", tmp_path / "out")
    assert_one_line_error(result, 2, f"--backend {backend}", device, "vllm-ascend-ext doctor")
    assert not (tmp_path / "out").exists()


def test_the_bar_ends_when_the_library_returns(cli, tmp_path, monkeypatch):
    """The CLI calls the library's ``run`` with its bar as the callback and ends the bar itself."""
    seen = {}

    def fake_run(device, tokens, providers, progress=None, **kwargs):
        seen.update(device=device, tokens=tokens, providers=providers)
        for step in range(len(BENCH_GEOMETRIES) * len(tokens) * len(providers)):
            progress(f"step {step}")
        return {"rows": [], "meta": {"device": "cpu", "copy_bandwidth_GBps": float("nan"),
                                     "launch_floor_us": float("nan")}}

    monkeypatch.setattr(core, "run", fake_run)
    monkeypatch.setattr(core, "plot", lambda result, path: None)
    result = cli("bench", "--tokens", "2,3", "--providers", "eager,ours", "--out", tmp_path)
    assert result.code == 0, result.err
    assert seen == {"device": torch.device("cpu"), "tokens": (2, 3), "providers": ("eager", "ours")}
    total = len(BENCH_GEOMETRIES) * 4
    assert result.err.splitlines()[-1].startswith(f"bench [{'#' * Progress.WIDTH}] {total}/{total}")
    assert result.err.splitlines()[-1].endswith("done")


def test_library_has_no_command_line_of_its_own():
    assert not hasattr(core, "main") and "argparse" not in core.__dict__


def test_script_is_the_bench_subcommand():
    script = Path(__file__).resolve().parents[2] / "scripts" / "bench_split_qkv_rmsnorm_rope.py"
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0 and "vllm-ascend-ext bench" in done.stdout
    bad = subprocess.run([sys.executable, str(script), "--tokens", "1,x"], capture_output=True, text=True,
                         env=env, timeout=120)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert bad.stderr.startswith("vllm-ascend-ext bench: error: --tokens")


def test_check_is_against_the_float64_reference(monkeypatch):
    """Each row's error is measured against ``ops.reference`` on its generator's inputs."""
    from vllm_ascend_ext.ops import reference

    calls = []
    real = reference.split_qkv_rmsnorm_rope

    def spy(**kwargs):
        calls.append(kwargs)
        return real(**kwargs)

    monkeypatch.setattr(reference, "split_qkv_rmsnorm_rope", spy)
    result = core.run(torch.device("cpu"), tokens=(3,), providers=("eager", "ours"), geometries=(("Qwen3-32B", 8),),
                      reps=1)
    assert len(calls) == 1
    rows = {row.provider: row for row in result["rows"]}
    assert rows["ours"].max_rel_err <= core.TOLERANCE[torch.bfloat16]
    assert 0 < rows["eager"].max_rel_err <= 4 * core.TOLERANCE[torch.bfloat16]  # eager rounds after the norm
    assert core.check_rows(result["rows"]) == []
    monkeypatch.setattr(reference, "split_qkv_rmsnorm_rope", lambda **kwargs: tuple(2 * t for t in real(**kwargs)))
    result = core.run(torch.device("cpu"), tokens=(3,), providers=("ours",), geometries=(("Qwen3-32B", 8),), reps=1)
    assert len(core.check_rows(result["rows"])) == 1


def test_inputs_come_from_the_reference_generator():
    from vllm_ascend_ext.ops import reference
    from vllm_ascend_ext.ops.models import model

    geometry = model("Qwen3-8B").shard(8)
    ours = core.make_inputs(geometry, 5, "cpu", seed=7)
    theirs = reference.make_inputs(geometry, 5, device="cpu", dtype=torch.bfloat16, cache_dtype=torch.float32,
                                   max_position=core.MAX_POSITION, out_of_range=False,
                                   generator=torch.Generator().manual_seed(7))
    assert ours.keys() == theirs.keys()
    for key, value in ours.items():
        assert torch.equal(value, theirs[key]) if isinstance(value, torch.Tensor) else value == theirs[key]
    assert 0 <= int(ours["positions"].min()) and int(ours["positions"].max()) < core.MAX_POSITION


def test_run_records_the_interpreter_as_settings_read_it(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "true")
    result = core.run(torch.device("cpu"), tokens=(1,), providers=("ours",), geometries=(("Qwen3-32B", 8),), reps=1)
    assert result["meta"]["interpreter"] is True


@pytest.mark.parametrize("kwargs, name", [({"tokens": (0,)}, "tokens"), ({"providers": ("fast",)}, "providers")])
def test_run_refuses_bad_arguments_by_name(kwargs, name):
    with pytest.raises(ValueError, match=name):
        core.run(torch.device("cpu"), **({"tokens": (1,), "providers": ("ours",)} | kwargs))
