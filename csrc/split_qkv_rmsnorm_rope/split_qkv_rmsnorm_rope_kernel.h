// AscendC vector-core kernel class: split QKV -> per-head RMSNorm of q and k -> RoPE, in one pass,
// optionally followed by the paged KV-cache write. One class, two ops: the entries of
// split_qkv_rmsnorm_rope (split_qkv_rmsnorm_rope_kernel.cpp, beside this header) and of
// split_qkv_rmsnorm_rope_kv_cache (csrc/split_qkv_rmsnorm_rope_kv_cache/), which sets the
// SQRR_FLAG_KV_* flags; variants are flags, never copies of the kernel.
//
// Semantics: see vllm_ascend_ext/ops/split_qkv_rmsnorm_rope.py (the Triton op); this kernel is
// its fallback and computes the same thing: per token and head, in fp32,
//   y = x * rsqrt(mean(x^2) + eps) * (weightOffset + w) (+ bias)     (when the tensor has a weight)
//   RoPE on dims [0, R) with c = cache[pos, :R/2], s = cache[pos, R/2:R]; dims >= R pass through;
// one rounding (round-to-nearest-even) to the output dtype. Variants (tiling flags):
//   mRoPE (SQRR_FLAG_MROPE): positions are [3, T] (t, h, w); lane i of c and s comes from the
//     row of its axis (contiguous sections of mropeSection{T,H,W} lanes, or interleaved: h if
//     i % 3 == 1 and i < 3h, w if i % 3 == 2 and i < 3w, else t), each axis clamped;
//   gated q (SQRR_FLAG_Q_GATE): q's heads sit 2*D apart in qkv, each followed by D values of its
//     gate, which is copied (not normalised, not rotated) to a contiguous [T, Hq*D] output;
//   v-norm (SQRR_FLAG_V_NORM): v's heads are RMS-normalised (no weight, same eps) and written;
//   q-only (numKvHeads == 0): qkv holds q (and its gate) alone.
// Without v-norm and without the cache write, v is never read or written.
// KV-cache write (SQRR_FLAG_KV_CACHE; ops/kv_cache.py's layouts nhd and nz, ops/kv_cache.py's
//   descriptors passed as strides): k tiles (after rotation) and v tiles (normalised with v-norm,
//   else copied) are stored at each token's slot of the key and value caches; a negative slot
//   (padding) writes nothing. The k output (and the v output with v-norm) is written only with
//   SQRR_FLAG_KV_OUT (return_kv). The cache holds the activation dtype (the output's rounding),
//   or int8 (TK = int8_t): clamp(rint(y / scale), -128, 127) computed in fp32 from the unrounded
//   y, with one scale per tensor or one per channel (SQRR_FLAG_KV_PER_CHANNEL).
//
// Tiling (from the Python plan, see split_qkv_rmsnorm_rope_tiling.h): a tile is blockTokens
// tokens x blockHeads heads of ONE tensor (q's heads are cut into blocks, then k's, then the
// gate's and v's when they are written: the same decomposition as the Triton kernel). Tile index
// = tokenBlock * headBlocks + headBlock; block b of GetBlockNum() takes tiles b, b + GetBlockNum(),
// ... Per tile:
//   CopyIn : one DataCopyPad per token (nh heads of D elements, each head padded to Dp in UB; GM
//            heads 2*D apart for the gated q and its gate), and for q and k tiles one DataCopyPad
//            per token (mRoPE: per token and axis used) for its cos/sin row (position clamped).
//   Compute: Cast to fp32; for normalised tiles: sum of squares per row (ReduceSum); rstd for the
//            whole tile with vector Muls/Adds/Sqrt/Div; one V_S flag; per-row Muls by rstd;
//            weight/bias per token; for q and k tiles RoPE as y = x * C + gather(x, partner) * S,
//            where C and S are the token's cos and signed sin spread over the head by Gather with
//            precomputed byte-offset tables (so NeoX, GPT-J and any even R share one code path and
//            no operand is misaligned). mRoPE first gathers each token's [c | s] row lane by lane
//            from its axes' rows (one more byte-offset table). Gate tiles are only cast there and
//            back (exact).
//   CopyOut: Cast back (CAST_RINT), one DataCopyPad per token; into the cache one DataCopyPad per
//            token with a slot (ND: the tile's heads, headStride apart; NZ: its 32-byte columns,
//            kvChunkStride apart).
// Queues: x-in and cos/sin-in are VECIN and y-out is VECOUT, each with two buffers, so the
// copy-in of tile i+1 and the copy-out of tile i-1 overlap the math of tile i.
#ifndef SPLIT_QKV_RMSNORM_ROPE_KERNEL_H
#define SPLIT_QKV_RMSNORM_ROPE_KERNEL_H

#include "kernel_operator.h"
#include "split_qkv_rmsnorm_rope_tiling.h"

namespace sqrr {

constexpr int32_t kBufferNum = 2;      // double buffering
constexpr uint32_t kSumStride = 8;     // one 32-byte block (8 fp32) per row's sum of squares
constexpr uint32_t kWorkFloats = 8;    // ReduceSum scratch for <= 256 fp32 (4 repeats -> 1 block)
constexpr uint32_t kConstFloats = 16;  // per token slot: 8 x 1.0f then 8 x 0.0f
constexpr uint32_t kAxes = 3;          // mRoPE's position axes: t, h, w
// 1.5 * 2^23: for |y| <= 2^22, (y + kRoundMagic) - kRoundMagic is y rounded to an integer, half to
// even (fp32 adds round to nearest even, and in [2^23, 2^24) fp32 holds integers only).
constexpr float kRoundMagic = 12582912.0f;
constexpr float kInt8Min = -128.0f;
constexpr float kInt8Max = 127.0f;

__aicore__ inline uint32_t CeilDiv(uint32_t a, uint32_t b) { return (a + b - 1) / b; }
__aicore__ inline uint32_t AlignUp(uint32_t a, uint32_t b) { return CeilDiv(a, b) * b; }

// T: qkv, weights and outputs; TC: the cos/sin cache; TK: the paged KV cache (T, or int8_t).
template <typename T, typename TC, typename TK = T> class SplitQkvRmsnormRope {
public:
    __aicore__ inline SplitQkvRmsnormRope() {}

    // keyCache .. vScale: the KV-cache write's tensors (null without SQRR_FLAG_KV_CACHE; the scales
    // only for an int8 cache).
    __aicore__ inline void Init(GM_ADDR qkv, GM_ADDR qOut, GM_ADDR kOut, GM_ADDR vOut, GM_ADDR gateOut,
                                GM_ADDR cache, GM_ADDR positions, GM_ADDR qWeight, GM_ADDR kWeight, GM_ADDR qBias,
                                GM_ADDR kBias, GM_ADDR keyCache, GM_ADDR valueCache, GM_ADDR slotMapping,
                                GM_ADDR kScale, GM_ADDR vScale, const SplitQkvRmsnormRopeTiling& tiling,
                                AscendC::TPipe* pipe)
    {
        t_ = tiling;
        pipe_ = pipe;
        D_ = t_.headDim;
        Dp_ = t_.headDimPadded;
        R_ = t_.rotaryDim;
        bt_ = t_.blockTokens;
        bh_ = t_.blockHeads;
        pitch_ = bh_ * Dp_;
        gate_ = (t_.flags & SQRR_FLAG_Q_GATE) != 0;
        vNorm_ = (t_.flags & SQRR_FLAG_V_NORM) != 0;
        mrope_ = (t_.flags & SQRR_FLAG_MROPE) != 0;
        kv_ = (t_.flags & SQRR_FLAG_KV_CACHE) != 0;
        kvNz_ = (t_.flags & SQRR_FLAG_KV_NZ) != 0;
        perChannel_ = kInt8 && (t_.flags & SQRR_FLAG_KV_PER_CHANNEL) != 0;
        kOutWritten_ = !kv_ || (t_.flags & SQRR_FLAG_KV_OUT) != 0;
        vOutWritten_ = vNorm_ && kOutWritten_;
        qBlocks_ = CeilDiv(t_.numQHeads, bh_);
        kEnd_ = qBlocks_ + CeilDiv(t_.numKvHeads, bh_);
        gEnd_ = kEnd_ + (gate_ ? qBlocks_ : 0);
        headBlocks_ = gEnd_ + ((vNorm_ || kv_) ? kEnd_ - qBlocks_ : 0);  // v tiles: normalised or cached
        dq_ = AlignUp(D_, 32);  // int8 staging: a head's pitch in bytes, 32-byte aligned
        qStride_ = (gate_ ? 2 : 1) * D_;
        kCol_ = uint64_t(t_.numQHeads) * qStride_;
        vCol_ = kCol_ + uint64_t(t_.numKvHeads) * D_;
        rPad_ = AlignUp(R_, 8);
        csw_ = 2 * rPad_ + kConstFloats;
        cachePitch_ = AlignUp(R_ * sizeof(TC), 32) / sizeof(TC);
        hasNorm_ = vNorm_ || (t_.flags & (SQRR_FLAG_Q_WEIGHT | SQRR_FLAG_K_WEIGHT)) != 0;

        const uint64_t nTok = t_.numTokens;
        const uint64_t hd = vCol_ + uint64_t(t_.numKvHeads) * D_;
        qkvGm_.SetGlobalBuffer((__gm__ T*)qkv, (nTok - 1) * t_.qkvRowStride + hd);
        qOutGm_.SetGlobalBuffer((__gm__ T*)qOut, (nTok - 1) * t_.qOutRowStride + uint64_t(t_.numQHeads) * D_);
        if (kOutWritten_) {
            kOutGm_.SetGlobalBuffer((__gm__ T*)kOut, (nTok - 1) * t_.kOutRowStride + uint64_t(t_.numKvHeads) * D_);
        }
        if (gate_) {
            gateOutGm_.SetGlobalBuffer((__gm__ T*)gateOut,
                                       (nTok - 1) * t_.gateOutRowStride + uint64_t(t_.numQHeads) * D_);
        }
        if (vOutWritten_) {
            vOutGm_.SetGlobalBuffer((__gm__ T*)vOut, (nTok - 1) * t_.vOutRowStride + uint64_t(t_.numKvHeads) * D_);
        }
        if (kv_) {
            kCacheGm_.SetGlobalBuffer((__gm__ TK*)keyCache, t_.kCacheElems);
            vCacheGm_.SetGlobalBuffer((__gm__ TK*)valueCache, t_.vCacheElems);
            if (t_.flags & SQRR_FLAG_SLOT_INT64) {
                slot64Gm_.SetGlobalBuffer((__gm__ int64_t*)slotMapping, nTok);
            } else {
                slot32Gm_.SetGlobalBuffer((__gm__ int32_t*)slotMapping, nTok);
            }
            if constexpr (kInt8) {
                const uint64_t scales = perChannel_ ? uint64_t(t_.numKvHeads) * D_ : 1;
                kScaleGm_.SetGlobalBuffer((__gm__ float*)kScale, scales);
                vScaleGm_.SetGlobalBuffer((__gm__ float*)vScale, scales);
                if (!perChannel_) {  // one value each: read once by the scalar unit
                    kScalar_ = kScaleGm_.GetValue(0);
                    vScalar_ = vScaleGm_.GetValue(0);
                }
            }
        }
        cacheGm_.SetGlobalBuffer((__gm__ TC*)cache, uint64_t(t_.maxPosition - 1) * t_.cacheRowStride + R_);
        const uint64_t posSize = (nTok - 1) * t_.positionStride + (mrope_ ? (kAxes - 1) * t_.positionAxisStride : 0) + 1;
        if (t_.flags & SQRR_FLAG_POS_INT64) {
            pos64Gm_.SetGlobalBuffer((__gm__ int64_t*)positions, posSize);
        } else {
            pos32Gm_.SetGlobalBuffer((__gm__ int32_t*)positions, posSize);
        }

        pipe_->InitBuffer(inQueX_, kBufferNum, bt_ * pitch_ * sizeof(T));
        pipe_->InitBuffer(inQueCs_, kBufferNum, bt_ * (mrope_ ? kAxes : 1) * cachePitch_ * sizeof(TC));
        pipe_->InitBuffer(outQueY_, kBufferNum, bt_ * pitch_ * sizeof(T));
        pipe_->InitBuffer(xBuf_, bt_ * pitch_ * sizeof(float));
        pipe_->InitBuffer(rotBuf_, pitch_ * sizeof(float));
        pipe_->InitBuffer(cosBuf_, pitch_ * sizeof(float));
        pipe_->InitBuffer(sinBuf_, pitch_ * sizeof(float));
        pipe_->InitBuffer(rotOffBuf_, pitch_ * sizeof(uint32_t));
        pipe_->InitBuffer(cosOffBuf_, pitch_ * sizeof(uint32_t));
        pipe_->InitBuffer(sinOffBuf_, pitch_ * sizeof(uint32_t));
        pipe_->InitBuffer(csxBuf_, bt_ * csw_ * sizeof(float));
        if (mrope_) {
            pipe_->InitBuffer(axisRowsBuf_, bt_ * kAxes * rPad_ * sizeof(float));
            pipe_->InitBuffer(laneOffBuf_, rPad_ * sizeof(uint32_t));
        }
        if (hasNorm_) {
            pipe_->InitBuffer(sumBuf_, bt_ * bh_ * kSumStride * sizeof(float));
            pipe_->InitBuffer(oneBuf_, bt_ * bh_ * kSumStride * sizeof(float));
            pipe_->InitBuffer(workBuf_, kWorkFloats * sizeof(float));
        }
        if constexpr (kInt8) {
            if (kv_) {
                // int8 tile (a head every dq_ bytes), its fp16 staging, the tile's scale row.
                pipe_->InitBuffer(outQueQ_, kBufferNum, bt_ * bh_ * dq_);
                pipe_->InitBuffer(halfBuf_, bt_ * pitch_ * sizeof(half));
                if (perChannel_) {
                    pipe_->InitBuffer(inQueScale_, 1, pitch_ * sizeof(float));
                } else {
                    pipe_->InitBuffer(scaleBuf_, pitch_ * sizeof(float));
                }
            }
        }
        BuildTables();  // first: its scalar writes need no V_S flag while no vector op ran yet
        // Affine tables (only those present), each replicated over blockHeads heads.
        if (t_.flags & SQRR_FLAG_Q_WEIGHT) LoadAffine(qwBuf_, qWeight, t_.weightOffset);
        if (t_.flags & SQRR_FLAG_K_WEIGHT) LoadAffine(kwBuf_, kWeight, t_.weightOffset);
        if (t_.flags & SQRR_FLAG_Q_BIAS) LoadAffine(qbBuf_, qBias, 0.0f);
        if (t_.flags & SQRR_FLAG_K_BIAS) LoadAffine(kbBuf_, kBias, 0.0f);
    }

    __aicore__ inline void Process()
    {
        const uint32_t numTiles = t_.numTiles;
        for (uint32_t tile = AscendC::GetBlockIdx(); tile < numTiles; tile += AscendC::GetBlockNum()) {
            Tile tl = Locate(tile);
            CopyIn(tl);
            Compute(tl);
            CopyOut(tl);
        }
    }

private:
    enum Kind : uint32_t { kQ = 0, kK, kGate, kV };

    struct Tile {
        uint32_t t0, nt;   // first token, tokens in the tile
        uint32_t h0, nh;   // first head within its tensor, heads in the tile
        Kind kind;         // q, k, the gate (copied) or v (normalised)
        __aicore__ inline bool Rotated() const { return kind == kQ || kind == kK; }
    };

    // Head block hb: q's blocks, k's, then the gate's (as q's) and v's (as k's) when written.
    __aicore__ inline Tile Locate(uint32_t tile) const
    {
        Tile tl;
        const uint32_t tb = tile / headBlocks_;
        const uint32_t hb = tile - tb * headBlocks_;
        tl.t0 = tb * bt_;
        tl.nt = t_.numTokens - tl.t0 < bt_ ? t_.numTokens - tl.t0 : bt_;
        uint32_t first = 0;
        if (hb < qBlocks_) {
            tl.kind = kQ;
        } else if (hb < kEnd_) {
            tl.kind = kK;
            first = qBlocks_;
        } else if (hb < gEnd_) {
            tl.kind = kGate;
            first = kEnd_;
        } else {
            tl.kind = kV;
            first = gEnd_;
        }
        const uint32_t heads = (tl.kind == kQ || tl.kind == kGate) ? t_.numQHeads : t_.numKvHeads;
        tl.h0 = (hb - first) * bh_;
        tl.nh = heads - tl.h0 < bh_ ? heads - tl.h0 : bh_;
        return tl;
    }

    // mRoPE: the position axis (0 = t, 1 = h, 2 = w) whose cache row frequency lane i reads.
    __aicore__ inline uint32_t LaneAxis(uint32_t i) const
    {
        if (t_.flags & SQRR_FLAG_MROPE_INTERLEAVED) {
            if (i % 3 == 1 && i < 3 * t_.mropeSectionH) return 1;
            if (i % 3 == 2 && i < 3 * t_.mropeSectionW) return 2;
            return 0;
        }
        return i < t_.mropeSectionT ? 0 : (i < t_.mropeSectionT + t_.mropeSectionH ? 1 : 2);
    }

    // weight or bias [D] (dtype T) -> fp32 (+ offset), replicated to blockHeads heads of pitch Dp.
    __aicore__ inline void LoadAffine(AscendC::TBuf<AscendC::TPosition::VECCALC>& buf, GM_ADDR src, float offset)
    {
        pipe_->InitBuffer(buf, pitch_ * sizeof(float));
        AscendC::GlobalTensor<T> gm;
        gm.SetGlobalBuffer((__gm__ T*)src, D_);
        AscendC::LocalTensor<T> raw = inQueX_.AllocTensor<T>();
        AscendC::DataCopyExtParams cp{1, static_cast<uint32_t>(D_ * sizeof(T)), 0, 0, 0};
        AscendC::DataCopyPadExtParams<T> pad{false, 0, 0, T{}};
        AscendC::DataCopyPad(raw, gm, cp, pad);
        inQueX_.EnQue(raw);
        raw = inQueX_.DeQue<T>();
        AscendC::LocalTensor<float> dst = buf.Get<float>();
        AscendC::Cast(dst, raw, AscendC::RoundMode::CAST_NONE, Dp_);
        AscendC::PipeBarrier<PIPE_V>();
        inQueX_.FreeTensor(raw);
        AscendC::Adds(dst, dst, offset, Dp_);
        AscendC::PipeBarrier<PIPE_V>();
        for (uint32_t h = 1; h < bh_; ++h) {
            AscendC::Adds(dst[h * Dp_], dst, 0.0f, Dp_);
        }
        AscendC::PipeBarrier<PIPE_V>();
    }

    // Byte-offset tables for Gather, one head row by scalar writes, replicated by vector adds:
    //   rotOff[j]: the element paired with j (itself past R);
    //   cosOff[j]: cos of j's pair in the token's csx row (1.0f past R);
    //   sinOff[j]: -sin for the first element of a pair, +sin for the second (0.0f past R).
    // csx row (fp32) per token: [c | s] at 0, [-c | -s] at rPad, 8 x 1.0f then 8 x 0.0f at 2*rPad.
    __aicore__ inline void BuildTables()
    {
        AscendC::LocalTensor<int32_t> rotOff = rotOffBuf_.Get<int32_t>();
        AscendC::LocalTensor<int32_t> cosOff = cosOffBuf_.Get<int32_t>();
        AscendC::LocalTensor<int32_t> sinOff = sinOffBuf_.Get<int32_t>();
        const uint32_t half = R_ / 2;
        const bool neox = (t_.flags & SQRR_FLAG_NEOX) != 0;
        const int32_t fb = sizeof(float);
        for (uint32_t j = 0; j < Dp_; ++j) {
            int32_t partner = j, cosIdx = 2 * rPad_, sinIdx = 2 * rPad_ + 8;
            if (j < R_) {
                const uint32_t i = neox ? (j < half ? j : j - half) : j / 2;
                const bool first = neox ? j < half : (j % 2) == 0;
                partner = neox ? (first ? j + half : j - half) : (j ^ 1u);
                cosIdx = i;
                sinIdx = first ? rPad_ + half + i : half + i;
            }
            rotOff.SetValue(j, partner * fb);
            cosOff.SetValue(j, cosIdx * fb);
            sinOff.SetValue(j, sinIdx * fb);
        }
        if (mrope_) {
            // laneOff[j]: element j of the token's [c | s] row, in the row of lane (j mod R/2)'s
            // axis; the token's staged rows are rPad apart (axisRows, fp32).
            AscendC::LocalTensor<int32_t> laneOff = laneOffBuf_.Get<int32_t>();
            for (uint32_t j = 0; j < R_; ++j) {
                const uint32_t axis = LaneAxis(j < half ? j : j - half);
                axisUsed_[axis] = true;
                laneOff.SetValue(j, static_cast<int32_t>((axis * rPad_ + j) * fb));
            }
        }
        event_t sv = static_cast<event_t>(pipe_->FetchEventID(AscendC::HardEvent::S_V));
        AscendC::SetFlag<AscendC::HardEvent::S_V>(sv);
        AscendC::WaitFlag<AscendC::HardEvent::S_V>(sv);
        for (uint32_t h = 1; h < bh_; ++h) {
            AscendC::Adds(rotOff[h * Dp_], rotOff, static_cast<int32_t>(h * Dp_ * fb), Dp_);
            AscendC::Adds(cosOff[h * Dp_], cosOff, 0, Dp_);
            AscendC::Adds(sinOff[h * Dp_], sinOff, 0, Dp_);
        }
        AscendC::LocalTensor<float> csx = csxBuf_.Get<float>();
        for (uint32_t t = 0; t < bt_; ++t) {
            AscendC::Duplicate(csx[t * csw_ + 2 * rPad_], 1.0f, 8);
            AscendC::Duplicate(csx[t * csw_ + 2 * rPad_ + 8], 0.0f, 8);
        }
        if (hasNorm_) {
            AscendC::Duplicate(oneBuf_.Get<float>(), 1.0f, bt_ * bh_ * kSumStride);
        }
        AscendC::PipeBarrier<PIPE_V>();
    }

    // The cache row of token's position on axis (0 unless mRoPE), clamped into the cache.
    __aicore__ inline uint64_t Position(uint32_t token, uint32_t axis) const
    {
        const uint64_t i = uint64_t(axis) * t_.positionAxisStride + uint64_t(token) * t_.positionStride;
        int64_t p = (t_.flags & SQRR_FLAG_POS_INT64) ? pos64Gm_.GetValue(i) : static_cast<int64_t>(pos32Gm_.GetValue(i));
        if (p < 0) p = 0;
        if (p >= static_cast<int64_t>(t_.maxPosition)) p = static_cast<int64_t>(t_.maxPosition) - 1;
        return static_cast<uint64_t>(p);
    }

    __aicore__ inline void CopyIn(const Tile& tl)
    {
        AscendC::LocalTensor<T> x = inQueX_.AllocTensor<T>();
        uint64_t col = 0;
        uint32_t gap = 0;  // elements between heads in qkv
        switch (tl.kind) {
            case kQ: col = uint64_t(tl.h0) * qStride_; gap = qStride_ - D_; break;
            case kGate: col = uint64_t(tl.h0) * qStride_ + D_; gap = qStride_ - D_; break;
            case kK: col = kCol_ + uint64_t(tl.h0) * D_; break;
            default: col = vCol_ + uint64_t(tl.h0) * D_; break;
        }
        AscendC::DataCopyExtParams xp{static_cast<uint16_t>(tl.nh), static_cast<uint32_t>(D_ * sizeof(T)),
                                      static_cast<uint32_t>(gap * sizeof(T)),
                                      (Dp_ * static_cast<uint32_t>(sizeof(T)) - AlignUp(D_ * sizeof(T), 32)) / 32, 0};
        AscendC::DataCopyPadExtParams<T> xpad{false, 0, 0, T{}};
        for (uint32_t t = 0; t < tl.nt; ++t) {
            AscendC::DataCopyPad(x[t * pitch_], qkvGm_[(tl.t0 + t) * t_.qkvRowStride + col], xp, xpad);
        }
        inQueX_.EnQue(x);
        if constexpr (kInt8) {
            if (ToCache(tl) && perChannel_) {
                // The tile's heads' scales, scale[h * D + d], one head every Dp floats.
                AscendC::LocalTensor<float> s = inQueScale_.AllocTensor<float>();
                const AscendC::GlobalTensor<float>& gm = tl.kind == kK ? kScaleGm_ : vScaleGm_;
                AscendC::DataCopyExtParams sp{static_cast<uint16_t>(tl.nh), static_cast<uint32_t>(D_ * sizeof(float)),
                                              0, (Dp_ * static_cast<uint32_t>(sizeof(float)) -
                                                  AlignUp(D_ * sizeof(float), 32)) / 32, 0};
                AscendC::DataCopyPadExtParams<float> spad{false, 0, 0, 0.0f};
                AscendC::DataCopyPad(s, gm[uint64_t(tl.h0) * D_], sp, spad);
                inQueScale_.EnQue(s);
            }
        }
        if (!tl.Rotated()) return;

        AscendC::LocalTensor<TC> cs = inQueCs_.AllocTensor<TC>();
        AscendC::DataCopyExtParams cp{1, static_cast<uint32_t>(R_ * sizeof(TC)), 0, 0, 0};
        AscendC::DataCopyPadExtParams<TC> cpad{false, 0, 0, TC{}};
        for (uint32_t t = 0; t < tl.nt; ++t) {
            if (!mrope_) {
                AscendC::DataCopyPad(cs[t * cachePitch_], cacheGm_[Position(tl.t0 + t, 0) * t_.cacheRowStride], cp,
                                     cpad);
                continue;
            }
            for (uint32_t a = 0; a < kAxes; ++a) {
                if (!axisUsed_[a]) continue;
                AscendC::DataCopyPad(cs[(t * kAxes + a) * cachePitch_],
                                     cacheGm_[Position(tl.t0 + t, a) * t_.cacheRowStride], cp, cpad);
            }
        }
        inQueCs_.EnQue(cs);
    }

    // The tile's cache rows -> each token's csx row [c | s | -c | -s | 1 | 0] (fp32).
    __aicore__ inline void CosSinRows(const Tile& tl, AscendC::LocalTensor<float>& csx)
    {
        AscendC::LocalTensor<TC> cs = inQueCs_.DeQue<TC>();
        if (!mrope_) {
            for (uint32_t t = 0; t < tl.nt; ++t) {
                ToFloat(csx[t * csw_], cs[t * cachePitch_]);
            }
        } else {
            AscendC::LocalTensor<float> rows = axisRowsBuf_.Get<float>();
            for (uint32_t t = 0; t < tl.nt; ++t) {
                for (uint32_t a = 0; a < kAxes; ++a) {
                    if (axisUsed_[a]) ToFloat(rows[(t * kAxes + a) * rPad_], cs[(t * kAxes + a) * cachePitch_]);
                }
            }
            AscendC::PipeBarrier<PIPE_V>();
            AscendC::LocalTensor<uint32_t> laneOff = laneOffBuf_.Get<uint32_t>();
            for (uint32_t t = 0; t < tl.nt; ++t) {
                AscendC::Gather(csx[t * csw_], rows[t * kAxes * rPad_], laneOff, 0, R_);
            }
        }
        AscendC::PipeBarrier<PIPE_V>();
        inQueCs_.FreeTensor(cs);
        for (uint32_t t = 0; t < tl.nt; ++t) {
            AscendC::Muls(csx[t * csw_ + rPad_], csx[t * csw_], -1.0f, R_);
        }
    }

    // R cache elements (dtype TC) -> fp32.
    __aicore__ inline void ToFloat(const AscendC::LocalTensor<float>& dst, const AscendC::LocalTensor<TC>& src)
    {
        if constexpr (std::is_same_v<TC, float>) {
            AscendC::Adds(dst, src, 0.0f, R_);
        } else {
            AscendC::Cast(dst, src, AscendC::RoundMode::CAST_NONE, R_);
        }
    }

    __aicore__ inline void Compute(const Tile& tl)
    {
        AscendC::LocalTensor<float> xf = xBuf_.Get<float>();
        AscendC::LocalTensor<float> csx = csxBuf_.Get<float>();
        const uint32_t n = tl.nh * Dp_;  // elements of one token's heads in the tile

        AscendC::LocalTensor<T> x = inQueX_.DeQue<T>();
        for (uint32_t t = 0; t < tl.nt; ++t) {
            AscendC::Cast(xf[t * pitch_], x[t * pitch_], AscendC::RoundMode::CAST_NONE, n);
        }
        inQueX_.FreeTensor(x);
        if (tl.Rotated()) CosSinRows(tl, csx);
        AscendC::PipeBarrier<PIPE_V>();  // xf and csx are read below (Gather, norm)

        const bool weighted = (tl.kind == kQ && (t_.flags & SQRR_FLAG_Q_WEIGHT)) ||
                              (tl.kind == kK && (t_.flags & SQRR_FLAG_K_WEIGHT));
        if (weighted || (tl.kind == kV && vNorm_)) Normalize(tl, xf);
        if (weighted) {
            AscendC::LocalTensor<float> w = (tl.kind == kQ ? qwBuf_ : kwBuf_).template Get<float>();
            for (uint32_t t = 0; t < tl.nt; ++t) {
                AscendC::Mul(xf[t * pitch_], xf[t * pitch_], w, n);
            }
            AscendC::PipeBarrier<PIPE_V>();
            if (t_.flags & (tl.kind == kQ ? SQRR_FLAG_Q_BIAS : SQRR_FLAG_K_BIAS)) {
                AscendC::LocalTensor<float> b = (tl.kind == kQ ? qbBuf_ : kbBuf_).template Get<float>();
                for (uint32_t t = 0; t < tl.nt; ++t) {
                    AscendC::Add(xf[t * pitch_], xf[t * pitch_], b, n);
                }
                AscendC::PipeBarrier<PIPE_V>();
            }
        }
        if (tl.Rotated()) Rotate(tl, xf, csx);

        if (YTile(tl)) {
            AscendC::LocalTensor<T> y = outQueY_.AllocTensor<T>();
            for (uint32_t t = 0; t < tl.nt; ++t) {
                AscendC::Cast(y[t * pitch_], xf[t * pitch_], AscendC::RoundMode::CAST_RINT, n);
            }
            outQueY_.EnQue(y);
        }
        if constexpr (kInt8) {
            if (ToCache(tl)) Quantize(tl, xf);
        }
    }

    // The tile's output (q, the gate; k and v unless only the cache takes them).
    __aicore__ inline bool ToOut(const Tile& tl) const
    {
        return tl.kind == kQ || tl.kind == kGate || (tl.kind == kK ? kOutWritten_ : vOutWritten_);
    }
    __aicore__ inline bool ToCache(const Tile& tl) const { return kv_ && (tl.kind == kK || tl.kind == kV); }
    // The tile rounded to T: for its output, or for a cache of T.
    __aicore__ inline bool YTile(const Tile& tl) const { return ToOut(tl) || (ToCache(tl) && !kInt8); }

    // int8 cache: q = clamp(rint(y / scale), -128, 127) in fp32 from the unrounded y (xf, whose
    // rows are overwritten), then fp32 -> fp16 -> int8, each cast exact on integers in [-128, 127]
    // (no value is rounded twice). Division, not a multiply by 1/scale: the Triton op and
    // vllm-ascend divide.
    __aicore__ inline void Quantize(const Tile& tl, AscendC::LocalTensor<float>& xf)
    {
        const uint32_t n = tl.nh * Dp_;
        const uint32_t all = tl.nt * pitch_;  // xf's rows are pitch_ apart: one span for the tile
        AscendC::LocalTensor<float> scale;
        AscendC::PipeBarrier<PIPE_V>();  // the y cast above read xf, which is overwritten below
        if (perChannel_) {
            scale = inQueScale_.DeQue<float>();
        } else {
            scale = scaleBuf_.Get<float>();
            AscendC::Duplicate(scale, tl.kind == kK ? kScalar_ : vScalar_, n);
            AscendC::PipeBarrier<PIPE_V>();
        }
        for (uint32_t t = 0; t < tl.nt; ++t) {
            AscendC::Div(xf[t * pitch_], xf[t * pitch_], scale, n);
        }
        AscendC::PipeBarrier<PIPE_V>();
        if (perChannel_) inQueScale_.FreeTensor(scale);
        AscendC::Maxs(xf, xf, kInt8Min, all);
        AscendC::PipeBarrier<PIPE_V>();
        AscendC::Mins(xf, xf, kInt8Max, all);
        AscendC::PipeBarrier<PIPE_V>();
        AscendC::Adds(xf, xf, kRoundMagic, all);
        AscendC::PipeBarrier<PIPE_V>();
        AscendC::Adds(xf, xf, -kRoundMagic, all);
        AscendC::PipeBarrier<PIPE_V>();
        AscendC::LocalTensor<half> h = halfBuf_.Get<half>();
        AscendC::Cast(h, xf, AscendC::RoundMode::CAST_RINT, all);  // integers: exact
        AscendC::PipeBarrier<PIPE_V>();
        AscendC::LocalTensor<int8_t> q = outQueQ_.AllocTensor<int8_t>();
        for (uint32_t t = 0; t < tl.nt; ++t) {
            for (uint32_t hd = 0; hd < tl.nh; ++hd) {
                AscendC::Cast(q[(t * bh_ + hd) * dq_], h[t * pitch_ + hd * Dp_], AscendC::RoundMode::CAST_RINT, D_);
            }
        }
        outQueQ_.EnQue(q);
    }

    // RoPE: y = x * C + x[partner] * S, per token over all its heads in the tile.
    __aicore__ inline void Rotate(const Tile& tl, AscendC::LocalTensor<float>& xf, AscendC::LocalTensor<float>& csx)
    {
        const uint32_t n = tl.nh * Dp_;
        AscendC::LocalTensor<float> rot = rotBuf_.Get<float>();
        AscendC::LocalTensor<float> cosF = cosBuf_.Get<float>();
        AscendC::LocalTensor<float> sinF = sinBuf_.Get<float>();
        AscendC::LocalTensor<uint32_t> rotOff = rotOffBuf_.Get<uint32_t>();
        AscendC::LocalTensor<uint32_t> cosOff = cosOffBuf_.Get<uint32_t>();
        AscendC::LocalTensor<uint32_t> sinOff = sinOffBuf_.Get<uint32_t>();
        for (uint32_t t = 0; t < tl.nt; ++t) {
            AscendC::LocalTensor<float> xt = xf[t * pitch_];
            AscendC::Gather(cosF, csx[t * csw_], cosOff, 0, n);
            AscendC::Gather(sinF, csx[t * csw_], sinOff, 0, n);
            AscendC::Gather(rot, xt, rotOff, 0, n);
            AscendC::PipeBarrier<PIPE_V>();
            AscendC::Mul(xt, xt, cosF, n);
            AscendC::Mul(rot, rot, sinF, n);
            AscendC::PipeBarrier<PIPE_V>();
            AscendC::Add(xt, xt, rot, n);
            AscendC::PipeBarrier<PIPE_V>();
        }
    }

    // xf rows *= rsqrt(mean(x^2) + eps): squares and one ReduceSum per row, rstd for the tile with
    // vector ops, then the per-row scale read back by the scalar unit after a V_S flag.
    __aicore__ inline void Normalize(const Tile& tl, AscendC::LocalTensor<float>& xf)
    {
        AscendC::LocalTensor<float> sq = rotBuf_.Get<float>();
        AscendC::LocalTensor<float> sums = sumBuf_.Get<float>();
        AscendC::LocalTensor<float> ones = oneBuf_.Get<float>();
        AscendC::LocalTensor<float> work = workBuf_.Get<float>();
        const uint32_t n = tl.nh * Dp_;
        for (uint32_t t = 0; t < tl.nt; ++t) {
            AscendC::Mul(sq, xf[t * pitch_], xf[t * pitch_], n);
            AscendC::PipeBarrier<PIPE_V>();
            for (uint32_t h = 0; h < tl.nh; ++h) {
                AscendC::ReduceSum(sums[(t * bh_ + h) * kSumStride], sq[h * Dp_], work, D_);
            }
            AscendC::PipeBarrier<PIPE_V>();
        }
        const uint32_t m = tl.nt * bh_ * kSumStride;
        AscendC::Muls(sums, sums, 1.0f / static_cast<float>(D_), m);
        AscendC::PipeBarrier<PIPE_V>();
        AscendC::Adds(sums, sums, t_.eps, m);
        AscendC::PipeBarrier<PIPE_V>();
        AscendC::Sqrt(sums, sums, m);
        AscendC::PipeBarrier<PIPE_V>();
        AscendC::Div(sums, ones, sums, m);
        event_t vs = static_cast<event_t>(pipe_->FetchEventID(AscendC::HardEvent::V_S));
        AscendC::SetFlag<AscendC::HardEvent::V_S>(vs);
        AscendC::WaitFlag<AscendC::HardEvent::V_S>(vs);
        for (uint32_t t = 0; t < tl.nt; ++t) {
            for (uint32_t h = 0; h < tl.nh; ++h) {
                const float rstd = sums.GetValue((t * bh_ + h) * kSumStride);
                AscendC::Muls(xf[t * pitch_ + h * Dp_], xf[t * pitch_ + h * Dp_], rstd, D_);
            }
        }
        AscendC::PipeBarrier<PIPE_V>();
    }

    __aicore__ inline void CopyOut(const Tile& tl)
    {
        if (YTile(tl)) {
            AscendC::LocalTensor<T> y = outQueY_.DeQue<T>();
            if (ToOut(tl)) CopyToOutput(tl, y);
            if constexpr (!kInt8) {
                if (ToCache(tl)) CopyToCache(tl, y, Dp_);
            }
            outQueY_.FreeTensor(y);
        }
        if constexpr (kInt8) {
            if (ToCache(tl)) {
                AscendC::LocalTensor<int8_t> q = outQueQ_.DeQue<int8_t>();
                CopyToCache(tl, q, dq_);
                outQueQ_.FreeTensor(q);
            }
        }
    }

    // Token's slot in the paged cache (negative: padding).
    __aicore__ inline int64_t Slot(uint32_t token) const
    {
        return (t_.flags & SQRR_FLAG_SLOT_INT64) ? slot64Gm_.GetValue(token)
                                                 : static_cast<int64_t>(slot32Gm_.GetValue(token));
    }

    // One DataCopyPad per token with a slot: its nh heads (UB rows of `ubHead` elements each) to
    // the cache of the tile's tensor. ND: heads at headStride, each D contiguous lanes. NZ: the
    // heads' columns c = h * D + d in 32-byte chunks of kvChunkWidth lanes, chunk i of the block
    // at i * kvChunkStride (the validator makes D a multiple of the chunk, so a head starts one
    // and, with Dp == D, the UB rows are the chunks back to back).
    // DataCopyPad UB->GM with DataCopyExtParams{blockCount, blockLen (bytes), srcStride (UB, in
    // 32-byte blocks), dstStride (GM, bytes, end to start), rsv}: see docs/ascendc.md, "Sources".
    __aicore__ inline void CopyToCache(const Tile& tl, const AscendC::LocalTensor<TK>& src, uint32_t ubHead)
    {
        const bool isK = tl.kind == kK;
        const AscendC::GlobalTensor<TK>& gm = isK ? kCacheGm_ : vCacheGm_;
        const uint64_t blockStride = isK ? t_.kCacheBlockStride : t_.vCacheBlockStride;
        const uint64_t slotStride = isK ? t_.kCacheSlotStride : t_.vCacheSlotStride;
        const uint64_t headStride = isK ? t_.kCacheHeadStride : t_.vCacheHeadStride;
        const uint64_t offset = isK ? t_.kCacheOffset : t_.vCacheOffset;
        const uint32_t es = static_cast<uint32_t>(sizeof(TK));
        AscendC::DataCopyExtParams cp;
        if (kvNz_) {
            const uint32_t chunks = tl.nh * D_ / t_.kvChunkWidth;
            cp = AscendC::DataCopyExtParams{static_cast<uint16_t>(chunks), t_.kvChunkWidth * es, 0,
                                            static_cast<uint32_t>((t_.kvChunkStride - t_.kvChunkWidth) * es), 0};
        } else {
            cp = AscendC::DataCopyExtParams{static_cast<uint16_t>(tl.nh), D_ * es,
                                            (ubHead * es - AlignUp(D_ * es, 32)) / 32,
                                            static_cast<uint32_t>((headStride - D_) * es), 0};
        }
        const uint32_t rowElems = bh_ * ubHead;
        for (uint32_t t = 0; t < tl.nt; ++t) {
            const int64_t slot = Slot(tl.t0 + t);
            if (slot < 0) continue;  // padding: nothing written
            const uint64_t s = static_cast<uint64_t>(slot);
            const uint64_t at = offset + (s / t_.kvBlockSize) * blockStride + (s % t_.kvBlockSize) * slotStride +
                                uint64_t(tl.h0) * headStride;
            AscendC::DataCopyPad(gm[at], src[t * rowElems], cp);
        }
    }

    __aicore__ inline void CopyToOutput(const Tile& tl, const AscendC::LocalTensor<T>& y)
    {
        AscendC::GlobalTensor<T>* out = &qOutGm_;
        uint64_t stride = t_.qOutRowStride;
        switch (tl.kind) {
            case kQ: break;
            case kK: out = &kOutGm_; stride = t_.kOutRowStride; break;
            case kGate: out = &gateOutGm_; stride = t_.gateOutRowStride; break;
            default: out = &vOutGm_; stride = t_.vOutRowStride; break;
        }
        AscendC::DataCopyExtParams yp{static_cast<uint16_t>(tl.nh), static_cast<uint32_t>(D_ * sizeof(T)),
                                      (Dp_ * static_cast<uint32_t>(sizeof(T)) - AlignUp(D_ * sizeof(T), 32)) / 32, 0, 0};
        for (uint32_t t = 0; t < tl.nt; ++t) {
            AscendC::DataCopyPad((*out)[(tl.t0 + t) * stride + uint64_t(tl.h0) * D_], y[t * pitch_], yp);
        }
    }

    static constexpr bool kInt8 = std::is_same_v<TK, int8_t>;

    SplitQkvRmsnormRopeTiling t_;
    AscendC::TPipe* pipe_ = nullptr;
    uint32_t D_ = 0, Dp_ = 0, R_ = 0, bt_ = 0, bh_ = 0, pitch_ = 0, qStride_ = 0;
    uint32_t qBlocks_ = 0, kEnd_ = 0, gEnd_ = 0, headBlocks_ = 0, rPad_ = 0, csw_ = 0, cachePitch_ = 0;
    uint64_t kCol_ = 0, vCol_ = 0;
    bool hasNorm_ = false, gate_ = false, vNorm_ = false, mrope_ = false;
    bool kv_ = false, kvNz_ = false, perChannel_ = false, kOutWritten_ = true, vOutWritten_ = false;
    uint32_t dq_ = 0;
    float kScalar_ = 1.0f, vScalar_ = 1.0f;  // int8, per tensor: the scales
    bool axisUsed_[kAxes] = {false, false, false};  // mRoPE: axes some lane reads

    AscendC::GlobalTensor<T> qkvGm_, qOutGm_, kOutGm_, gateOutGm_, vOutGm_;
    AscendC::GlobalTensor<TC> cacheGm_;
    AscendC::GlobalTensor<int32_t> pos32Gm_;
    AscendC::GlobalTensor<int64_t> pos64Gm_;
    AscendC::GlobalTensor<TK> kCacheGm_, vCacheGm_;
    AscendC::GlobalTensor<int32_t> slot32Gm_;
    AscendC::GlobalTensor<int64_t> slot64Gm_;
    AscendC::GlobalTensor<float> kScaleGm_, vScaleGm_;

    AscendC::TQue<AscendC::QuePosition::VECIN, 1> inQueX_, inQueCs_, inQueScale_;
    AscendC::TQue<AscendC::QuePosition::VECOUT, 1> outQueY_, outQueQ_;
    AscendC::TBuf<AscendC::TPosition::VECCALC> xBuf_, rotBuf_, cosBuf_, sinBuf_;
    AscendC::TBuf<AscendC::TPosition::VECCALC> rotOffBuf_, cosOffBuf_, sinOffBuf_, csxBuf_;
    AscendC::TBuf<AscendC::TPosition::VECCALC> axisRowsBuf_, laneOffBuf_;
    AscendC::TBuf<AscendC::TPosition::VECCALC> sumBuf_, oneBuf_, workBuf_;
    AscendC::TBuf<AscendC::TPosition::VECCALC> qwBuf_, kwBuf_, qbBuf_, kbBuf_;
    AscendC::TBuf<AscendC::TPosition::VECCALC> halfBuf_, scaleBuf_;
};

}  // namespace sqrr

#endif  // SPLIT_QKV_RMSNORM_ROPE_KERNEL_H

