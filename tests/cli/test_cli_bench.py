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
from vllm_ascend_ext.bench import cases, catalog, harness, kv_cache, prologue, report, timing
from vllm_ascend_ext.devices import detect_device
from vllm_ascend_ext.cli.common import Progress
from vllm_ascend_ext.ops.models import BENCH_GEOMETRIES, AttentionGeometry, model

pytestmark = pytest.mark.skipif(detect_device().name != "cpu", reason="sizes chosen for the CPU interpreter")


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
    from vllm_ascend_ext.bench.harness import Row
    from vllm_ascend_ext.bench.prologue import bar_verdict

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

    monkeypatch.setattr(prologue, "run", measured)
    monkeypatch.setattr(kv_cache, "run_kv_cache", measured)


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
    from vllm_ascend_ext.devices import unavailable_reason

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

    monkeypatch.setattr(prologue, "run", fake_run)
    monkeypatch.setattr(report, "plot", lambda result, path: None)
    result = cli("bench", "--tokens", "2,3", "--providers", "eager,ours", "--out", tmp_path)
    assert result.code == 0, result.err
    assert seen == {"device": torch.device("cpu"), "tokens": (2, 3), "providers": ("eager", "ours")}
    total = len(BENCH_GEOMETRIES) * 4
    assert result.err.splitlines()[-1].startswith(f"bench [{'#' * Progress.WIDTH}] {total}/{total}")
    assert result.err.splitlines()[-1].endswith("done")


def test_library_has_no_command_line_of_its_own():
    import importlib
    import pkgutil

    from vllm_ascend_ext import bench

    modules = [importlib.import_module(f"vllm_ascend_ext.bench.{m.name}") for m in pkgutil.iter_modules(bench.__path__)]
    assert prologue in modules and len(modules) >= 10
    for module in [bench, *modules]:
        assert not hasattr(module, "main") and "argparse" not in module.__dict__, module.__name__


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
    result = prologue.run(torch.device("cpu"), tokens=(3,), providers=("eager", "ours"),
                          geometries=(("Qwen3-32B", 8),), reps=1)
    assert len(calls) == 1
    rows = {row.provider: row for row in result["rows"]}
    assert rows["ours"].max_rel_err <= harness.TOLERANCE[torch.bfloat16]
    assert 0 < rows["eager"].max_rel_err <= 4 * harness.TOLERANCE[torch.bfloat16]  # eager rounds after the norm
    assert harness.check_rows(result["rows"]) == []
    monkeypatch.setattr(reference, "split_qkv_rmsnorm_rope", lambda **kwargs: tuple(2 * t for t in real(**kwargs)))
    result = prologue.run(torch.device("cpu"), tokens=(3,), providers=("ours",), geometries=(("Qwen3-32B", 8),),
                          reps=1)
    assert len(harness.check_rows(result["rows"])) == 1


def test_inputs_come_from_the_reference_generator():
    from vllm_ascend_ext.ops import reference
    from vllm_ascend_ext.ops.models import model

    geometry = model("Qwen3-8B").shard(8)
    ours = cases.make_inputs(geometry, 5, "cpu", seed=7)
    theirs = reference.make_inputs(geometry, 5, device="cpu", dtype=torch.bfloat16, cache_dtype=torch.float32,
                                   max_position=catalog.MAX_POSITION, out_of_range=False,
                                   generator=torch.Generator().manual_seed(7))
    assert ours.keys() == theirs.keys()
    for key, value in ours.items():
        assert torch.equal(value, theirs[key]) if isinstance(value, torch.Tensor) else value == theirs[key]
    assert 0 <= int(ours["positions"].min()) and int(ours["positions"].max()) < catalog.MAX_POSITION


def test_run_records_the_interpreter_as_settings_read_it(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "true")
    result = prologue.run(torch.device("cpu"), tokens=(1,), providers=("ours",), geometries=(("Qwen3-32B", 8),),
                          reps=1)
    assert result["meta"]["interpreter"] is True


@pytest.mark.parametrize("kwargs, name", [({"tokens": (0,)}, "tokens"), ({"providers": ("fast",)}, "providers")])
def test_run_refuses_bad_arguments_by_name(kwargs, name):
    with pytest.raises(ValueError, match=name):
        prologue.run(torch.device("cpu"), **({"tokens": (1,), "providers": ("ours",)} | kwargs))


# --- The KV-cache run (issue 11): the scatter baseline, the bytes, both timing modes, the bar ---

KV_GEOMETRY = (("Qwen3-32B", 8),)  # 8/1/128: the interpreter's quickest geometry


@pytest.mark.parametrize("geometry, tokens, cache_dtype", [
    (AttentionGeometry(4, 3, 64, 64), 19, torch.bfloat16),                 # 3 heads: a masked head row
    (model("Gemma-4-31B:sliding").shard(1), 5, torch.bfloat16),            # 16 x 256: two head blocks a token
    (model("Qwen3-32B").shard(8), 33, torch.float32),                      # 1 head; cast to an fp32 cache
])
def test_scatter_kv_writes_each_slot_and_nothing_else(geometry, tokens, cache_dtype):
    """Every slot's line holds its token's k and v, padding slots and every other line keep their
    sentinel: against ``ops.reference.kv_cache_write``, bit for bit (the casts are exact)."""
    from vllm_ascend_ext.ops.reference import kv_cache_write, make_kv_cache

    generator = torch.Generator().manual_seed(tokens)
    cache = make_kv_cache(geometry, tokens, dtype=cache_dtype, padding=2, generator=generator)
    width = geometry.num_kv_heads * geometry.head_dim
    qkv = torch.randn(tokens, 3 * width + 8, generator=generator).to(torch.bfloat16)
    k, v = qkv[:, 8:8 + width], qkv[:, 8 + 2 * width:]  # row-strided views, as the prologue's v is
    want = kv_cache_write(cache["key_cache"], cache["value_cache"], k, v, cache["slot_mapping"],
                          geometry.num_kv_heads, geometry.head_dim)
    assert int((cache["slot_mapping"] < 0).sum()) == 2 and len(set(cache["slot_mapping"].tolist())) == tokens - 1
    kv_cache.scatter_kv(k, v, cache["key_cache"], cache["value_cache"], cache["slot_mapping"])
    assert torch.equal(cache["key_cache"].double(), want[0])
    assert torch.equal(cache["value_cache"].double(), want[1])


def _scatter_args(**changes):
    from vllm_ascend_ext.ops.reference import make_kv_cache

    cache = make_kv_cache(AttentionGeometry(2, 2, 32, 32), 4, padding=0)
    args = dict(k=torch.zeros(4, 64, dtype=torch.bfloat16), v=torch.zeros(4, 64, dtype=torch.bfloat16),
                key_cache=cache["key_cache"], value_cache=cache["value_cache"], slot_mapping=cache["slot_mapping"])
    return args | {name: change(args[name]) for name, change in changes.items()}


@pytest.mark.parametrize("changes, name", [
    ({"key_cache": lambda c: c[0]}, "key_cache"),
    ({"key_cache": lambda c: c.to(torch.int8), "value_cache": lambda c: c.to(torch.int8)}, "key_cache"),
    ({"key_cache": lambda c: c.transpose(2, 3)}, "key_cache"),
    ({"value_cache": lambda c: c.float()}, "value_cache"),
    ({"k": lambda t: t[:, :32]}, "k"),
    ({"v": lambda t: t[:3]}, "v"),
    ({"slot_mapping": lambda s: s.float()}, "slot_mapping"),
    ({"slot_mapping": lambda s: s[:3]}, "slot_mapping"),
])
def test_scatter_kv_refuses_bad_arguments_by_name(changes, name):
    args = _scatter_args(**changes)
    before = args["key_cache"].clone()
    with pytest.raises(ValueError, match=name):
        kv_cache.scatter_kv(**args)
    assert torch.equal(args["key_cache"], before)


def test_kv_bytes_read_and_write_v_and_write_k_into_the_cache():
    plain, vnorm = model("Qwen3-8B").shard(1), model("Gemma-4-31B:sliding").shard(1)
    assert cases.bytes_moved(plain, 7, kv_cache=True) == 7 * (2 * (32 + 2 * 8) * 128 * 2 + 128 * 4)
    assert cases.bytes_moved(plain, 7, kv_cache=True) - cases.bytes_moved(plain, 7) == 7 * 2 * 8 * 128 * 2
    assert cases.bytes_moved(vnorm, 7, kv_cache=True) == cases.bytes_moved(vnorm, 7)  # v already counted


def test_amortised_timing_runs_the_calls_back_to_back():
    calls = []
    timer = timing.Timer(torch.device("cpu"), reps=2)
    assert timer(lambda: calls.append(1), calls=5) >= 0
    assert len(calls) == 1 + 2 * 5  # one warm-up, then two timings of five calls


def test_kv_run_checks_times_both_ways_and_writes_outputs(tmp_path):
    result = kv_cache.run_kv_cache(torch.device("cpu"), tokens=(3,), geometries=KV_GEOMETRY, reps=1, calls=2)
    rows = result["rows"]
    assert [r.provider for r in rows] == list(catalog.KV_PROVIDERS)
    assert all(r.us > 0 and r.us_amortised > 0 and r.calls == 2 for r in rows)
    assert len({r.bytes for r in rows}) == 1 and rows[0].bytes == cases.bytes_moved(model("Qwen3-32B").shard(8), 3,
                                                                                   kv_cache=True)
    errors = {r.provider: r.max_rel_err for r in rows}
    assert all(0 < errors[p] <= harness.TOLERANCE[torch.bfloat16] for p in ("ours_kv", "ours+scatter", "ours"))
    assert errors["copy_kv"] != errors["copy_kv"]  # NaN: a copy has nothing to check
    assert harness.check_rows(rows) == []
    assert result["meta"]["op"] == catalog.KV_OP and result["meta"]["amortised_calls"] == 2
    table = kv_cache.format_kv_table(result).splitlines()
    assert [line for line in table if line.startswith(catalog.KV_OP)] == [
        f"{catalog.KV_OP}, one call a timing (a captured graph on CUDA):",
        f"{catalog.KV_OP}, amortised: 2 calls a timing (one captured graph on CUDA), per call:"]
    assert sum(line.startswith("8/1/128 ") for line in table) == 2
    paths = report.write_outputs(result, tmp_path, text="table")
    assert [p.name for p in paths] == [f"bench_{catalog.KV_OP}.{ext}" for ext in ("csv", "json", "txt")]
    assert (tmp_path / f"bench_{catalog.KV_OP}.txt").read_text() == "table\n"
    saved = json.loads(paths[1].read_text())
    assert [row["provider"] for row in saved["rows"]] == list(catalog.KV_PROVIDERS)
    assert saved["rows"][0]["us_amortised"] == rows[0].us_amortised


@pytest.mark.parametrize("fault", ["stray line", "no write"])
def test_kv_check_sees_the_whole_cache(monkeypatch, fault):
    """A scatter that writes one line too many, or none, fails the check of its rows."""
    real = kv_cache.scatter_kv

    def faulty(k, v, key_cache, value_cache, slot_mapping):
        if fault == "stray line":
            real(k, v, key_cache, value_cache, slot_mapping)
            free = sorted(set(range(key_cache.shape[0] * key_cache.shape[1])) - set(slot_mapping.tolist()))[0]
            value_cache.view(-1, *value_cache.shape[2:])[free] = 0

    monkeypatch.setattr(kv_cache, "scatter_kv", faulty)
    result = kv_cache.run_kv_cache(torch.device("cpu"), tokens=(2,), providers=("ours+scatter",),
                                   geometries=KV_GEOMETRY, reps=1, calls=1)
    assert [line.split(":")[0] for line in harness.check_rows(result["rows"])] == ["Qwen3-32B tp8 T=2 ours+scatter"]


def test_kv_bar_verdict_both_modes():
    def row(tokens, provider, us, us_amortised):
        return harness.KVRow("m", 1, "g", tokens, provider, us, us_amortised, 20, 0.0, 1)

    lines = kv_cache.kv_bar_verdict({"meta": {"op": catalog.KV_OP, "amortised_calls": 20}, "rows": [
        row(1, "ours_kv", 6.0, 2.4), row(1, "ours", 5.5, 2.0), row(1, "ours+scatter", 8.0, 3.5),
        row(4096, "ours_kv", 30.0, 29.0), row(4096, "copy_kv", 27.0, 26.0),
        row(8192, "ours_kv", 40.0, 40.0),  # no copy at this T: not counted
    ]})
    assert lines == [
        "T<=64 graph: ours_kv/ours worst 1.09 (PASS <= 1.15; issue 11)",
        "T<=64 graph: ours_kv/(ours+scatter) worst 0.75 (PASS <= 0.8; issue 11)",
        "T>=4096 graph: ours_kv/copy_kv worst 1.11 (PASS <= 1.15; issue 11)",
        "T<=64 amortised x20: ours_kv/ours worst 1.20 (FAIL <= 1.15; issue 11)",
        "  over: g T=1 1.20",
        "T<=64 amortised x20: ours_kv/(ours+scatter) worst 0.69 (PASS <= 0.8; issue 11)",
        "T>=4096 amortised x20: ours_kv/copy_kv worst 1.12 (PASS <= 1.15; issue 11)",
    ]


def test_cli_kv_bench_writes_text_csv_json(cli, tmp_path, monkeypatch):
    # Two of the layers (the files are the point; the op's numerics are tests/ops'): 42 -> 17 s on CPU.
    geometries = (BENCH_GEOMETRIES[0], BENCH_GEOMETRIES[-1])
    monkeypatch.setattr("vllm_ascend_ext.ops.models.BENCH_GEOMETRIES", geometries)
    result = cli("bench", "--op", catalog.KV_OP, "--tokens", "1", "--providers", "ours_kv,copy_kv", "--out", tmp_path,
                 "--no-progress")
    assert result.code == 0, result.err
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [f"bench_{catalog.KV_OP}.{ext}" for ext in ("csv", "json", "txt")]
    text = (tmp_path / f"bench_{catalog.KV_OP}.txt").read_text()
    assert text.rstrip("\n") in result.out and report.CPU_DISCLAIMER in text
    rows = json.loads((tmp_path / f"bench_{catalog.KV_OP}.json").read_text())["rows"]
    assert [row["provider"] for row in rows] == ["ours_kv", "copy_kv"] * len(geometries)


@pytest.mark.parametrize("argv, fragment", [
    (("--op", catalog.KV_OP, "--providers", "eager"), "--providers"),
    (("--providers", "ours_kv"), "--providers"),
    (("--op", "split_qkv"), "--op"),
])
def test_kv_bad_arguments_are_one_line_errors(cli, no_measuring, argv, fragment):
    assert_one_line_error(cli("bench", "--tokens", "1", *argv), 2, fragment)


def test_op_choices_are_the_library_ops():
    from vllm_ascend_ext.cli.bench import OP_NAMES

    assert OP_NAMES == tuple(catalog.OPS) and catalog.OPS[catalog.OP] == catalog.PROVIDERS
    kv = catalog.KV_OP
    assert catalog.default_providers("cpu", kv) == catalog.KV_PROVIDERS == catalog.default_providers("cuda", kv)


def test_kv_script_is_the_bench_subcommand_with_its_op(monkeypatch, tmp_path):
    script = Path(__file__).resolve().parents[2] / "scripts" / "bench_split_qkv_rmsnorm_rope_kv_cache.py"
    seen = {}

    def fake_run(device, tokens, providers, progress=None, **kwargs):
        seen.update(tokens=tokens, providers=providers)
        raise SystemExit(0)

    monkeypatch.setattr(kv_cache, "run_kv_cache", fake_run)
    monkeypatch.setattr(sys, "argv", [str(script), "--tokens", "2", "--no-progress", "--out", str(tmp_path)])
    import runpy

    with pytest.raises(SystemExit):
        runpy.run_path(str(script), run_name="__main__")
    assert seen == {"tokens": (2,), "providers": catalog.KV_PROVIDERS}  # the KV-cache run, its providers
