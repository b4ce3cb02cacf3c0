// Host build of split_qkv_rmsnorm_rope_kv_cache's AscendC entries: the kernel sources, unchanged,
// compiled with g++ against csrc/ascendc_host_sim/kernel_operator.h. One library serves both ops:
// it includes the prologue op's host build (its C ABI: GM registry, access maps, UB peak, tiling
// layout, sqrr_sim_launch) and adds sqrr_sim_launch_kv. Nothing here runs on an NPU.
#include "split_qkv_rmsnorm_rope_host_sim.cpp"
#include "split_qkv_rmsnorm_rope_kv_cache_kernel.cpp"

namespace {
#define SQRR_KV_ARGS GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, \
                     GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, SplitQkvRmsnormRopeTiling
using SqrrKvEntry = void (*)(SQRR_KV_ARGS);
#undef SQRR_KV_ARGS

// The entry for a tiling (its dtype codes and SQRR_FLAG_KV_INT8); null for an unknown combination.
SqrrKvEntry SqrrKvEntryFor(const SplitQkvRmsnormRopeTiling& t)
{
    const bool i8 = (t.flags & SQRR_FLAG_KV_INT8) != 0;
#define SQRR_KV_CASE(DT, CT, NAME, NAME_I8) \
    if (t.dtype == (DT) && t.cacheDtype == (CT)) return i8 ? NAME_I8 : NAME;
    SQRR_KV_CASE(SQRR_DTYPE_BF16, SQRR_DTYPE_BF16, split_qkv_rmsnorm_rope_kv_cache_bf16_cbf16_kbf16,
                 split_qkv_rmsnorm_rope_kv_cache_bf16_cbf16_ki8)
    SQRR_KV_CASE(SQRR_DTYPE_BF16, SQRR_DTYPE_FP16, split_qkv_rmsnorm_rope_kv_cache_bf16_cfp16_kbf16,
                 split_qkv_rmsnorm_rope_kv_cache_bf16_cfp16_ki8)
    SQRR_KV_CASE(SQRR_DTYPE_BF16, SQRR_DTYPE_FP32, split_qkv_rmsnorm_rope_kv_cache_bf16_cfp32_kbf16,
                 split_qkv_rmsnorm_rope_kv_cache_bf16_cfp32_ki8)
    SQRR_KV_CASE(SQRR_DTYPE_FP16, SQRR_DTYPE_BF16, split_qkv_rmsnorm_rope_kv_cache_fp16_cbf16_kfp16,
                 split_qkv_rmsnorm_rope_kv_cache_fp16_cbf16_ki8)
    SQRR_KV_CASE(SQRR_DTYPE_FP16, SQRR_DTYPE_FP16, split_qkv_rmsnorm_rope_kv_cache_fp16_cfp16_kfp16,
                 split_qkv_rmsnorm_rope_kv_cache_fp16_cfp16_ki8)
    SQRR_KV_CASE(SQRR_DTYPE_FP16, SQRR_DTYPE_FP32, split_qkv_rmsnorm_rope_kv_cache_fp16_cfp32_kfp16,
                 split_qkv_rmsnorm_rope_kv_cache_fp16_cfp32_ki8)
#undef SQRR_KV_CASE
    return nullptr;
}
}  // namespace

extern "C" {

// sqrr_sim_launch with the KV-cache write's tensors (keyCache, valueCache, slotMapping; kScale and
// vScale only for an int8 cache, else null). Returns 0, or -1 with the error in err.
int sqrr_sim_launch_kv(const SplitQkvRmsnormRopeTiling* tiling, uint32_t blockDim, uint32_t ubBytes, void* qkv,
                       void* qOut, void* kOut, void* vOut, void* gateOut, void* cache, void* positions,
                       void* qWeight, void* kWeight, void* qBias, void* kBias, void* keyCache, void* valueCache,
                       void* slotMapping, void* kScale, void* vScale, char* err, int errLen)
{
    const SplitQkvRmsnormRopeTiling t = *tiling;
    const SqrrKvEntry entry = SqrrKvEntryFor(t);
    if (entry == nullptr) {
        SetError(err, errLen, "no kv-cache kernel entry for this (dtype, cacheDtype, KV int8)");
        return -1;
    }
    auto g = [](void* p) { return reinterpret_cast<GM_ADDR>(p); };
    try {
        ascendc_host_sim::Launch(blockDim, ubBytes, [&] {
            entry(g(qkv), g(qOut), g(kOut), g(vOut), g(gateOut), g(cache), g(positions), g(qWeight), g(kWeight),
                  g(qBias), g(kBias), g(keyCache), g(valueCache), g(slotMapping), g(kScale), g(vScale), t);
        });
    } catch (const std::exception& e) {
        SetError(err, errLen, e.what());
        return -1;
    }
    return 0;
}

}  // extern "C"
