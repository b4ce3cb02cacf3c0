"""What the benchmark runs: its ops and each one's providers, the default token counts and layers,
and the fixed sizes every run shares.

Standard library only: the command line reads it to check its options before torch is imported.
The layers of the prologue and KV-cache runs are ``ops.models.BENCH_GEOMETRIES``; the MLA run's and
the multi-rank run's are here.
"""

from __future__ import annotations

__all__ = [
    "AMORTISED_CALLS",
    "BAR_LARGE_TOKENS",
    "BAR_SMALL_TOKENS",
    "CHECKED_PROVIDERS",
    "CPU_AMORTISED_CALLS",
    "CPU_TOKENS",
    "GPU_TOKENS",
    "KV_BLOCK_SIZE",
    "KV_OP",
    "KV_PROVIDERS",
    "MAX_POSITION",
    "MLA_BLOCK_SIZE",
    "MLA_CPU_TOKENS",
    "MLA_GEOMETRIES",
    "MLA_OP",
    "MLA_PROVIDERS",
    "OP",
    "OPS",
    "PROVIDERS",
    "TP_CPU_TOKENS",
    "TP_MODEL",
    "TP_OP",
    "TP_PROVIDERS",
    "default_providers",
]

#: The ops ``vllm-ascend-ext bench --op`` times and each one's providers (every provider, in table order).
OP = "split_qkv_rmsnorm_rope"
PROVIDERS = ("eager", "compile", "ours")
KV_OP = "split_qkv_rmsnorm_rope_kv_cache"
KV_PROVIDERS = ("ours_kv", "ours+scatter", "ours", "copy_kv")
MLA_OP = "split_qkv_rmsnorm_rope_mla"  # issue 30
MLA_PROVIDERS = ("ours", "vllm", "copy")
OPS = {OP: PROVIDERS, KV_OP: KV_PROVIDERS, MLA_OP: MLA_PROVIDERS}
#: The multi-rank op (issue 12; ``scripts/bench_split_qkv_tp_rmsnorm_rope.py``) and its providers.
TP_OP = "split_qkv_tp_rmsnorm_rope"
TP_PROVIDERS = ("ours_tp", "unfused_tp", "copy+allreduce")
#: Providers whose outputs are checked against the float64 reference (``harness.check_rows``).
CHECKED_PROVIDERS = ("ours", "ours_kv", "ours+scatter", "ours_tp")

#: Token counts of a run on an accelerator, and of a CPU run (the interpreter) per op family.
GPU_TOKENS = (1, 8, 64, 256, 1024, 4096, 16384)
CPU_TOKENS = (1, 8, 64)
MLA_CPU_TOKENS = (1, 3)  # T = 3 crosses no tile: it checks the plumbing
TP_CPU_TOKENS = (1, 5)
#: Where the project's bars split small from large token counts (T <= small, T >= large).
BAR_LARGE_TOKENS = 4096
BAR_SMALL_TOKENS = 64

#: (model of ``ops.models.MLA_MODELS``, TP size): the layers the MLA run times (the q heads shard,
#: the latent does not; DeepSeek-V2-Lite has no q latent).
MLA_GEOMETRIES = (("DeepSeek-V3", 1), ("DeepSeek-V3", 8), ("Kimi-K2", 1), ("Kimi-K2", 8), ("DeepSeek-V2-Lite", 1))
#: The model whose layer the multi-rank run times by default (sharded over the ranks).
TP_MODEL = "MiniMax-M2"

#: Rows of the benchmark's cos/sin cache (positions are drawn inside it).
MAX_POSITION = 4096
#: Rows of a block of the KV-cache run's ``nhd`` bf16 caches.
KV_BLOCK_SIZE = 16
#: Rows of a block of the MLA cache (FlashMLA's block size on Hopper; random slots make the block
#: size immaterial to the bytes).
MLA_BLOCK_SIZE = 64
#: Calls captured in one graph for the amortised timing (``CPU_AMORTISED_CALLS`` through the
#: interpreter).
AMORTISED_CALLS = 20
CPU_AMORTISED_CALLS = 2


def default_providers(device_type: str, op: str = OP) -> tuple[str, ...]:
    """The providers a run times by default on a device type.

    Parameters
    ----------
    device_type : str
        ``"cuda"``, ``"npu"`` or ``"cpu"``.
    op : str
        A key of :data:`OPS`.

    Returns
    -------
    tuple of str
        For :data:`OP`, all of :data:`PROVIDERS` on an accelerator; on ``"cpu"`` eager and ours
        (Inductor's CPU compile of every shape would take minutes and time nothing that matters).
        For any other op (:data:`KV_OP`, :data:`MLA_OP`), all of its providers everywhere.
    """
    if op != OP:
        return OPS[op]
    return ("eager", "ours") if device_type == "cpu" else PROVIDERS
