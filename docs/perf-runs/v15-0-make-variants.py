"""v15 A/B 0 variants of the kernel file (with v15-0-head-major.patch applied): hm (head-major large tiles, no
fold), hf (head-major + fold)."""
import pathlib
src = pathlib.Path("ops/split_qkv_rmsnorm_rope.py").read_text()
out = pathlib.Path("build/ab15")
HM_OLD = "HEAD_MAJOR=plan.head_major,"
HM_NEW = "HEAD_MAJOR=plan.block_tokens > 1 and not plan.whole_row,"
FOLD_OLD = "FOLD: tl.constexpr = HEAD_MAJOR and NORM"
assert src.count(HM_OLD) == 1 and src.count(FOLD_OLD) == 1
(out / "hf.py").write_text(src.replace(HM_OLD, HM_NEW))
(out / "hm.py").write_text(src.replace(HM_OLD, HM_NEW).replace(FOLD_OLD, "FOLD: tl.constexpr = False and NORM"))
