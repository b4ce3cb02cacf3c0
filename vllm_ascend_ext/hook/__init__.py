"""The vLLM side at run time: plugin registration, the worker hook (warm-up, digest), vllm-ascend's
cache-write hook."""
