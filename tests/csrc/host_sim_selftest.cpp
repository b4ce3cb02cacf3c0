// Tests of the host layer itself: tiny kernels that each break one hardware rule (and controls
// that keep it), so that a kernel passing the host layer means something.
#include <cstring>
#include <map>
#include <string>

#include "kernel_operator.h"

using namespace AscendC;

namespace {

constexpr uint32_t kUb = 1024;  // bytes of UB per simulated core in these tests
half g_gmIn[64];
half g_gmOut[64];
float g_gmF[64];

void CopyInOut()  // control: the canonical queue round trip
{
    TPipe pipe;
    TQue<QuePosition::VECIN, 1> in;
    pipe.InitBuffer(in, 2, 64);
    GlobalTensor<half> gm;
    gm.SetGlobalBuffer(g_gmIn, 64);
    for (int i = 0; i < 3; ++i) {
        LocalTensor<half> t = in.AllocTensor<half>();
        DataCopy(t, gm, 32);
        in.EnQue(t);
        LocalTensor<half> u = in.DeQue<half>();
        in.FreeTensor(u);
    }
}

const std::map<std::string, void (*)()>& Scenarios()
{
    static const std::map<std::string, void (*)()> s = {
        {"ub_fits", [] { TPipe p; TBuf<TPosition::VECCALC> b; p.InitBuffer(b, kUb); }},
        {"ub_overflow", [] { TPipe p; TBuf<TPosition::VECCALC> a, b; p.InitBuffer(a, kUb - 64); p.InitBuffer(b, 96); }},
        {"datacopy_aligned", [] {
             TPipe p; TQue<QuePosition::VECIN, 1> q; p.InitBuffer(q, 1, 64);
             GlobalTensor<half> gm; gm.SetGlobalBuffer(g_gmIn, 64);
             LocalTensor<half> t = q.AllocTensor<half>(); DataCopy(t, gm, 16); q.EnQue(t); q.FreeTensor(q.DeQue<half>());
         }},
        {"datacopy_unaligned_length", [] {
             TPipe p; TQue<QuePosition::VECIN, 1> q; p.InitBuffer(q, 1, 64);
             GlobalTensor<half> gm; gm.SetGlobalBuffer(g_gmIn, 64);
             LocalTensor<half> t = q.AllocTensor<half>(); DataCopy(t, gm, 15); q.EnQue(t); q.FreeTensor(q.DeQue<half>());
         }},
        {"datacopypad_unaligned_length", [] {
             TPipe p; TQue<QuePosition::VECIN, 1> q; p.InitBuffer(q, 1, 64);
             GlobalTensor<half> gm; gm.SetGlobalBuffer(g_gmIn, 64);
             LocalTensor<half> t = q.AllocTensor<half>();
             DataCopyPad(t, gm, DataCopyExtParams{1, 30, 0, 0, 0}, DataCopyPadExtParams<half>{false, 0, 0, half{0}});
             q.EnQue(t); q.FreeTensor(q.DeQue<half>());
         }},
        {"datacopy_unaligned_ub_address", [] {
             TPipe p; TQue<QuePosition::VECIN, 1> q; p.InitBuffer(q, 1, 128);
             GlobalTensor<half> gm; gm.SetGlobalBuffer(g_gmIn, 64);
             LocalTensor<half> t = q.AllocTensor<half>(); DataCopy(t[8], gm, 16); q.EnQue(t); q.FreeTensor(q.DeQue<half>());
         }},
        {"vector_unaligned_ub_address", [] {
             TPipe p; TBuf<TPosition::VECCALC> b; p.InitBuffer(b, 256);
             LocalTensor<float> t = b.Get<float>(); Duplicate(t[3], 1.0f, 8);
         }},
        {"queue_ok", CopyInOut},
        {"deque_empty", [] {
             TPipe p; TQue<QuePosition::VECIN, 1> q; p.InitBuffer(q, 2, 64); q.FreeTensor(q.DeQue<half>());
         }},
        {"enque_beyond_depth", [] {
             TPipe p; TQue<QuePosition::VECIN, 1> q; p.InitBuffer(q, 2, 64);
             LocalTensor<half> a = q.AllocTensor<half>(); LocalTensor<half> b = q.AllocTensor<half>();
             q.EnQue(a); q.EnQue(b);
         }},
        {"alloc_exhausted", [] {
             TPipe p; TQue<QuePosition::VECIN, 1> q; p.InitBuffer(q, 2, 64);
             q.AllocTensor<half>(); q.AllocTensor<half>(); q.AllocTensor<half>();
         }},
        {"leaked_buffer", [] {
             TPipe p; TQue<QuePosition::VECIN, 1> q; p.InitBuffer(q, 2, 64); q.AllocTensor<half>();
         }},
        {"left_in_queue", [] {
             TPipe p; TQue<QuePosition::VECIN, 1> q; p.InitBuffer(q, 2, 64); q.EnQue(q.AllocTensor<half>());
         }},
        {"double_free", [] {
             TPipe p; TQue<QuePosition::VECIN, 1> q; p.InitBuffer(q, 2, 64);
             LocalTensor<half> a = q.AllocTensor<half>(); q.FreeTensor(a); q.FreeTensor(a);
         }},
        {"use_while_queued", [] {
             TPipe p; TQue<QuePosition::VECOUT, 1> q; p.InitBuffer(q, 1, 64);
             LocalTensor<float> a = q.AllocTensor<float>(); q.EnQue(a); Duplicate(a, 1.0f, 8); q.FreeTensor(q.DeQue<float>());
         }},
        {"vector_reads_copy_in_without_deque", [] {
             TPipe p; TQue<QuePosition::VECIN, 1> q; TBuf<TPosition::VECCALC> b; p.InitBuffer(q, 1, 64); p.InitBuffer(b, 64);
             GlobalTensor<float> gm; gm.SetGlobalBuffer(g_gmF, 64);
             LocalTensor<float> a = q.AllocTensor<float>(); DataCopy(a, gm, 8);
             Adds(b.Get<float>(), a, 1.0f, 8); q.FreeTensor(a);
         }},
        {"missing_pipe_barrier", [] {
             TPipe p; TBuf<TPosition::VECCALC> b; p.InitBuffer(b, 256);
             LocalTensor<float> t = b.Get<float>(); Duplicate(t, 1.0f, 8); Adds(t[8], t, 1.0f, 8);
         }},
        {"with_pipe_barrier", [] {
             TPipe p; TBuf<TPosition::VECCALC> b; p.InitBuffer(b, 256);
             LocalTensor<float> t = b.Get<float>(); Duplicate(t, 1.0f, 8); PipeBarrier<PIPE_V>(); Adds(t[8], t, 1.0f, 8);
         }},
        {"missing_v_s_flag", [] {
             TPipe p; TBuf<TPosition::VECCALC> b; p.InitBuffer(b, 256);
             LocalTensor<float> t = b.Get<float>(); Duplicate(t, 1.0f, 8); (void)t.GetValue(0);
         }},
        {"with_v_s_flag", [] {
             TPipe p; TBuf<TPosition::VECCALC> b; p.InitBuffer(b, 256);
             LocalTensor<float> t = b.Get<float>(); Duplicate(t, 1.0f, 8);
             SetFlag<HardEvent::V_S>(EVENT_ID0); WaitFlag<HardEvent::V_S>(EVENT_ID0); (void)t.GetValue(0);
         }},
        {"missing_s_v_flag", [] {
             TPipe p; TBuf<TPosition::VECCALC> b; p.InitBuffer(b, 256);
             LocalTensor<float> t = b.Get<float>(); t.SetValue(0, 2.0f); Adds(t[8], t, 1.0f, 8);
         }},
        {"wait_without_set", [] { TPipe p; WaitFlag<HardEvent::V_S>(EVENT_ID1); }},
        {"copy_out_without_sync", [] {
             TPipe p; TBuf<TPosition::VECCALC> b; p.InitBuffer(b, 64);
             GlobalTensor<float> gm; gm.SetGlobalBuffer(g_gmF, 64);
             LocalTensor<float> t = b.Get<float>(); Duplicate(t, 1.0f, 8); DataCopy(gm, t, 8);
         }},
        {"gm_past_declared_size", [] {
             GlobalTensor<half> gm; gm.SetGlobalBuffer(g_gmIn, 16); (void)gm.GetValue(16);
         }},
        {"gm_write_read_only", [] {
             GlobalTensor<half> gm; gm.SetGlobalBuffer(g_gmIn, 64); gm.SetValue(0, half{0});
         }},
        {"cast_half_int8_nan", [] {  // a NaN source of half -> int8_t is not modelled: it must fail
             TPipe p; TBuf<TPosition::VECCALC> f, h, q; p.InitBuffer(f, 64); p.InitBuffer(h, 32); p.InitBuffer(q, 32);
             LocalTensor<float> t = f.Get<float>(); Duplicate(t, std::nanf(""), 16); PipeBarrier<PIPE_V>();
             Cast(h.Get<half>(), t, RoundMode::CAST_RINT, 16); PipeBarrier<PIPE_V>();
             Cast(q.Get<int8_t>(), h.Get<half>(), RoundMode::CAST_RINT, 16);
         }},
    };
    return s;
}

}  // namespace

extern "C" {

// Runs scenario `name` on 2 simulated cores; 0 if the host layer accepted it, -1 with its message.
int selftest_run(const char* name, char* err, int errLen)
{
    auto it = Scenarios().find(name);
    if (it == Scenarios().end()) {
        std::strncpy(err, "unknown scenario", errLen - 1);
        return -2;
    }
    ascendc_host_sim::ResetGm();
    ascendc_host_sim::RegisterGm(g_gmIn, sizeof(g_gmIn), false, "in");
    ascendc_host_sim::RegisterGm(g_gmOut, sizeof(g_gmOut), true, "out");
    ascendc_host_sim::RegisterGm(g_gmF, sizeof(g_gmF), true, "f");
    try {
        ascendc_host_sim::Launch(2, kUb, it->second);
    } catch (const std::exception& e) {
        std::strncpy(err, e.what(), errLen - 1);
        err[errLen - 1] = '\0';
        return -1;
    }
    return 0;
}

// The int8 store chain of the KV-cache write on n <= 64 floats: Maxs(lo), Mins(hi) when clamp,
// then Cast float -> half (CAST_RINT) and half -> int8_t (`mode`, a RoundMode), read back by the
// scalar unit. Returns 0, or -1 with the host layer's message in err.
int selftest_int8_chain(const float* in, int n, int clamp, float lo, float hi, int mode, int8_t* out, char* err,
                        int errLen)
{
    ascendc_host_sim::ResetGm();
    try {
        ascendc_host_sim::Launch(1, kUb, [&] {
            TPipe p;
            TBuf<TPosition::VECCALC> f, h, q;
            p.InitBuffer(f, 64 * sizeof(float));
            p.InitBuffer(h, 64 * sizeof(half));
            p.InitBuffer(q, 64);
            LocalTensor<float> t = f.Get<float>();
            for (int i = 0; i < n; ++i) t.SetValue(i, in[i]);
            SetFlag<HardEvent::S_V>(EVENT_ID0);
            WaitFlag<HardEvent::S_V>(EVENT_ID0);
            if (clamp) {
                Maxs(t, t, lo, n);
                PipeBarrier<PIPE_V>();
                Mins(t, t, hi, n);
                PipeBarrier<PIPE_V>();
            }
            Cast(h.Get<half>(), t, RoundMode::CAST_RINT, n);
            PipeBarrier<PIPE_V>();
            LocalTensor<int8_t> r = q.Get<int8_t>();
            Cast(r, h.Get<half>(), static_cast<RoundMode>(mode), n);
            SetFlag<HardEvent::V_S>(EVENT_ID0);
            WaitFlag<HardEvent::V_S>(EVENT_ID0);
            for (int i = 0; i < n; ++i) out[i] = r.GetValue(i);
        });
    } catch (const std::exception& e) {
        std::strncpy(err, e.what(), errLen - 1);
        err[errLen - 1] = '\0';
        return -1;
    }
    return 0;
}

// Each block writes its GetBlockIdx() and GetBlockNum() into out[2*idx], out[2*idx+1].
int selftest_blocks(int32_t* out, uint32_t blockDim)
{
    ascendc_host_sim::ResetGm();
    ascendc_host_sim::RegisterGm(out, 2 * blockDim * sizeof(int32_t), true, "out");
    try {
        ascendc_host_sim::Launch(blockDim, kUb, [&] {
            GlobalTensor<int32_t> gm;
            gm.SetGlobalBuffer(out, 2 * blockDim);
            gm.SetValue(2 * GetBlockIdx(), static_cast<int32_t>(GetBlockIdx()));
            gm.SetValue(2 * GetBlockIdx() + 1, static_cast<int32_t>(GetBlockNum()));
        });
    } catch (const std::exception&) {
        return -1;
    }
    return static_cast<int>(ascendc_host_sim::Stats().blocksRun);
}

}  // extern "C"
