#!/usr/bin/env python3
"""Same as ``vllm-ascend-ext bench --op split_qkv_rmsnorm_rope_kv_cache`` (its options: ``--tokens 1,64``,
``--providers ours_kv,ours+scatter,ours,copy_kv``, ``--out``, ...): the fused KV-cache write against the
prologue followed by a separate scatter, the prologue alone and the same-bytes copy, each timed one call per
captured CUDA graph and amortised over 20 calls in one graph; writes
``bench_split_qkv_rmsnorm_rope_kv_cache.{txt,csv,json}`` under ``--out``."""

import sys

from vllm_ascend_ext.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "--op", "split_qkv_rmsnorm_rope_kv_cache", *sys.argv[1:]]))
