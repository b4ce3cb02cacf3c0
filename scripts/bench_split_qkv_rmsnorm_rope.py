#!/usr/bin/env python3
"""Same as ``vllm-ascend-ext bench`` (its options: ``--tokens 1,64``, ``--providers``, ``--out``, ...)."""

import sys

from vllm_ascend_ext.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
