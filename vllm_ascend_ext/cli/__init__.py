"""The ``vllm-ascend-ext`` command: doctor, plan, bench, profile, report.

``main(argv)`` is the console-script entry point (``vllm-ascend-ext = vllm_ascend_ext.cli:main``)
and ``python -m vllm_ascend_ext.cli`` runs it too. ``docs/cli.md`` describes every subcommand.
"""

from .main import main

__all__ = ["main"]
