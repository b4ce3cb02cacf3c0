// Tiling of the AscendC split_qkv_rmsnorm_rope kernel (and of split_qkv_rmsnorm_rope_kv_cache, the
// same kernel class with the SQRR_FLAG_KV_* flags): what the host passes, by value, to every
// block. Python computes every field (vllm_ascend_ext/kernels/ascendc_plan.py: `tiling`, from the
// same Ascend plan as the Triton op) and packs it with a ctypes mirror of this struct; the host-sim
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
constexpr uint32_t SQRR_FLAG_MROPE = 1u << 6;              // positions [3, T]: lane i reads its axis's row
constexpr uint32_t SQRR_FLAG_MROPE_INTERLEAVED = 1u << 7;  // mRoPE lanes interleaved (else contiguous sections)
constexpr uint32_t SQRR_FLAG_Q_GATE = 1u << 8;             // q heads 2*D apart, each followed by its gate
constexpr uint32_t SQRR_FLAG_V_NORM = 1u << 9;             // v heads RMS-normalised (weightless) and written
// The paged KV-cache write (split_qkv_rmsnorm_rope_kv_cache; layouts from ops/kv_cache.py):
constexpr uint32_t SQRR_FLAG_KV_CACHE = 1u << 10;          // k and v tiles stored into the key/value caches
constexpr uint32_t SQRR_FLAG_KV_NZ = 1u << 11;             // fractal NZ: 32-byte columns kvChunkStride apart (else ND)
constexpr uint32_t SQRR_FLAG_KV_INT8 = 1u << 12;           // int8 cache: clamp(rint(y / scale), -128, 127)
constexpr uint32_t SQRR_FLAG_KV_PER_CHANNEL = 1u << 13;    // int8 scales [Hkv*D] (else one value each)
constexpr uint32_t SQRR_FLAG_KV_OUT = 1u << 14;            // return_kv: k (and v with v-norm) also to the outputs
constexpr uint32_t SQRR_FLAG_SLOT_INT64 = 1u << 15;        // slot_mapping is int64 (else int32)

// dtype codes (qkv/weights/bias and the cache)
constexpr uint32_t SQRR_DTYPE_FP16 = 0;
constexpr uint32_t SQRR_DTYPE_BF16 = 1;
constexpr uint32_t SQRR_DTYPE_FP32 = 2;

struct SplitQkvRmsnormRopeTiling {
    uint64_t qkvRowStride;   // elements between tokens of qkv
    uint64_t qOutRowStride;  // elements between tokens of the q output (qkvRowStride when in place)
    uint64_t kOutRowStride;  // same for k
    uint64_t cacheRowStride; // elements between rows of cos_sin_cache
    uint64_t positionStride; // elements between tokens of positions (its last dim's stride)
    uint64_t positionAxisStride; // mRoPE: elements between the t, h and w rows of positions [3, T]
    uint64_t gateOutRowStride;   // q_gate: elements between tokens of the gate output [T, Hq*D]
    uint64_t vOutRowStride;      // v_norm: elements between tokens of the v output (qkvRowStride in place)
    // KV-cache write (0 without SQRR_FLAG_KV_CACHE): ops/kv_cache.py's CacheStrides of each cache,
    // in elements of the cache dtype. Slot s is block s / kvBlockSize, row s % kvBlockSize; a
    // token's head h starts at offset + block * blockStride + row * slotStride + h * headStride.
    uint64_t kCacheBlockStride;
    uint64_t kCacheSlotStride;
    uint64_t kCacheHeadStride;
    uint64_t kCacheOffset;
    uint64_t vCacheBlockStride;
    uint64_t vCacheSlotStride;
    uint64_t vCacheHeadStride;
    uint64_t vCacheOffset;
    uint64_t kvChunkStride;      // NZ: elements between a block's 32-byte columns (kvChunkWidth lanes each)
    uint64_t kCacheElems;        // elements the key cache view spans (its GlobalTensor size)
    uint64_t vCacheElems;        // same for the value cache
    uint32_t numTokens;      // T >= 1
    uint32_t numQHeads;      // Hq
    uint32_t numKvHeads;     // Hkv (0: a q-only layer, qkv holds q alone)
    uint32_t headDim;        // D (even, <= 256)
    uint32_t headDimPadded;  // Dp: D rounded up to 16 elements, a head's pitch in UB
    uint32_t rotaryDim;      // R (even, 2 <= R <= D)
    uint32_t maxPosition;    // rows of cos_sin_cache; positions are clamped to [0, maxPosition)
    uint32_t blockTokens;    // tokens per tile
    uint32_t blockHeads;     // heads per tile (of one tensor: q, k, the gate or v)
    uint32_t numTiles;       // ceil(T / blockTokens) * head blocks (q's, k's, then the gate's and v's)
    uint32_t flags;          // SQRR_FLAG_*
    uint32_t dtype;          // SQRR_DTYPE_FP16 or SQRR_DTYPE_BF16
    uint32_t cacheDtype;     // SQRR_DTYPE_*
    float eps;
    float weightOffset;      // the norm multiplies by (weightOffset + w)
    uint32_t mropeSectionT;  // mRoPE: frequency lanes of the t, h and w axes (sum R/2)
    uint32_t mropeSectionH;
    uint32_t mropeSectionW;
    uint32_t ubBytes;        // UB the plan was sized for (informational: the pipe enforces it)
    uint32_t kvBlockSize;    // KV cache: slots per block
    uint32_t kvChunkWidth;   // NZ: lanes per 32-byte column (C0); 0 for ND
    uint32_t reserved;       // 0; keeps the size a multiple of 8 with no implicit padding
};

#endif  // SPLIT_QKV_RMSNORM_ROPE_TILING_H
