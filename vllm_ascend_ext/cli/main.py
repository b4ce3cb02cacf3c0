"""Argument parsing and dispatch for ``vllm-ascend-ext``.

Each subcommand lives in its own module with two functions: ``add_parser(subparsers)`` declares
its arguments, ``run(args) -> int`` does the work and returns the exit status. Bad input and
missing pieces raise :class:`~vllm_ascend_ext.cli.common.CliError`, printed here as one line
(``vllm-ascend-ext <cmd>: error: <reason>``) with its exit status; an environment variable that
does not parse (:class:`~vllm_ascend_ext.ops.settings.SettingError`, from wherever it is read) is
one line naming the variable, exit status 2. No traceback reaches the user.
"""

from __future__ import annotations

import os
import sys

from ..ops.settings import SettingError
from . import bench, doctor, plan, profile, report
from .common import PROG, CliError, CliParser, error_line

__all__ = ["build_parser", "main"]

SUBCOMMANDS = (doctor, plan, bench, profile, report)


def build_parser() -> CliParser:
    """The top-level parser with one subparser per subcommand."""
    parser = CliParser(
        prog=PROG,
        description="Fused split-QKV + q/k RMSNorm + RoPE for vLLM on Ascend NPUs (and CUDA): "
                    "check the install, show launch plans, benchmark, profile, read profiles.",
        epilog="Start with `vllm-ascend-ext bench`; see docs/cli.md.",
    )
    from .. import __version__

    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=CliParser)
    subparsers.required = True
    for module in SUBCOMMANDS:
        module.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``vllm-ascend-ext`` with ``argv`` (default: ``sys.argv[1:]``); return the exit status.

    Parameters
    ----------
    argv : list of str or None
        Arguments after the program name.

    Returns
    -------
    int
        0 on success; 2 on bad input; 1 when a needed piece is missing or a run failed.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a one-line usage error
        return int(exc.code or 0)
    try:
        return int(args.run(args) or 0)
    except CliError as exc:
        sys.stderr.write(error_line(args.command, str(exc)))
        return exc.code
    except SettingError as exc:  # a malformed environment variable, wherever it was read
        sys.stderr.write(error_line(args.command, str(exc).splitlines()[0]))
        return 2
    except ImportError as exc:  # a broken or partial install: say what is missing, not where
        sys.stderr.write(error_line(args.command, f"{exc} (is vllm-ascend-ext installed? pip install -e . from the "
                                    "source checkout; `vllm-ascend-ext doctor` lists what is missing)"))
        return 1
    except BrokenPipeError:  # output piped into `head` and the like
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        sys.stderr.write(f"{PROG} {args.command}: interrupted\n")
        return 130
