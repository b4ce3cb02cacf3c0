"""The implementation choice (Triton or AscendC), the AscendC binding and the torch.ops.vllm_ascend_ext custom ops."""
