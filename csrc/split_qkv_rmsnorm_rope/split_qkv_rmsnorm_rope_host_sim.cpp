// Host build of the AscendC kernel: the kernel source, unchanged, compiled with g++ against
// csrc/ascendc_host_sim/kernel_operator.h, plus a C ABI for ctypes (tests/csrc drives it).
// Nothing here runs on an NPU; see docs/ascendc.md for what this does and does not prove.
#include <cstddef>
#include <cstring>
#include <string>

#include "kernel_operator.h"
#include "split_qkv_rmsnorm_rope_kernel.cpp"

namespace {
void SetError(char* err, int errLen, const std::string& msg)
{
    if (err != nullptr && errLen > 0) {
        std::strncpy(err, msg.c_str(), static_cast<size_t>(errLen) - 1);
        err[errLen - 1] = '\0';
    }
}
}  // namespace

extern "C" {

// Forget every registered GM tensor (call before registering a launch's tensors).
void sqrr_sim_reset_gm() { ascendc_host_sim::ResetGm(); }

// Register [base, base + bytes) as a GM tensor the kernel may read (and write when writable).
int sqrr_sim_register_gm(void* base, uint64_t bytes, int writable, const char* name)
{
    return ascendc_host_sim::RegisterGm(base, bytes, writable != 0, name);
}

// Copy region's read (which=0) or written (which=1) byte map into out (bytes entries).
int sqrr_sim_access_map(int region, int which, uint8_t* out, uint64_t bytes)
{
    auto& regions = ascendc_host_sim::GmRegions();
    if (region < 0 || region >= static_cast<int>(regions.size()) || bytes != regions[region].bytes) return -1;
    const auto& map = which ? regions[region].written : regions[region].read;
    std::memcpy(out, map.data(), bytes);
    return 0;
}

// Largest UB allocation of any block in the last launch, and how many blocks ran.
uint32_t sqrr_sim_ub_peak() { return ascendc_host_sim::Stats().ubPeak; }
uint32_t sqrr_sim_blocks_run() { return ascendc_host_sim::Stats().blocksRun; }

// sizeof and field offsets of the tiling struct, in declaration order (layout check).
int sqrr_sim_tiling_layout(uint64_t* out, int n)
{
    const uint64_t layout[] = {
        sizeof(SplitQkvRmsnormRopeTiling),
        offsetof(SplitQkvRmsnormRopeTiling, qkvRowStride),
        offsetof(SplitQkvRmsnormRopeTiling, qOutRowStride),
        offsetof(SplitQkvRmsnormRopeTiling, kOutRowStride),
        offsetof(SplitQkvRmsnormRopeTiling, cacheRowStride),
        offsetof(SplitQkvRmsnormRopeTiling, positionStride),
        offsetof(SplitQkvRmsnormRopeTiling, positionAxisStride),
        offsetof(SplitQkvRmsnormRopeTiling, gateOutRowStride),
        offsetof(SplitQkvRmsnormRopeTiling, vOutRowStride),
        offsetof(SplitQkvRmsnormRopeTiling, kCacheBlockStride),
        offsetof(SplitQkvRmsnormRopeTiling, kCacheSlotStride),
        offsetof(SplitQkvRmsnormRopeTiling, kCacheHeadStride),
        offsetof(SplitQkvRmsnormRopeTiling, kCacheOffset),
        offsetof(SplitQkvRmsnormRopeTiling, vCacheBlockStride),
        offsetof(SplitQkvRmsnormRopeTiling, vCacheSlotStride),
        offsetof(SplitQkvRmsnormRopeTiling, vCacheHeadStride),
        offsetof(SplitQkvRmsnormRopeTiling, vCacheOffset),
        offsetof(SplitQkvRmsnormRopeTiling, kvChunkStride),
        offsetof(SplitQkvRmsnormRopeTiling, kCacheElems),
        offsetof(SplitQkvRmsnormRopeTiling, vCacheElems),
        offsetof(SplitQkvRmsnormRopeTiling, numTokens),
        offsetof(SplitQkvRmsnormRopeTiling, numQHeads),
        offsetof(SplitQkvRmsnormRopeTiling, numKvHeads),
        offsetof(SplitQkvRmsnormRopeTiling, headDim),
        offsetof(SplitQkvRmsnormRopeTiling, headDimPadded),
        offsetof(SplitQkvRmsnormRopeTiling, rotaryDim),
        offsetof(SplitQkvRmsnormRopeTiling, maxPosition),
        offsetof(SplitQkvRmsnormRopeTiling, blockTokens),
        offsetof(SplitQkvRmsnormRopeTiling, blockHeads),
        offsetof(SplitQkvRmsnormRopeTiling, numTiles),
        offsetof(SplitQkvRmsnormRopeTiling, flags),
        offsetof(SplitQkvRmsnormRopeTiling, dtype),
        offsetof(SplitQkvRmsnormRopeTiling, cacheDtype),
        offsetof(SplitQkvRmsnormRopeTiling, eps),
        offsetof(SplitQkvRmsnormRopeTiling, weightOffset),
        offsetof(SplitQkvRmsnormRopeTiling, mropeSectionT),
        offsetof(SplitQkvRmsnormRopeTiling, mropeSectionH),
        offsetof(SplitQkvRmsnormRopeTiling, mropeSectionW),
        offsetof(SplitQkvRmsnormRopeTiling, ubBytes),
        offsetof(SplitQkvRmsnormRopeTiling, kvBlockSize),
        offsetof(SplitQkvRmsnormRopeTiling, kvChunkWidth),
        offsetof(SplitQkvRmsnormRopeTiling, reserved),
    };
    const int count = static_cast<int>(sizeof(layout) / sizeof(layout[0]));
    for (int i = 0; i < n && i < count; ++i) out[i] = layout[i];
    return count;
}

// Runs the kernel entry for the tiling's dtypes on blockDim simulated vector cores of ubBytes UB.
// Returns 0, or -1 with the host layer's (or the kernel's) error message in err.
// vOut and gateOut may be null when the tiling's flags say they are not written.
int sqrr_sim_launch(const SplitQkvRmsnormRopeTiling* tiling, uint32_t blockDim, uint32_t ubBytes, void* qkv,
                    void* qOut, void* kOut, void* vOut, void* gateOut, void* cache, void* positions, void* qWeight,
                    void* kWeight, void* qBias, void* kBias, char* err, int errLen)
{
    auto* a = reinterpret_cast<GM_ADDR>(qkv);
    auto* qo = reinterpret_cast<GM_ADDR>(qOut);
    auto* ko = reinterpret_cast<GM_ADDR>(kOut);
    auto* vo = reinterpret_cast<GM_ADDR>(vOut);
    auto* go = reinterpret_cast<GM_ADDR>(gateOut);
    auto* c = reinterpret_cast<GM_ADDR>(cache);
    auto* p = reinterpret_cast<GM_ADDR>(positions);
    auto* qw = reinterpret_cast<GM_ADDR>(qWeight);
    auto* kw = reinterpret_cast<GM_ADDR>(kWeight);
    auto* qb = reinterpret_cast<GM_ADDR>(qBias);
    auto* kb = reinterpret_cast<GM_ADDR>(kBias);
    const SplitQkvRmsnormRopeTiling t = *tiling;
    void (*entry)(GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR,
                  GM_ADDR, SplitQkvRmsnormRopeTiling) = nullptr;
    if (t.dtype == SQRR_DTYPE_BF16 && t.cacheDtype == SQRR_DTYPE_BF16) entry = split_qkv_rmsnorm_rope_bf16_cbf16;
    if (t.dtype == SQRR_DTYPE_BF16 && t.cacheDtype == SQRR_DTYPE_FP16) entry = split_qkv_rmsnorm_rope_bf16_cfp16;
    if (t.dtype == SQRR_DTYPE_BF16 && t.cacheDtype == SQRR_DTYPE_FP32) entry = split_qkv_rmsnorm_rope_bf16_cfp32;
    if (t.dtype == SQRR_DTYPE_FP16 && t.cacheDtype == SQRR_DTYPE_BF16) entry = split_qkv_rmsnorm_rope_fp16_cbf16;
    if (t.dtype == SQRR_DTYPE_FP16 && t.cacheDtype == SQRR_DTYPE_FP16) entry = split_qkv_rmsnorm_rope_fp16_cfp16;
    if (t.dtype == SQRR_DTYPE_FP16 && t.cacheDtype == SQRR_DTYPE_FP32) entry = split_qkv_rmsnorm_rope_fp16_cfp32;
    if (entry == nullptr) {
        SetError(err, errLen, "no kernel entry for this (dtype, cacheDtype)");
        return -1;
    }
    try {
        ascendc_host_sim::Launch(blockDim, ubBytes, [&] { entry(a, qo, ko, vo, go, c, p, qw, kw, qb, kb, t); });
    } catch (const std::exception& e) {
        SetError(err, errLen, e.what());
        return -1;
    }
    return 0;
}

}  // extern "C"
