// Host implementation of the subset of the AscendC kernel API that csrc/ kernels use.
//
// This is NOT CANN and not a simulator of the NPU's timing: it lets the *same kernel source*
// that CANN's bisheng compiles for an AI Core vector unit be compiled by g++ and run on the
// host, block by block, with the constraints the hardware imposes turned into loud failures
// (a C++ exception of type ascendc_host_sim::SimError):
//
//  * Unified Buffer capacity: TPipe::InitBuffer beyond the per-core UB fails.
//  * Alignment: UB operands of vector instructions and DataCopy start 32-byte aligned; plain
//    DataCopy moves a multiple of 32 bytes (anything else must be DataCopyPad).
//  * Queues: AllocTensor with no free buffer, EnQue beyond the queue depth, DeQue of an empty
//    queue, FreeTensor twice, touching a buffer while it sits in a queue, and buffers or queue
//    entries left over when the block ends all fail.
//  * Pipe hazards: a vector op reading UB that MTE2 (copy-in) may still be writing, MTE3
//    (copy-out) reading UB the vector unit wrote, a vector op reading what an earlier vector op
//    wrote without PipeBarrier<PIPE_V>, a scalar GetValue/SetValue of UB a vector op wrote
//    without a V_S flag, a vector op on UB a scalar SetValue wrote without an S_V flag,
//    WaitFlag without SetFlag.
//  * Global memory: every GM access must fall inside the GlobalTensor's declared size and inside
//    a tensor registered with the runtime (ascendc_host_sim::RegisterGm); writes only into
//    writable ones. Reads and writes are recorded byte by byte for the tests.
//  * Blocks: Launch runs the kernel once per block index 0..blockDim-1 with a fresh core (its own
//    UB, filled with NaN bytes so that reading never-written UB poisons results).
//
// Semantics follow the CANN AscendC API reference (function prototypes and parameter units);
// see docs/ascendc.md for the list of calls and the pages they come from.
#ifndef ASCENDC_HOST_SIM_KERNEL_OPERATOR_H
#define ASCENDC_HOST_SIM_KERNEL_OPERATOR_H

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#define ASCENDC_HOST_SIM 1
#define __global__
#define __aicore__
#define __gm__
#define GM_ADDR uint8_t*

// ------------------------------------------------------------------------------------------
// 16-bit float types (bisheng's `half` builtin and AscendC's `bfloat16_t`): storage only; the
// kernel converts through Cast, never computes on them directly.
// ------------------------------------------------------------------------------------------
struct half {
    uint16_t bits;
};
struct bfloat16_t {
    uint16_t bits;
};

namespace ascendc_host_sim {

struct SimError : std::runtime_error {
    explicit SimError(const std::string& what) : std::runtime_error(what) {}
};

[[noreturn]] inline void Fail(const std::string& what) { throw SimError(what); }

inline float Bf16ToFloat(uint16_t b) {
    uint32_t u = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline uint16_t FloatToBf16Rne(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
}
inline float HalfToFloat(uint16_t b) {
    _Float16 h;
    std::memcpy(&h, &b, 2);
    return static_cast<float>(h);
}
inline uint16_t FloatToHalfRne(float f) {
    _Float16 h = static_cast<_Float16>(f);  // IEEE round-to-nearest-even
    uint16_t b;
    std::memcpy(&b, &h, 2);
    return b;
}

template <typename T> inline float ToFloat(T v) { return static_cast<float>(v); }
template <> inline float ToFloat<half>(half v) { return HalfToFloat(v.bits); }
template <> inline float ToFloat<bfloat16_t>(bfloat16_t v) { return Bf16ToFloat(v.bits); }
template <typename T> inline T FromFloatRne(float f) { return static_cast<T>(f); }
template <> inline half FromFloatRne<half>(float f) { return half{FloatToHalfRne(f)}; }
template <> inline bfloat16_t FromFloatRne<bfloat16_t>(float f) { return bfloat16_t{FloatToBf16Rne(f)}; }

template <typename T> const char* TypeName() { return "?"; }
template <> inline const char* TypeName<float>() { return "float"; }
template <> inline const char* TypeName<half>() { return "half"; }
template <> inline const char* TypeName<bfloat16_t>() { return "bfloat16_t"; }
template <> inline const char* TypeName<uint32_t>() { return "uint32_t"; }
template <> inline const char* TypeName<int32_t>() { return "int32_t"; }
template <> inline const char* TypeName<int64_t>() { return "int64_t"; }

constexpr uint32_t kBlockBytes = 32;
inline uint64_t RoundUp(uint64_t x, uint64_t m) { return (x + m - 1) / m * m; }

// ------------------------------------------------------------------------------------------
// Global memory registry: the tensors a launch may touch, with byte-level access maps.
// ------------------------------------------------------------------------------------------
struct GmRegion {
    uint8_t* base;
    uint64_t bytes;
    bool writable;
    std::string name;
    std::vector<uint8_t> read, written;
};

inline std::vector<GmRegion>& GmRegions() {
    static std::vector<GmRegion> regions;
    return regions;
}
inline void ResetGm() { GmRegions().clear(); }
inline int RegisterGm(void* base, uint64_t bytes, bool writable, const std::string& name) {
    GmRegions().push_back(GmRegion{static_cast<uint8_t*>(base), bytes, writable, name,
                                   std::vector<uint8_t>(bytes, 0), std::vector<uint8_t>(bytes, 0)});
    return static_cast<int>(GmRegions().size()) - 1;
}
inline void GmAccess(const void* ptr, uint64_t bytes, bool write, const char* what) {
    const uint8_t* p = static_cast<const uint8_t*>(ptr);
    for (auto& r : GmRegions()) {
        if (p >= r.base && p + bytes <= r.base + r.bytes) {
            if (write && !r.writable) {
                std::ostringstream os;
                os << what << ": write of " << bytes << " bytes into read-only GM tensor '" << r.name << "'";
                Fail(os.str());
            }
            auto& map = write ? r.written : r.read;
            std::memset(map.data() + (p - r.base), 1, bytes);
            return;
        }
    }
    std::ostringstream os;
    os << what << ": GM access of " << bytes << " bytes at " << ptr << " lies outside every registered tensor";
    Fail(os.str());
}

// ------------------------------------------------------------------------------------------
// Per-core state: the UB, its buffers and the hazard bookkeeping.
// ------------------------------------------------------------------------------------------
enum class BufState { kFree, kAllocated, kQueued, kDequeued, kTBuf };

struct Buf {
    uint32_t addr = 0, len = 0;
    BufState state = BufState::kTBuf;
    int queue = -1;              // owning queue id, -1 for TBuf
    bool mte2Pending = false;    // MTE2 wrote it and nobody synchronised yet
    bool vPending = false;       // the vector unit wrote it and MTE3 was not synchronised yet
};

struct QueueState {
    int depth = 1;
    int position = 0;
    std::vector<int> bufs;
    std::deque<int> fifo;
};

struct Core {
    uint32_t blockIdx = 0, blockNum = 1;
    uint32_t ubCapacity = 0, ubUsed = 0;
    std::vector<uint8_t> ub;
    std::vector<Buf> bufs;
    std::vector<QueueState> queues;
    std::vector<std::pair<uint32_t, uint32_t>> vWritesSinceBarrier;  // (addr, bytes) since PipeBarrier<PIPE_V>
    std::vector<std::pair<uint32_t, uint32_t>> vWritesSinceVS;       // since WaitFlag<V_S>
    std::vector<std::pair<uint32_t, uint32_t>> sWritesSinceSV;       // scalar writes since WaitFlag<S_V>
    std::map<std::pair<int, int>, int> flags;
    void* pipe = nullptr;
};

inline Core*& CurrentCore() {
    static Core* core = nullptr;
    return core;
}
inline Core& C() {
    Core* c = CurrentCore();
    if (c == nullptr) Fail("AscendC call outside ascendc_host_sim::Launch");
    return *c;
}
struct LaunchStats {
    uint32_t ubPeak = 0;    // largest UB allocation of any block of the last launch
    uint32_t blocksRun = 0;
};
inline LaunchStats& Stats() {
    static LaunchStats s;
    return s;
}

inline Buf& BufAt(int id) {
    if (id < 0 || id >= static_cast<int>(C().bufs.size())) Fail("LocalTensor used without a buffer (default-constructed?)");
    return C().bufs[id];
}

inline void CheckUsable(int bufId, const char* what) {
    Buf& b = BufAt(bufId);
    if (b.state == BufState::kFree) Fail(std::string(what) + ": buffer used after FreeTensor (or before AllocTensor)");
    if (b.state == BufState::kQueued) Fail(std::string(what) + ": buffer used while it sits in a queue (EnQue without DeQue)");
}

inline bool Overlaps(uint32_t a, uint32_t alen, uint32_t b, uint32_t blen) { return a < b + blen && b < a + alen; }
inline bool AnyOverlap(const std::vector<std::pair<uint32_t, uint32_t>>& ranges, uint32_t addr, uint32_t len) {
    for (auto& r : ranges) {
        if (Overlaps(addr, len, r.first, r.second)) return true;
    }
    return false;
}

}  // namespace ascendc_host_sim

// ------------------------------------------------------------------------------------------
// Pipes and events (global names, as in AscendC)
// ------------------------------------------------------------------------------------------
enum pipe_t { PIPE_S = 0, PIPE_V, PIPE_M, PIPE_MTE1, PIPE_MTE2, PIPE_MTE3, PIPE_ALL };
enum event_t { EVENT_ID0 = 0, EVENT_ID1, EVENT_ID2, EVENT_ID3, EVENT_ID4, EVENT_ID5, EVENT_ID6, EVENT_ID7 };

namespace AscendC {

namespace sim = ascendc_host_sim;

enum class TPosition { GM = 0, VECIN, VECOUT, VECCALC, A1, A2, B1, B2, C1, C2, CO1, CO2 };
using QuePosition = TPosition;
enum class HardEvent { MTE2_V = 0, V_MTE3, V_S, S_V, MTE2_S, S_MTE3, MTE3_V, V_MTE2, MTE3_MTE2, MTE2_MTE3 };
enum class RoundMode { CAST_NONE = 0, CAST_RINT, CAST_FLOOR, CAST_CEIL, CAST_ROUND, CAST_TRUNC, CAST_ODD };
using TEventID = int8_t;

template <typename T, typename U> struct IsSameType { static constexpr bool value = false; };
template <typename T> struct IsSameType<T, T> { static constexpr bool value = true; };

inline int64_t GetBlockIdx() { return sim::C().blockIdx; }
inline int64_t GetBlockNum() { return sim::C().blockNum; }

// ------------------------------------------------------------------------------------------
// Tensors
// ------------------------------------------------------------------------------------------
template <typename T> class LocalTensor {
public:
    LocalTensor() = default;
    LocalTensor(int buf, uint32_t addr, uint32_t size) : buf_(buf), addr_(addr), size_(size) {}

    LocalTensor operator[](uint32_t offset) const {
        if (offset > size_) sim::Fail("LocalTensor[offset]: offset past the end of the tensor");
        return LocalTensor(buf_, addr_ + offset * static_cast<uint32_t>(sizeof(T)), size_ - offset);
    }
    template <typename U> LocalTensor<U> ReinterpretCast() const {
        return LocalTensor<U>(buf_, addr_, static_cast<uint32_t>(uint64_t(size_) * sizeof(T) / sizeof(U)));
    }
    uint32_t GetSize() const { return size_; }

    T GetValue(uint32_t i) const {
        CheckScalar(i, "LocalTensor::GetValue");
        if (sim::AnyOverlap(sim::C().vWritesSinceVS, addr_ + i * sizeof(T), sizeof(T)))
            sim::Fail("LocalTensor::GetValue: scalar read of UB after vector writes without SetFlag/WaitFlag<HardEvent::V_S>");
        if (sim::BufAt(buf_).mte2Pending)
            sim::Fail("LocalTensor::GetValue: scalar read of UB that MTE2 may still be writing (DeQue or MTE2_S flag first)");
        T v;
        std::memcpy(&v, sim::C().ub.data() + addr_ + i * sizeof(T), sizeof(T));
        return v;
    }
    void SetValue(uint32_t i, T v) const {
        CheckScalar(i, "LocalTensor::SetValue");
        if (sim::AnyOverlap(sim::C().vWritesSinceVS, addr_ + i * sizeof(T), sizeof(T)))
            sim::Fail("LocalTensor::SetValue: scalar write of UB a vector op wrote, without SetFlag/WaitFlag<HardEvent::V_S>");
        std::memcpy(sim::C().ub.data() + addr_ + i * sizeof(T), &v, sizeof(T));
        sim::C().sWritesSinceSV.emplace_back(addr_ + i * static_cast<uint32_t>(sizeof(T)), static_cast<uint32_t>(sizeof(T)));
    }

    // --- host-sim internals (not AscendC API) ---
    int SimBuf() const { return buf_; }
    uint32_t SimAddr() const { return addr_; }
    T* SimPtr() const { return reinterpret_cast<T*>(sim::C().ub.data() + addr_); }

private:
    void CheckScalar(uint32_t i, const char* what) const {
        sim::CheckUsable(buf_, what);
        if (i >= size_) sim::Fail(std::string(what) + ": index past the end of the tensor");
    }
    int buf_ = -1;
    uint32_t addr_ = 0;
    uint32_t size_ = 0;
};

template <typename T> class GlobalTensor {
public:
    void SetGlobalBuffer(__gm__ T* buffer, uint64_t bufferSize) {
        ptr_ = buffer;
        size_ = bufferSize;
    }
    GlobalTensor operator[](uint64_t offset) const {
        if (offset > size_) sim::Fail("GlobalTensor[offset]: offset past the declared buffer size");
        GlobalTensor g;
        g.ptr_ = ptr_ + offset;
        g.size_ = size_ - offset;
        return g;
    }
    T GetValue(uint64_t i) const {
        Check(i, 1, false, "GlobalTensor::GetValue");
        return ptr_[i];
    }
    void SetValue(uint64_t i, T v) const {
        Check(i, 1, true, "GlobalTensor::SetValue");
        ptr_[i] = v;
    }
    __gm__ T* GetPhyAddr() const { return ptr_; }
    uint64_t GetSize() const { return size_; }

    // --- host-sim internal: checks [i, i+n) against the declared size and the registry ---
    void Check(uint64_t i, uint64_t n, bool write, const char* what) const {
        if (ptr_ == nullptr) sim::Fail(std::string(what) + ": GlobalTensor without SetGlobalBuffer");
        if (i + n > size_) {
            std::ostringstream os;
            os << what << ": elements [" << i << ", " << i + n << ") outside the declared GM buffer of " << size_;
            sim::Fail(os.str());
        }
        sim::GmAccess(ptr_ + i, n * sizeof(T), write, what);
    }

private:
    __gm__ T* ptr_ = nullptr;
    uint64_t size_ = 0;
};

// ------------------------------------------------------------------------------------------
// Pipe, queues, buffers
// ------------------------------------------------------------------------------------------
template <TPosition POS, int32_t DEPTH> class TQue;
template <TPosition POS> class TBuf;

class TPipe {
public:
    TPipe() { sim::C().pipe = this; }
    ~TPipe() {
        if (sim::CurrentCore() != nullptr && sim::C().pipe == this) sim::C().pipe = nullptr;
    }
    template <TPosition POS, int32_t DEPTH> void InitBuffer(TQue<POS, DEPTH>& que, uint8_t num, uint32_t len);
    template <TPosition POS> void InitBuffer(TBuf<POS>& buf, uint32_t len);
    TEventID FetchEventID(HardEvent) { return static_cast<TEventID>(EVENT_ID0); }

    // --- host-sim internal ---
    static int Allocate(uint32_t len, sim::BufState state, int queue) {
        sim::Core& c = sim::C();
        if (len == 0) sim::Fail("TPipe::InitBuffer: zero-length buffer");
        uint32_t size = static_cast<uint32_t>(sim::RoundUp(len, sim::kBlockBytes));
        if (uint64_t(c.ubUsed) + size > c.ubCapacity) {
            std::ostringstream os;
            os << "UB overflow: TPipe::InitBuffer of " << len << " bytes with " << c.ubUsed << " of " << c.ubCapacity
               << " bytes already allocated";
            sim::Fail(os.str());
        }
        sim::Buf b;
        b.addr = c.ubUsed;
        b.len = size;
        b.state = state;
        b.queue = queue;
        c.ubUsed += size;
        if (c.ubUsed > sim::Stats().ubPeak) sim::Stats().ubPeak = c.ubUsed;
        c.bufs.push_back(b);
        return static_cast<int>(c.bufs.size()) - 1;
    }
};

inline TPipe* GetTPipePtr() {
    TPipe* p = static_cast<TPipe*>(sim::C().pipe);
    if (p == nullptr) sim::Fail("GetTPipePtr: no TPipe alive");
    return p;
}

template <TPosition POS, int32_t DEPTH> class TQue {
public:
    template <typename T> LocalTensor<T> AllocTensor() {
        sim::QueueState& q = State("TQue::AllocTensor");
        for (int id : q.bufs) {
            sim::Buf& b = sim::C().bufs[id];
            if (b.state == sim::BufState::kFree) {
                b.state = sim::BufState::kAllocated;
                b.mte2Pending = b.vPending = false;
                return LocalTensor<T>(id, b.addr, b.len / sizeof(T));
            }
        }
        sim::Fail("TQue::AllocTensor: every buffer of the queue is in use (a FreeTensor is missing; on the NPU this hangs)");
    }
    template <typename T> void EnQue(const LocalTensor<T>& t) {
        sim::QueueState& q = State("TQue::EnQue");
        sim::Buf& b = Own(t, "TQue::EnQue");
        if (b.state != sim::BufState::kAllocated)
            sim::Fail("TQue::EnQue: tensor is not freshly allocated (queued twice, or already dequeued)");
        if (static_cast<int>(q.fifo.size()) >= q.depth)
            sim::Fail("TQue::EnQue: queue already holds DEPTH tensors (EnQue beyond depth)");
        b.state = sim::BufState::kQueued;
        q.fifo.push_back(t.SimBuf());
    }
    template <typename T> LocalTensor<T> DeQue() {
        sim::QueueState& q = State("TQue::DeQue");
        if (q.fifo.empty()) sim::Fail("TQue::DeQue: queue is empty (DeQue without EnQue; on the NPU this hangs)");
        int id = q.fifo.front();
        q.fifo.pop_front();
        sim::Buf& b = sim::C().bufs[id];
        b.state = sim::BufState::kDequeued;
        b.mte2Pending = b.vPending = false;  // the queue synchronises producer and consumer pipes
        return LocalTensor<T>(id, b.addr, b.len / sizeof(T));
    }
    template <typename T> void FreeTensor(const LocalTensor<T>& t) {
        sim::Buf& b = Own(t, "TQue::FreeTensor");
        if (b.state == sim::BufState::kFree) sim::Fail("TQue::FreeTensor: buffer freed twice");
        if (b.state == sim::BufState::kQueued) sim::Fail("TQue::FreeTensor: buffer is still in the queue");
        b.state = sim::BufState::kFree;
    }

    // --- host-sim internal ---
    int simId = -1;

private:
    sim::QueueState& State(const char* what) {
        if (simId < 0) sim::Fail(std::string(what) + ": queue used before TPipe::InitBuffer");
        return sim::C().queues[simId];
    }
    template <typename T> sim::Buf& Own(const LocalTensor<T>& t, const char* what) {
        sim::QueueState& q = State(what);
        for (int id : q.bufs) {
            if (id == t.SimBuf()) {
                if (t.SimAddr() != sim::C().bufs[id].addr)
                    sim::Fail(std::string(what) + ": tensor is a slice, not the tensor AllocTensor returned");
                return sim::C().bufs[id];
            }
        }
        sim::Fail(std::string(what) + ": tensor does not belong to this queue");
    }
};

template <TPosition POS> class TBuf {
public:
    template <typename T> LocalTensor<T> Get() const {
        const sim::Buf& b = Buf();
        return LocalTensor<T>(simId, b.addr, b.len / sizeof(T));
    }
    template <typename T> LocalTensor<T> Get(uint32_t len) const {
        const sim::Buf& b = Buf();
        if (uint64_t(len) * sizeof(T) > b.len) sim::Fail("TBuf::Get(len): more elements than the buffer holds");
        return LocalTensor<T>(simId, b.addr, len);
    }
    template <typename T> LocalTensor<T> GetWithOffset(uint32_t size, uint32_t bufOffset) const {
        const sim::Buf& b = Buf();
        if (bufOffset % sim::kBlockBytes) sim::Fail("TBuf::GetWithOffset: offset is not 32-byte aligned");
        if (uint64_t(bufOffset) + uint64_t(size) * sizeof(T) > b.len) sim::Fail("TBuf::GetWithOffset: past the end of the buffer");
        return LocalTensor<T>(simId, b.addr + bufOffset, size);
    }
    int simId = -1;

private:
    const sim::Buf& Buf() const {
        if (simId < 0) sim::Fail("TBuf used before TPipe::InitBuffer");
        return sim::C().bufs[simId];
    }
};

template <TPosition POS, int32_t DEPTH> void TPipe::InitBuffer(TQue<POS, DEPTH>& que, uint8_t num, uint32_t len) {
    static_assert(DEPTH >= 1, "TQue depth must be >= 1");
    sim::Core& c = sim::C();
    if (que.simId >= 0) sim::Fail("TPipe::InitBuffer: queue initialised twice");
    if (num < 1) sim::Fail("TPipe::InitBuffer: a queue needs at least one buffer");
    sim::QueueState q;
    q.depth = DEPTH;
    q.position = static_cast<int>(POS);
    c.queues.push_back(q);
    que.simId = static_cast<int>(c.queues.size()) - 1;
    for (int i = 0; i < num; ++i) {
        int id = Allocate(len, sim::BufState::kFree, que.simId);
        c.queues[que.simId].bufs.push_back(id);
    }
}
template <TPosition POS> void TPipe::InitBuffer(TBuf<POS>& buf, uint32_t len) {
    if (buf.simId >= 0) sim::Fail("TPipe::InitBuffer: TBuf initialised twice");
    buf.simId = Allocate(len, sim::BufState::kTBuf, -1);
}

// ------------------------------------------------------------------------------------------
// Synchronisation
// ------------------------------------------------------------------------------------------
template <pipe_t PIPE> inline void PipeBarrier() {
    sim::Core& c = sim::C();
    if (PIPE == PIPE_V || PIPE == PIPE_ALL) c.vWritesSinceBarrier.clear();
    if (PIPE == PIPE_ALL) {
        c.vWritesSinceVS.clear();
        c.sWritesSinceSV.clear();
        for (auto& b : c.bufs) b.mte2Pending = b.vPending = false;
    }
}
template <HardEvent E> inline void SetFlag(int32_t id) { sim::C().flags[{static_cast<int>(E), id}] += 1; }
template <HardEvent E> inline void WaitFlag(int32_t id) {
    sim::Core& c = sim::C();
    auto it = c.flags.find({static_cast<int>(E), id});
    if (it == c.flags.end() || it->second == 0) sim::Fail("WaitFlag without a matching SetFlag (on the NPU this hangs)");
    it->second -= 1;
    switch (E) {
        case HardEvent::V_S: c.vWritesSinceVS.clear(); break;
        case HardEvent::S_V: c.sWritesSinceSV.clear(); break;
        case HardEvent::MTE2_V:
        case HardEvent::MTE2_S:
            for (auto& b : c.bufs) b.mte2Pending = false;
            break;
        case HardEvent::V_MTE3:
            for (auto& b : c.bufs) b.vPending = false;
            break;
        default: break;
    }
}

namespace detail {
// A vector instruction's operand: usable buffer, 32-byte aligned start, count elements inside.
template <typename T> inline T* VecOperand(const LocalTensor<T>& t, uint32_t count, bool write, const char* what) {
    sim::Core& c = sim::C();
    sim::CheckUsable(t.SimBuf(), what);
    if (t.SimAddr() % sim::kBlockBytes) {
        std::ostringstream os;
        os << what << ": UB operand at byte " << t.SimAddr() << " is not 32-byte aligned";
        sim::Fail(os.str());
    }
    if (count > t.GetSize()) {
        std::ostringstream os;
        os << what << ": " << count << " elements exceed the operand's " << t.GetSize();
        sim::Fail(os.str());
    }
    sim::Buf& b = sim::BufAt(t.SimBuf());
    if (b.mte2Pending) sim::Fail(std::string(what) + ": vector op touches UB that MTE2 may still be writing (missing EnQue/DeQue or MTE2_V flag)");
    uint32_t bytes = count * static_cast<uint32_t>(sizeof(T));
    if (sim::AnyOverlap(c.sWritesSinceSV, t.SimAddr(), bytes))
        sim::Fail(std::string(what) + ": vector op touches UB a scalar SetValue wrote, without SetFlag/WaitFlag<HardEvent::S_V>");
    if (!write) {
        for (auto& w : c.vWritesSinceBarrier) {
            if (sim::Overlaps(t.SimAddr(), bytes, w.first, w.second))
                sim::Fail(std::string(what) + ": reads UB written by an earlier vector op without PipeBarrier<PIPE_V>()");
        }
    }
    return t.SimPtr();
}
template <typename T> inline void VecWrote(const LocalTensor<T>& t, uint32_t count) {
    sim::Core& c = sim::C();
    c.vWritesSinceBarrier.emplace_back(t.SimAddr(), count * static_cast<uint32_t>(sizeof(T)));
    c.vWritesSinceVS.emplace_back(t.SimAddr(), count * static_cast<uint32_t>(sizeof(T)));
    sim::BufAt(t.SimBuf()).vPending = true;
}
template <typename T> inline void RequireFloat(const char* what) {
    if (!std::is_same<T, float>::value) sim::Fail(std::string(what) + ": host sim models float operands only");
}
template <typename T> inline void RequireArith(const char* what) {
    if (!std::is_same<T, float>::value && !std::is_same<T, int32_t>::value)
        sim::Fail(std::string(what) + ": host sim models float and int32_t operands only");
}
}  // namespace detail

// ------------------------------------------------------------------------------------------
// Vector instructions ("first count elements" forms)
// ------------------------------------------------------------------------------------------
template <typename T, typename U> inline void Cast(const LocalTensor<T>& dst, const LocalTensor<U>& src, RoundMode mode, uint32_t count) {
    const U* s = detail::VecOperand(src, count, false, "Cast");
    T* d = detail::VecOperand(dst, count, true, "Cast");
    constexpr bool widen = std::is_same<T, float>::value && (std::is_same<U, half>::value || std::is_same<U, bfloat16_t>::value);
    constexpr bool narrow = std::is_same<U, float>::value && (std::is_same<T, half>::value || std::is_same<T, bfloat16_t>::value);
    // half -> int8_t: rounded by the mode (CAST_NONE rounds as CAST_RINT when inexact), overflow
    // saturated ("溢出默认按照饱和处理"); A2 supports CAST_RINT/FLOOR/CEIL/ROUND/TRUNC/NONE for it
    // (asc-devkit docs/api/context/Cast.md, table 4). A NaN source is not modelled: it fails here.
    constexpr bool toInt8 = std::is_same<U, half>::value && std::is_same<T, int8_t>::value;
    static_assert(widen || narrow || toInt8, "host sim models Cast between float and half/bfloat16_t, and half -> int8_t, only");
    std::vector<T> out(count);
    for (uint32_t i = 0; i < count; ++i) {
        if constexpr (toInt8) {
            const double v = sim::ToFloat(s[i]);
            double r = 0.0;
            switch (mode) {
                case RoundMode::CAST_NONE:
                case RoundMode::CAST_RINT: r = std::nearbyint(v); break;  // default FE_TONEAREST: half to even
                case RoundMode::CAST_FLOOR: r = std::floor(v); break;
                case RoundMode::CAST_CEIL: r = std::ceil(v); break;
                case RoundMode::CAST_ROUND: r = std::round(v); break;  // half away from zero
                case RoundMode::CAST_TRUNC: r = std::trunc(v); break;
                default: sim::Fail("Cast(half -> int8_t): CAST_ODD is not supported for this conversion");
            }
            if (std::isnan(r)) sim::Fail("Cast(half -> int8_t): NaN source (not modelled)");
            out[i] = static_cast<int8_t>(r < -128.0 ? -128.0 : (r > 127.0 ? 127.0 : r));
        } else if constexpr (widen) {
            if (mode != RoundMode::CAST_NONE) sim::Fail("Cast: widening to float takes RoundMode::CAST_NONE");
            out[i] = sim::ToFloat(s[i]);
        } else {
            if (mode == RoundMode::CAST_RINT || (mode == RoundMode::CAST_NONE && std::is_same<T, half>::value)) {
                out[i] = sim::FromFloatRne<T>(s[i]);
            } else {
                sim::Fail("Cast: host sim models float -> half/bfloat16_t with CAST_RINT (or CAST_NONE to half) only");
            }
        }
    }
    std::memcpy(d, out.data(), count * sizeof(T));
    detail::VecWrote(dst, count);
}

#define ASCENDC_HOST_SIM_BINARY(NAME, EXPR)                                                                   \
    template <typename T> inline void NAME(const LocalTensor<T>& dst, const LocalTensor<T>& a, const LocalTensor<T>& b, \
                                           const int32_t count) {                                             \
        detail::RequireArith<T>(#NAME);                                                                        \
        const T* x = detail::VecOperand(a, count, false, #NAME);                                             \
        const T* y = detail::VecOperand(b, count, false, #NAME);                                             \
        T* d = detail::VecOperand(dst, count, true, #NAME);                                                  \
        std::vector<T> out(count);                                                                             \
        for (int32_t i = 0; i < count; ++i) out[i] = (EXPR);                                                   \
        std::memcpy(d, out.data(), count * sizeof(T));                                                         \
        detail::VecWrote(dst, count);                                                                          \
    }
ASCENDC_HOST_SIM_BINARY(Add, x[i] + y[i])
ASCENDC_HOST_SIM_BINARY(Sub, x[i] - y[i])
ASCENDC_HOST_SIM_BINARY(Mul, x[i] * y[i])
ASCENDC_HOST_SIM_BINARY(Div, x[i] / y[i])
#undef ASCENDC_HOST_SIM_BINARY

#define ASCENDC_HOST_SIM_SCALAR(NAME, EXPR)                                                                   \
    template <typename T> inline void NAME(const LocalTensor<T>& dst, const LocalTensor<T>& src, const T& scalar, \
                                           const int32_t count) {                                             \
        detail::RequireArith<T>(#NAME);                                                                        \
        const T* x = detail::VecOperand(src, count, false, #NAME);                                           \
        T* d = detail::VecOperand(dst, count, true, #NAME);                                                  \
        std::vector<T> out(count);                                                                             \
        for (int32_t i = 0; i < count; ++i) out[i] = (EXPR);                                                   \
        std::memcpy(d, out.data(), count * sizeof(T));                                                         \
        detail::VecWrote(dst, count);                                                                          \
    }
ASCENDC_HOST_SIM_SCALAR(Adds, x[i] + scalar)
ASCENDC_HOST_SIM_SCALAR(Muls, x[i] * scalar)
// Maxs / Mins (dst[i] = max(src[i], scalar) / min(...)): asc-devkit
// include/basic_api/kernel_operator_vec_binary_scalar_intf.h, docs/api/context/Maxs.md,
// "template <typename T, bool isSetMask = true> void Maxs(const LocalTensor<T>& dst, const
// LocalTensor<T>& src, const T& scalarValue, const int32_t& count)". A NaN operand's result is not
// modelled (here it propagates); kernels clamp values they copy out, never NaN padding lanes.
ASCENDC_HOST_SIM_SCALAR(Maxs, x[i] < scalar ? scalar : x[i])
ASCENDC_HOST_SIM_SCALAR(Mins, x[i] > scalar ? scalar : x[i])
#undef ASCENDC_HOST_SIM_SCALAR

template <typename T> inline void Sqrt(const LocalTensor<T>& dst, const LocalTensor<T>& src, const int32_t count) {
    detail::RequireFloat<T>("Sqrt");
    const T* x = detail::VecOperand(src, count, false, "Sqrt");
    T* d = detail::VecOperand(dst, count, true, "Sqrt");
    std::vector<T> out(count);
    for (int32_t i = 0; i < count; ++i) out[i] = std::sqrt(x[i]);
    std::memcpy(d, out.data(), count * sizeof(T));
    detail::VecWrote(dst, count);
}

template <typename T> inline void Duplicate(const LocalTensor<T>& dst, const T& scalar, const int32_t count) {
    T* d = detail::VecOperand(dst, count, true, "Duplicate");
    for (int32_t i = 0; i < count; ++i) d[i] = scalar;
    detail::VecWrote(dst, count);
}

// ReduceSum, "first count elements" form: binary tree inside each 256-byte repeat, repeats summed
// in order (the documented A2/A3 order). dst[0] receives the sum; workLocal is scratch whose
// minimum size follows the API reference's formula.
template <typename T>
inline void ReduceSum(const LocalTensor<T>& dst, const LocalTensor<T>& src, const LocalTensor<T>& workLocal, const int32_t count) {
    detail::RequireFloat<T>("ReduceSum");
    const T* x = detail::VecOperand(src, count, false, "ReduceSum");
    constexpr int32_t perRepeat = 256 / sizeof(T);
    constexpr int32_t perBlock = 32 / sizeof(T);
    int32_t repeats = (count + perRepeat - 1) / perRepeat;
    int32_t workNeed = (repeats + perBlock - 1) / perBlock * perBlock;
    T* w = detail::VecOperand(workLocal, workNeed, true, "ReduceSum(workLocal)");
    T* d = detail::VecOperand(dst, 1, true, "ReduceSum");
    float total = 0.0f;
    for (int32_t r = 0; r < repeats; ++r) {
        float lane[perRepeat];
        int32_t n = count - r * perRepeat < perRepeat ? count - r * perRepeat : perRepeat;
        for (int32_t i = 0; i < perRepeat; ++i) lane[i] = i < n ? x[r * perRepeat + i] : 0.0f;
        for (int32_t width = perRepeat / 2; width >= 1; width /= 2)
            for (int32_t i = 0; i < width; ++i) lane[i] = lane[2 * i] + lane[2 * i + 1];
        w[r] = lane[0];
        total += lane[0];
    }
    d[0] = total;
    detail::VecWrote(workLocal, workNeed);
    detail::VecWrote(dst, 1);
}

// Gather: dst[i] = element at byte (srcBaseAddr + srcOffset[i]) of src.
template <typename T>
inline void Gather(const LocalTensor<T>& dst, const LocalTensor<T>& src, const LocalTensor<uint32_t>& srcOffset,
                   const uint32_t srcBaseAddr, const uint32_t count) {
    const uint32_t* off = detail::VecOperand(srcOffset, count, false, "Gather(srcOffset)");
    const T* s = detail::VecOperand(src, 0, false, "Gather(src)");
    T* d = detail::VecOperand(dst, count, true, "Gather");
    uint64_t srcBytes = uint64_t(src.GetSize()) * sizeof(T);
    std::vector<T> out(count);
    const uint8_t* base = reinterpret_cast<const uint8_t*>(s);
    for (uint32_t i = 0; i < count; ++i) {
        uint64_t byte = uint64_t(srcBaseAddr) + off[i];
        if (byte % sizeof(T)) sim::Fail("Gather: offset not a multiple of the element size");
        if (byte + sizeof(T) > srcBytes) sim::Fail("Gather: offset points past the end of src");
        for (auto& w : sim::C().vWritesSinceBarrier) {
            if (sim::Overlaps(src.SimAddr() + static_cast<uint32_t>(byte), sizeof(T), w.first, w.second))
                sim::Fail("Gather(src): reads UB written by an earlier vector op without PipeBarrier<PIPE_V>()");
        }
        std::memcpy(&out[i], base + byte, sizeof(T));
    }
    std::memcpy(d, out.data(), count * sizeof(T));
    detail::VecWrote(dst, count);
}

// ------------------------------------------------------------------------------------------
// Data movement
// ------------------------------------------------------------------------------------------
struct DataCopyExtParams {
    DataCopyExtParams() = default;
    DataCopyExtParams(uint16_t count, uint32_t len, uint32_t srcStrideIn, uint32_t dstStrideIn, uint32_t rsvIn)
        : blockCount(count), blockLen(len), srcStride(srcStrideIn), dstStride(dstStrideIn), rsv(rsvIn) {}
    uint16_t blockCount = 1;
    uint32_t blockLen = 0;   // bytes
    uint32_t srcStride = 0;  // GM->UB: bytes between GM blocks; UB->GM: 32-byte blocks between UB blocks
    uint32_t dstStride = 0;  // GM->UB: 32-byte blocks between UB blocks; UB->GM: bytes between GM blocks
    uint32_t rsv = 0;
};
template <typename T> struct DataCopyPadExtParams {
    DataCopyPadExtParams() = default;
    DataCopyPadExtParams(bool isPadIn, uint8_t left, uint8_t right, T value)
        : isPad(isPadIn), leftPadding(left), rightPadding(right), paddingValue(value) {}
    bool isPad = false;
    uint8_t leftPadding = 0;
    uint8_t rightPadding = 0;
    T paddingValue{};
};

namespace detail {
template <typename T> inline T* MteUb(const LocalTensor<T>& t, uint64_t bytes, bool write, const char* what) {
    sim::CheckUsable(t.SimBuf(), what);
    if (t.SimAddr() % sim::kBlockBytes) {
        std::ostringstream os;
        os << what << ": UB address " << t.SimAddr() << " is not 32-byte aligned";
        sim::Fail(os.str());
    }
    if (bytes > uint64_t(t.GetSize()) * sizeof(T)) {
        std::ostringstream os;
        os << what << ": " << bytes << " UB bytes exceed the tensor's " << uint64_t(t.GetSize()) * sizeof(T);
        sim::Fail(os.str());
    }
    sim::Buf& b = sim::BufAt(t.SimBuf());
    if (write) {
        if (b.state == sim::BufState::kDequeued)
            sim::Fail(std::string(what) + ": copy-in into a dequeued buffer (AllocTensor a fresh one)");
        b.mte2Pending = true;
    } else if (b.vPending) {
        sim::Fail(std::string(what) + ": copy-out of UB the vector unit wrote without EnQue/DeQue or a V_MTE3 flag");
    }
    return t.SimPtr();
}
}  // namespace detail

template <typename T> inline void DataCopy(const LocalTensor<T>& dst, const GlobalTensor<T>& src, const uint32_t count) {
    uint64_t bytes = uint64_t(count) * sizeof(T);
    if (bytes % sim::kBlockBytes) {
        std::ostringstream os;
        os << "DataCopy(GM->UB): " << bytes << " bytes is not a multiple of 32 (use DataCopyPad)";
        sim::Fail(os.str());
    }
    src.Check(0, count, false, "DataCopy(GM->UB)");
    T* d = detail::MteUb(dst, bytes, true, "DataCopy(GM->UB)");
    std::memcpy(d, src.GetPhyAddr(), bytes);
}
template <typename T> inline void DataCopy(const GlobalTensor<T>& dst, const LocalTensor<T>& src, const uint32_t count) {
    uint64_t bytes = uint64_t(count) * sizeof(T);
    if (bytes % sim::kBlockBytes) {
        std::ostringstream os;
        os << "DataCopy(UB->GM): " << bytes << " bytes is not a multiple of 32 (use DataCopyPad)";
        sim::Fail(os.str());
    }
    const T* s = detail::MteUb(src, bytes, false, "DataCopy(UB->GM)");
    dst.Check(0, count, true, "DataCopy(UB->GM)");
    std::memcpy(dst.GetPhyAddr(), s, bytes);
}

// GM -> UB: blockCount blocks of blockLen bytes; GM blocks srcStride bytes apart (end to start);
// each UB block starts 32-byte aligned, dstStride 32-byte blocks after the previous one's
// 32-byte-rounded end. With isPad, the bytes up to the 32-byte boundary take paddingValue.
template <typename T>
inline void DataCopyPad(const LocalTensor<T>& dst, const GlobalTensor<T>& src, const DataCopyExtParams& p,
                        const DataCopyPadExtParams<T>& pad) {
    const char* what = "DataCopyPad(GM->UB)";
    if (p.blockCount == 0 || p.blockCount > 4095) sim::Fail(std::string(what) + ": blockCount outside [1, 4095]");
    if (p.blockLen == 0 || p.blockLen % sizeof(T)) sim::Fail(std::string(what) + ": blockLen not a positive multiple of the element size");
    if (pad.isPad && (pad.leftPadding || pad.rightPadding)) sim::Fail(std::string(what) + ": host sim models left/right padding of 0 only");
    uint64_t ubPitch = sim::RoundUp(p.blockLen, sim::kBlockBytes) + uint64_t(p.dstStride) * sim::kBlockBytes;
    uint64_t gmPitch = uint64_t(p.blockLen) + p.srcStride;
    uint64_t ubBytes = ubPitch * (p.blockCount - 1) + sim::RoundUp(p.blockLen, sim::kBlockBytes);
    T* d = detail::MteUb(dst, ubBytes, true, what);
    uint8_t* db = reinterpret_cast<uint8_t*>(d);
    for (uint32_t b = 0; b < p.blockCount; ++b) {
        uint64_t gmOff = b * gmPitch;
        if (gmOff % sizeof(T)) sim::Fail(std::string(what) + ": srcStride not a multiple of the element size");
        src.Check(gmOff / sizeof(T), p.blockLen / sizeof(T), false, what);
        std::memcpy(db + b * ubPitch, reinterpret_cast<const uint8_t*>(src.GetPhyAddr()) + gmOff, p.blockLen);
        if (pad.isPad) {
            T* tail = reinterpret_cast<T*>(db + b * ubPitch + p.blockLen);
            uint64_t n = (sim::RoundUp(p.blockLen, sim::kBlockBytes) - p.blockLen) / sizeof(T);
            for (uint64_t i = 0; i < n; ++i) tail[i] = pad.paddingValue;
        }
    }
}

// UB -> GM: UB blocks start 32-byte aligned, srcStride 32-byte blocks after the previous one's
// rounded end; GM blocks dstStride bytes apart. Only blockLen bytes of each block are written.
template <typename T> inline void DataCopyPad(const GlobalTensor<T>& dst, const LocalTensor<T>& src, const DataCopyExtParams& p) {
    const char* what = "DataCopyPad(UB->GM)";
    if (p.blockCount == 0 || p.blockCount > 4095) sim::Fail(std::string(what) + ": blockCount outside [1, 4095]");
    if (p.blockLen == 0 || p.blockLen % sizeof(T)) sim::Fail(std::string(what) + ": blockLen not a positive multiple of the element size");
    uint64_t ubPitch = sim::RoundUp(p.blockLen, sim::kBlockBytes) + uint64_t(p.srcStride) * sim::kBlockBytes;
    uint64_t gmPitch = uint64_t(p.blockLen) + p.dstStride;
    uint64_t ubBytes = ubPitch * (p.blockCount - 1) + p.blockLen;
    const T* s = detail::MteUb(src, ubBytes, false, what);
    const uint8_t* sb = reinterpret_cast<const uint8_t*>(s);
    for (uint32_t b = 0; b < p.blockCount; ++b) {
        uint64_t gmOff = b * gmPitch;
        if (gmOff % sizeof(T)) sim::Fail(std::string(what) + ": dstStride not a multiple of the element size");
        dst.Check(gmOff / sizeof(T), p.blockLen / sizeof(T), true, what);
        std::memcpy(reinterpret_cast<uint8_t*>(dst.GetPhyAddr()) + gmOff, sb + b * ubPitch, p.blockLen);
    }
}

}  // namespace AscendC

// ------------------------------------------------------------------------------------------
// The launcher: the host-side stand-in for `kernel<<<blockDim, nullptr, stream>>>(...)`.
// ------------------------------------------------------------------------------------------
namespace ascendc_host_sim {

inline void CheckBlockEnd(Core& c) {
    for (size_t qi = 0; qi < c.queues.size(); ++qi) {
        if (!c.queues[qi].fifo.empty()) Fail("block ended with tensors still enqueued (EnQue without DeQue)");
        for (int id : c.queues[qi].bufs) {
            if (c.bufs[id].state != BufState::kFree) Fail("block ended with a queue buffer not freed (leaked AllocTensor/DeQue)");
        }
    }
    for (auto& f : c.flags) {
        if (f.second != 0) Fail("block ended with a SetFlag never waited on");
    }
}

// Runs body() once per block index, each on a fresh core with ubBytes of UB.
inline void Launch(uint32_t blockDim, uint32_t ubBytes, const std::function<void()>& body) {
    if (blockDim == 0) Fail("Launch: blockDim must be >= 1");
    Stats() = LaunchStats{};
    for (uint32_t i = 0; i < blockDim; ++i) {
        Core core;
        core.blockIdx = i;
        core.blockNum = blockDim;
        core.ubCapacity = ubBytes;
        core.ub.assign(ubBytes, 0xff);  // NaN bytes: reading UB nobody wrote poisons the result
        CurrentCore() = &core;
        try {
            body();
            CheckBlockEnd(core);
        } catch (...) {
            CurrentCore() = nullptr;
            throw;
        }
        CurrentCore() = nullptr;
        Stats().blocksRun += 1;
    }
}

}  // namespace ascendc_host_sim

#endif  // ASCENDC_HOST_SIM_KERNEL_OPERATOR_H
