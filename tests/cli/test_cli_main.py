"""The command itself: --help for every subcommand, one-line usage errors, ``python -m``."""

import os
import subprocess
import sys

import pytest

from cli_helpers import assert_one_line_error

SUBCOMMANDS = ("doctor", "plan", "bench", "profile", "report")


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_every_subcommand_has_help(cli, command):
    result = cli(command, "--help")
    assert result.code == 0
    assert f"vllm-ascend-ext {command}" in result.out
    assert "--" in result.out  # options are listed


def test_top_level_help_lists_every_subcommand(cli):
    result = cli("--help")
    assert result.code == 0
    for command in SUBCOMMANDS:
        assert command in result.out


def test_no_subcommand_is_a_one_line_error(cli):
    assert_one_line_error(cli(), 2, "required")


def test_unknown_subcommand_is_a_one_line_error(cli):
    assert_one_line_error(cli("frobnicate"), 2, "frobnicate")


def test_unknown_option_is_a_one_line_error(cli):
    assert_one_line_error(cli("plan", "Qwen3-8B", "--frob"), 2, "--frob")


def test_python_dash_m_runs_the_same_command():
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-m", "vllm_ascend_ext.cli", "plan", "Qwen3-8B", "--target", "cuda"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "CUDA" in done.stdout and "tp=1" in done.stdout
    bad = subprocess.run([sys.executable, "-m", "vllm_ascend_ext.cli", "plan", "NoSuchModel"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 2
    assert bad.stderr.strip().count("\n") == 0 and "NoSuchModel" in bad.stderr
