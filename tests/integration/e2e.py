"""What the end-to-end tests share: a tiny model run in its own process, cached per test module,
and the tolerances of plugin on vs off (the ``runs`` fixture: ``conftest.py``).

A helper module (``from e2e import ...``); the tests are ``test_vllm_e2e.py`` (the GQA/MQA
prologue) and ``test_mla_e2e.py`` (the MLA prologue).
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: fp32 plugin on vs off: logprobs within FP32_ATOL + FP32_RTOL * |off|. Most runs differ by
#: 1e-5 or less; one fresh-clone CI run's first model (qwen3) differed by up to 1.6e-3 at a
#: logprob of -7.3 and 8.8e-4 at -0.65 (a re-run in the same environment: 1e-5), cause not found.
#: A wrong prologue moves logprobs by O(1), far outside this.
FP32_ATOL = 1e-3
FP32_RTOL = 5e-4
#: bf16 prompt logprobs, plugin on vs off: within BF16_ATOL + BF16_RTOL * |off|. BF16_ATOL is one
#: bf16 spacing of the logits at 32-64 (0.25; the tiny models' scaled lm_head puts logits tens
#: apart, see BF16_TIE): one logit rounded the other way moves every logprob by that much. With
#: 0.1, an x86 machine with AMX (vLLM's amx attention for bf16, the cache write left to vLLM)
#: failed by 0.0015: tiny Qwen3, a prompt logprob of -7.415 off by 0.2498, a spacing.
BF16_RTOL, BF16_ATOL = 0.02, 0.25
#: bf16: how far below the unfused run's first choice its runner-up may be and still be the
#: fused run's first choice. The scaled lm_head gives logits tens apart (prompt logprobs reach
#: -65), where bf16's spacing is 0.125-0.25: a near-tie moves by a rounding on each side (tiny
#: Qwen3, prompt [500, 3]: the unfused bf16 run put a token 0.125 above the one that the fused
#: bf16 run and both fp32 runs chose).
BF16_TIE = 0.5
RUN_TIMEOUT_S = 400


def run(model: str, dtype: str, tmp_path: Path, fusion: bool, fail_heads: int | None = None,
        kv_cache: bool = True) -> tuple[dict, str]:
    """Run ``run_tiny`` on ``model`` in a process of its own (forked by :func:`_server`) and return
    what it wrote and its log."""
    out = tmp_path / f"{model}-{dtype}-{'on' if fusion else 'off'}-{fail_heads}-{'kv' if kv_cache else 'nokv'}.json"
    env = dict(os.environ, TRITON_INTERPRET="1", TINY_DTYPE=dtype,
               VLLM_CACHE_ROOT=str(tmp_path / f"cache-{out.stem}"),
               TINY_ISA_PROBE_DIR=str(tmp_path.parent / "inductor-isa-probe"),
               VLLM_ASCEND_EXT_FUSION="1" if fusion else "0",
               VLLM_ASCEND_EXT_KV_CACHE_FUSION="1" if kv_cache else "0")
    env.pop("TINY_FAIL_WARM_UP_HEADS", None)
    if fail_heads is not None:
        env["TINY_FAIL_WARM_UP_HEADS"] = str(fail_heads)
    log_path = out.with_suffix(".log")
    server, replies = _server(tmp_path.parent)
    server.stdin.write(json.dumps({"model": model, "out": str(out), "log": str(log_path), "env": env}) + "\n")
    server.stdin.flush()
    pid = _reply(server, replies, 60)["pid"]
    try:
        status = _reply(server, replies, RUN_TIMEOUT_S)["status"]
    except queue.Empty:
        os.kill(pid, signal.SIGKILL)
        _reply(server, replies, 60)
        raise AssertionError(f"run_tiny {model} ran past {RUN_TIMEOUT_S} s: " + log_path.read_text()[-6000:]) from None
    log = log_path.read_text()
    assert status == 0, log[-6000:]
    return json.loads(out.read_text()), log


#: This process's ``run_tiny --serve`` and the queue of its reply lines (:func:`_server`).
_SERVER: list = []


def _server(log_dir: Path):
    """``run_tiny --serve`` (vLLM imported once, a forked child per run), started on first use;
    its own output goes to ``log_dir/run_tiny-serve.log``."""
    if _SERVER and _SERVER[0].poll() is None:
        return _SERVER
    _SERVER.clear()
    with open(log_dir / "run_tiny-serve.log", "w") as log:
        server = subprocess.Popen([sys.executable, "-m", "tests.integration.run_tiny", "--serve"], cwd=ROOT,
                                  env=dict(os.environ, TRITON_INTERPRET="1"), stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=log, text=True)
    replies: queue.Queue = queue.Queue()

    def read() -> None:
        for line in server.stdout:
            replies.put(line)
        replies.put("")  # the server ended

    threading.Thread(target=read, daemon=True).start()
    atexit.register(server.stdin.close)  # the server ends when its stdin does
    _SERVER.extend((server, replies))
    return _SERVER


def _reply(server, replies: queue.Queue, timeout: float) -> dict:
    line = replies.get(timeout=timeout)
    if not line:
        raise AssertionError(f"run_tiny --serve ended (exit {server.poll()}); see run_tiny-serve.log")
    return json.loads(line)


def model_param(name: str, *marks):
    """``name`` as a parameter: the tests of one model share its runs (``runs`` caches them per
    process), so under pytest-xdist they go to one process (``--dist loadgroup``)."""
    return pytest.param(name, id=name, marks=[pytest.mark.xdist_group(f"e2e-{name}"), *marks])
