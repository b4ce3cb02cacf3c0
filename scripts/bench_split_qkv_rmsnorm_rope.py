#!/usr/bin/env python3
"""Check and time split_qkv_rmsnorm_rope against the unfused paths (see vllm_ascend_ext.bench)."""

import sys

from vllm_ascend_ext.bench import main

if __name__ == "__main__":
    sys.exit(main())
