// AscendC entries of split_qkv_rmsnorm_rope: the kernel class (split_qkv_rmsnorm_rope_kernel.h,
// shared with split_qkv_rmsnorm_rope_kv_cache) without the KV-cache write.
#include "split_qkv_rmsnorm_rope_kernel.h"

// Kernel entries, one per (qkv dtype, cache dtype); C symbols, as CANN's kernel launch expects.
#define SQRR_KERNEL(NAME, T, TC)                                                                              \
    extern "C" __global__ __aicore__ void NAME(GM_ADDR qkv, GM_ADDR qOut, GM_ADDR kOut, GM_ADDR vOut,          \
                                               GM_ADDR gateOut, GM_ADDR cache, GM_ADDR positions,              \
                                               GM_ADDR qWeight, GM_ADDR kWeight, GM_ADDR qBias, GM_ADDR kBias, \
                                               SplitQkvRmsnormRopeTiling tiling)                               \
    {                                                                                                          \
        AscendC::TPipe pipe;                                                                                   \
        sqrr::SplitQkvRmsnormRope<T, TC> op;                                                                   \
        op.Init(qkv, qOut, kOut, vOut, gateOut, cache, positions, qWeight, kWeight, qBias, kBias, nullptr,     \
                nullptr, nullptr, nullptr, nullptr, tiling, &pipe);                                            \
        op.Process();                                                                                          \
    }

SQRR_KERNEL(split_qkv_rmsnorm_rope_bf16_cbf16, bfloat16_t, bfloat16_t)
SQRR_KERNEL(split_qkv_rmsnorm_rope_bf16_cfp16, bfloat16_t, half)
SQRR_KERNEL(split_qkv_rmsnorm_rope_bf16_cfp32, bfloat16_t, float)
SQRR_KERNEL(split_qkv_rmsnorm_rope_fp16_cbf16, half, bfloat16_t)
SQRR_KERNEL(split_qkv_rmsnorm_rope_fp16_cfp16, half, half)
SQRR_KERNEL(split_qkv_rmsnorm_rope_fp16_cfp32, half, float)

#ifndef ASCENDC_HOST_SIM
// Host-side launch (compiled by CANN's toolchain only): picks the entry for the dtypes and
// launches blockDim vector cores on the stream. Returns 0, or -1 for an unknown dtype pair.
#define SQRR_LAUNCH_CASE(DT, CT, NAME)                                                                         \
    if (tiling.dtype == (DT) && tiling.cacheDtype == (CT)) {                                                   \
        NAME<<<blockDim, nullptr, stream>>>(qkv, qOut, kOut, vOut, gateOut, cache, positions, qWeight, kWeight, \
                                            qBias, kBias, tiling);                                             \
        return 0;                                                                                              \
    }
extern "C" int split_qkv_rmsnorm_rope_launch(void* stream, uint32_t blockDim, GM_ADDR qkv, GM_ADDR qOut, GM_ADDR kOut,
                                             GM_ADDR vOut, GM_ADDR gateOut, GM_ADDR cache, GM_ADDR positions,
                                             GM_ADDR qWeight, GM_ADDR kWeight, GM_ADDR qBias, GM_ADDR kBias,
                                             SplitQkvRmsnormRopeTiling tiling)
{
    SQRR_LAUNCH_CASE(SQRR_DTYPE_BF16, SQRR_DTYPE_BF16, split_qkv_rmsnorm_rope_bf16_cbf16)
    SQRR_LAUNCH_CASE(SQRR_DTYPE_BF16, SQRR_DTYPE_FP16, split_qkv_rmsnorm_rope_bf16_cfp16)
    SQRR_LAUNCH_CASE(SQRR_DTYPE_BF16, SQRR_DTYPE_FP32, split_qkv_rmsnorm_rope_bf16_cfp32)
    SQRR_LAUNCH_CASE(SQRR_DTYPE_FP16, SQRR_DTYPE_BF16, split_qkv_rmsnorm_rope_fp16_cbf16)
    SQRR_LAUNCH_CASE(SQRR_DTYPE_FP16, SQRR_DTYPE_FP16, split_qkv_rmsnorm_rope_fp16_cfp16)
    SQRR_LAUNCH_CASE(SQRR_DTYPE_FP16, SQRR_DTYPE_FP32, split_qkv_rmsnorm_rope_fp16_cfp32)
    return -1;
}
#undef SQRR_LAUNCH_CASE
#endif  // ASCENDC_HOST_SIM
