"""v11, CPU (triton-ascend 3.2.0, Ascend910B3, ttir -> linalg): every ``ascend_lowering`` job with
the kernel's WHOLE_ROW forced on (the Ascend plans keep it off). Does the variant lower, and how do
its allocations compare with the UB model (which describes the plans as they are)?"""
import collections
from vllm_ascend_ext.ops import ascend_lowering as al
from vllm_ascend_ext.ops.tiling import ascend
from vllm_ascend_ext.ops.device import ascend_facts

plan_cls = type(ascend.plan(al._kernel(al.plan_jobs()[0][1], al.Variant(""), ascend_facts(None))[0], ascend_facts(None)))
plan_cls.whole_row = property(lambda self: True)
facts = ascend_facts(None)
jobs = al.plan_jobs()
seen, ok, bad = set(), 0, []
for label, geometry, variant in jobs:
    key = al._job_key(geometry, variant, facts)
    assert ("WHOLE_ROW", True) in key[1] or variant and variant.sums, key
    if key in seen:
        continue
    seen.add(key)
    try:
        row = al.lower_plan(geometry, variant, facts)
    except Exception as e:
        bad.append((label, variant, f"{type(e).__name__}: {str(e)[:200]}")); continue
    if row["problems"]:
        bad.append((label, variant, row["problems"]))
    else:
        ok += 1
print(f"lowered {ok}/{len(seen)} distinct kernels with WHOLE_ROW on and no problem")
kinds = collections.Counter()
for label, variant, why in bad:
    text = why if isinstance(why, str) else "; ".join(why)
    kind = ("exception" if isinstance(why, str) else
            "below the model's exact buffers" if all("out of date" in p for p in why) else "other")
    kinds[kind] += 1
    print(label, variant, text)
print(dict(kinds))
