// Tiling of the AscendC split_qkv_rmsnorm_rope kernel: what the host passes, by value, to every
// block. Python computes every field (vllm_ascend_ext/ascendc.py: `tiling_for`, from the same
// Ascend plan as the Triton op) and packs it with a ctypes mirror of this struct; the host-sim
// library exports the field offsets so the tests check that the two layouts agree.
#ifndef SPLIT_QKV_RMSNORM_ROPE_TILING_H
#define SPLIT_QKV_RMSNORM_ROPE_TILING_H

#include <cstdint>

// flags bits
constexpr uint32_t SQRR_FLAG_NEOX = 1u << 0;
constexpr uint32_t SQRR_FLAG_Q_WEIGHT = 1u << 1;
constexpr uint32_t SQRR_FLAG_K_WEIGHT = 1u << 2;
constexpr uint32_t SQRR_FLAG_Q_BIAS = 1u << 3;
constexpr uint32_t SQRR_FLAG_K_BIAS = 1u << 4;
constexpr uint32_t SQRR_FLAG_POS_INT64 = 1u << 5;

// dtype codes (qkv/weights/bias and the cache)
constexpr uint32_t SQRR_DTYPE_FP16 = 0;
constexpr uint32_t SQRR_DTYPE_BF16 = 1;
constexpr uint32_t SQRR_DTYPE_FP32 = 2;

struct SplitQkvRmsnormRopeTiling {
    uint64_t qkvRowStride;   // elements between tokens of qkv
    uint64_t qOutRowStride;  // elements between tokens of the q output (qkvRowStride when in place)
    uint64_t kOutRowStride;  // same for k
    uint64_t cacheRowStride; // elements between rows of cos_sin_cache
    uint64_t positionStride; // elements between entries of positions
    uint32_t numTokens;      // T >= 1
    uint32_t numQHeads;      // Hq
    uint32_t numKvHeads;     // Hkv
    uint32_t headDim;        // D (even, <= 256)
    uint32_t headDimPadded;  // Dp: D rounded up to 16 elements, a head's pitch in UB
    uint32_t rotaryDim;      // R (even, 2 <= R <= D)
    uint32_t maxPosition;    // rows of cos_sin_cache; positions are clamped to [0, maxPosition)
    uint32_t blockTokens;    // tokens per tile
    uint32_t blockHeads;     // q+k heads per tile
    uint32_t numTiles;       // ceil(T / blockTokens) * ceil((Hq + Hkv) / blockHeads)
    uint32_t flags;          // SQRR_FLAG_*
    uint32_t dtype;          // SQRR_DTYPE_FP16 or SQRR_DTYPE_BF16
    uint32_t cacheDtype;     // SQRR_DTYPE_*
    float eps;
    float weightOffset;      // the norm multiplies by (weightOffset + w)
    uint32_t ubBytes;        // UB the plan was sized for (informational: the pipe enforces it)
    uint32_t reserved;
};

#endif  // SPLIT_QKV_RMSNORM_ROPE_TILING_H
