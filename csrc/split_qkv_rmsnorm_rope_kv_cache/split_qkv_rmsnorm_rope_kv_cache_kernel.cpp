// AscendC entries of split_qkv_rmsnorm_rope_kv_cache: the prologue kernel class
// (csrc/split_qkv_rmsnorm_rope/split_qkv_rmsnorm_rope_kernel.h) with its KV-cache write, turned on
// by the tiling's SQRR_FLAG_KV_* flags (layout ND or NZ, int8 per tensor or per channel, return_kv).
// One entry per (qkv dtype, cos/sin cache dtype, KV cache dtype): the KV cache holds qkv's dtype
// or int8.
#include "split_qkv_rmsnorm_rope_kernel.h"

#define SQRR_KV_KERNEL(NAME, T, TC, TK)                                                                       \
    extern "C" __global__ __aicore__ void NAME(GM_ADDR qkv, GM_ADDR qOut, GM_ADDR kOut, GM_ADDR vOut,          \
                                               GM_ADDR gateOut, GM_ADDR cache, GM_ADDR positions,              \
                                               GM_ADDR qWeight, GM_ADDR kWeight, GM_ADDR qBias, GM_ADDR kBias, \
                                               GM_ADDR keyCache, GM_ADDR valueCache, GM_ADDR slotMapping,      \
                                               GM_ADDR kScale, GM_ADDR vScale, SplitQkvRmsnormRopeTiling tiling) \
    {                                                                                                          \
        AscendC::TPipe pipe;                                                                                   \
        sqrr::SplitQkvRmsnormRope<T, TC, TK> op;                                                               \
        op.Init(qkv, qOut, kOut, vOut, gateOut, cache, positions, qWeight, kWeight, qBias, kBias, keyCache,    \
                valueCache, slotMapping, kScale, vScale, tiling, &pipe);                                       \
        op.Process();                                                                                          \
    }

SQRR_KV_KERNEL(split_qkv_rmsnorm_rope_kv_cache_bf16_cbf16_kbf16, bfloat16_t, bfloat16_t, bfloat16_t)
SQRR_KV_KERNEL(split_qkv_rmsnorm_rope_kv_cache_bf16_cfp16_kbf16, bfloat16_t, half, bfloat16_t)
SQRR_KV_KERNEL(split_qkv_rmsnorm_rope_kv_cache_bf16_cfp32_kbf16, bfloat16_t, float, bfloat16_t)
SQRR_KV_KERNEL(split_qkv_rmsnorm_rope_kv_cache_fp16_cbf16_kfp16, half, bfloat16_t, half)
SQRR_KV_KERNEL(split_qkv_rmsnorm_rope_kv_cache_fp16_cfp16_kfp16, half, half, half)
SQRR_KV_KERNEL(split_qkv_rmsnorm_rope_kv_cache_fp16_cfp32_kfp16, half, float, half)
SQRR_KV_KERNEL(split_qkv_rmsnorm_rope_kv_cache_bf16_cbf16_ki8, bfloat16_t, bfloat16_t, int8_t)
SQRR_KV_KERNEL(split_qkv_rmsnorm_rope_kv_cache_bf16_cfp16_ki8, bfloat16_t, half, int8_t)
SQRR_KV_KERNEL(split_qkv_rmsnorm_rope_kv_cache_bf16_cfp32_ki8, bfloat16_t, float, int8_t)
SQRR_KV_KERNEL(split_qkv_rmsnorm_rope_kv_cache_fp16_cbf16_ki8, half, bfloat16_t, int8_t)
SQRR_KV_KERNEL(split_qkv_rmsnorm_rope_kv_cache_fp16_cfp16_ki8, half, half, int8_t)
SQRR_KV_KERNEL(split_qkv_rmsnorm_rope_kv_cache_fp16_cfp32_ki8, half, float, int8_t)

#ifndef ASCENDC_HOST_SIM
// Host-side launch (compiled by CANN's toolchain only): the entry for the tiling on blockDim vector
// cores of the stream. Returns 0, or -1 for an unknown dtype combination.
extern "C" int split_qkv_rmsnorm_rope_kv_cache_launch(void* stream, uint32_t blockDim, GM_ADDR qkv, GM_ADDR qOut,
                                                      GM_ADDR kOut, GM_ADDR vOut, GM_ADDR gateOut, GM_ADDR cache,
                                                      GM_ADDR positions, GM_ADDR qWeight, GM_ADDR kWeight,
                                                      GM_ADDR qBias, GM_ADDR kBias, GM_ADDR keyCache,
                                                      GM_ADDR valueCache, GM_ADDR slotMapping, GM_ADDR kScale,
                                                      GM_ADDR vScale, SplitQkvRmsnormRopeTiling tiling)
{
#define SQRR_KV_LAUNCH(I8, DT, CT, NAME)                                                                       \
    if (((tiling.flags & SQRR_FLAG_KV_INT8) != 0) == (I8) && tiling.dtype == (DT) && tiling.cacheDtype == (CT)) { \
        NAME<<<blockDim, nullptr, stream>>>(qkv, qOut, kOut, vOut, gateOut, cache, positions, qWeight, kWeight, \
                                            qBias, kBias, keyCache, valueCache, slotMapping, kScale, vScale,   \
                                            tiling);                                                           \
        return 0;                                                                                              \
    }
    SQRR_KV_LAUNCH(false, SQRR_DTYPE_BF16, SQRR_DTYPE_BF16, split_qkv_rmsnorm_rope_kv_cache_bf16_cbf16_kbf16)
    SQRR_KV_LAUNCH(false, SQRR_DTYPE_BF16, SQRR_DTYPE_FP16, split_qkv_rmsnorm_rope_kv_cache_bf16_cfp16_kbf16)
    SQRR_KV_LAUNCH(false, SQRR_DTYPE_BF16, SQRR_DTYPE_FP32, split_qkv_rmsnorm_rope_kv_cache_bf16_cfp32_kbf16)
    SQRR_KV_LAUNCH(false, SQRR_DTYPE_FP16, SQRR_DTYPE_BF16, split_qkv_rmsnorm_rope_kv_cache_fp16_cbf16_kfp16)
    SQRR_KV_LAUNCH(false, SQRR_DTYPE_FP16, SQRR_DTYPE_FP16, split_qkv_rmsnorm_rope_kv_cache_fp16_cfp16_kfp16)
    SQRR_KV_LAUNCH(false, SQRR_DTYPE_FP16, SQRR_DTYPE_FP32, split_qkv_rmsnorm_rope_kv_cache_fp16_cfp32_kfp16)
    SQRR_KV_LAUNCH(true, SQRR_DTYPE_BF16, SQRR_DTYPE_BF16, split_qkv_rmsnorm_rope_kv_cache_bf16_cbf16_ki8)
    SQRR_KV_LAUNCH(true, SQRR_DTYPE_BF16, SQRR_DTYPE_FP16, split_qkv_rmsnorm_rope_kv_cache_bf16_cfp16_ki8)
    SQRR_KV_LAUNCH(true, SQRR_DTYPE_BF16, SQRR_DTYPE_FP32, split_qkv_rmsnorm_rope_kv_cache_bf16_cfp32_ki8)
    SQRR_KV_LAUNCH(true, SQRR_DTYPE_FP16, SQRR_DTYPE_BF16, split_qkv_rmsnorm_rope_kv_cache_fp16_cbf16_ki8)
    SQRR_KV_LAUNCH(true, SQRR_DTYPE_FP16, SQRR_DTYPE_FP16, split_qkv_rmsnorm_rope_kv_cache_fp16_cfp16_ki8)
    SQRR_KV_LAUNCH(true, SQRR_DTYPE_FP16, SQRR_DTYPE_FP32, split_qkv_rmsnorm_rope_kv_cache_fp16_cfp32_ki8)
#undef SQRR_KV_LAUNCH
    return -1;
}
#endif  // ASCENDC_HOST_SIM
