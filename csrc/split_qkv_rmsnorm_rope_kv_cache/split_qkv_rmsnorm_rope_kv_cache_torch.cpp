// torch binding of split_qkv_rmsnorm_rope_kv_cache's AscendC kernel (built only with CANN and
// torch_npu; see csrc/CMakeLists.txt).
//
// Defines vllm_ascend_ext::_split_qkv_rmsnorm_rope_kv_cache_ascendc_launch, the low-level launch
// that the Python PrivateUse1 implementation (vllm_ascend_ext/kernels/ascendc.py) calls with the
// outputs it allocated, the caches it validated and the tiling struct it computed, packed as uint32
// words.
// Nothing here decides a tile size or a layout.
#include <cstring>
#include <vector>

#include <ATen/ATen.h>
#include <torch/library.h>

#include "torch_npu/csrc/core/npu/NPUStream.h"
#include "torch_npu/csrc/framework/OpCommand.h"

#include "split_qkv_rmsnorm_rope_tiling.h"

extern "C" int split_qkv_rmsnorm_rope_kv_cache_launch(void* stream, uint32_t blockDim, uint8_t* qkv, uint8_t* qOut,
                                                      uint8_t* kOut, uint8_t* vOut, uint8_t* gateOut, uint8_t* cache,
                                                      uint8_t* positions, uint8_t* qWeight, uint8_t* kWeight,
                                                      uint8_t* qBias, uint8_t* kBias, uint8_t* keyCache,
                                                      uint8_t* valueCache, uint8_t* slotMapping, uint8_t* kScale,
                                                      uint8_t* vScale, SplitQkvRmsnormRopeTiling tiling);

namespace {

uint8_t* Ptr(const at::Tensor& t) { return static_cast<uint8_t*>(t.data_ptr()); }
uint8_t* Ptr(const c10::optional<at::Tensor>& t) { return t.has_value() ? Ptr(*t) : nullptr; }

// kOut: None unless SQRR_FLAG_KV_OUT; vOut: None unless that and SQRR_FLAG_V_NORM; gateOut: None
// unless SQRR_FLAG_Q_GATE; kScale / vScale: None unless SQRR_FLAG_KV_INT8.
void Launch(const at::Tensor& qkv, at::Tensor& qOut, const c10::optional<at::Tensor>& kOut,
            const c10::optional<at::Tensor>& vOut, const c10::optional<at::Tensor>& gateOut, const at::Tensor& cache,
            const at::Tensor& positions, const c10::optional<at::Tensor>& qWeight,
            const c10::optional<at::Tensor>& kWeight, const c10::optional<at::Tensor>& qBias,
            const c10::optional<at::Tensor>& kBias, at::Tensor& keyCache, at::Tensor& valueCache,
            const at::Tensor& slotMapping, const c10::optional<at::Tensor>& kScale,
            const c10::optional<at::Tensor>& vScale, int64_t blockDim, at::IntArrayRef words)
{
    TORCH_CHECK(words.size() * sizeof(uint32_t) == sizeof(SplitQkvRmsnormRopeTiling),
                "tiling has ", words.size(), " words; the kernel's struct needs ",
                sizeof(SplitQkvRmsnormRopeTiling) / sizeof(uint32_t));
    TORCH_CHECK(blockDim >= 1 && blockDim <= 65535, "block_dim out of range: ", blockDim);
    std::vector<uint32_t> raw(words.begin(), words.end());
    SplitQkvRmsnormRopeTiling tiling;
    std::memcpy(&tiling, raw.data(), sizeof(tiling));
    uint8_t *a = Ptr(qkv), *qo = Ptr(qOut), *ko = Ptr(kOut), *vo = Ptr(vOut), *go = Ptr(gateOut);
    uint8_t *c = Ptr(cache), *p = Ptr(positions);
    uint8_t *qw = Ptr(qWeight), *kw = Ptr(kWeight), *qb = Ptr(qBias), *kb = Ptr(kBias);
    uint8_t *kc = Ptr(keyCache), *vc = Ptr(valueCache), *sm = Ptr(slotMapping), *ks = Ptr(kScale), *vs = Ptr(vScale);
    const uint32_t dim = static_cast<uint32_t>(blockDim);
    // Through torch_npu's task queue, so the launch stays ordered with the other ops of the stream.
    at_npu::native::OpCommand cmd;
    cmd.Name("split_qkv_rmsnorm_rope_kv_cache_ascendc");
    cmd.SetCustomHandler([=]() -> int {
        void* stream = c10_npu::getCurrentNPUStream().stream(false);
        return split_qkv_rmsnorm_rope_kv_cache_launch(stream, dim, a, qo, ko, vo, go, c, p, qw, kw, qb, kb, kc, vc, sm,
                                                      ks, vs, tiling);
    });
    cmd.Run();
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(vllm_ascend_ext, m)
{
    m.def("_split_qkv_rmsnorm_rope_kv_cache_ascendc_launch(Tensor qkv, Tensor(a!) q_out, Tensor(b!)? k_out, "
          "Tensor(c!)? v_out, Tensor(d!)? gate_out, Tensor cos_sin_cache, Tensor positions, Tensor? q_weight, "
          "Tensor? k_weight, Tensor? q_bias, Tensor? k_bias, Tensor(e!) key_cache, Tensor(f!) value_cache, "
          "Tensor slot_mapping, Tensor? k_scale, Tensor? v_scale, int block_dim, int[] tiling) -> ()");
}

TORCH_LIBRARY_IMPL(vllm_ascend_ext, PrivateUse1, m)
{
    m.impl("_split_qkv_rmsnorm_rope_kv_cache_ascendc_launch", &Launch);
}
