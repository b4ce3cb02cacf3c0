"""v14 A/B variants of ops/split_qkv_rmsnorm_rope.py (written as build/ab14/v1.py, v2.py):
v1: in the halves head block, with POS_PTRS, the positions are loaded and the cos/sin rows gathered
    right after the block's own loads, before the reduction (landed: after the reduction);
v2: v1, and mRoPE's halves plans take POS_PTRS too (three positions loaded at the gather)."""
import pathlib
src = pathlib.Path("ops/split_qkv_rmsnorm_rope.py").read_text()

def sub(text, old, new, count=1):
    assert text.count(old) == count, (old, text.count(old))
    return text.replace(old, new)

v1 = sub(src, """        if NORM and NORM_SUMS:
            sum_sq = tl.load(sums_ptr + tok64 * 2, mask=tok_ok, other=0.0).to(tl.float32)
        elif NORM:
            sum_sq = tl.sum(a * a, axis=2) + tl.sum(b * b, axis=2)""", """        if ROWS_AFTER_DATA and POS_PTRS:
            cos, sin = _cos_sin(cache_ptr, rows, rows_h, rows_w, i, i_ok, tok_ok, max_position, cache_stride,
                                HALF, MROPE, SEC_T, SEC_H, SEC_W, INTERLEAVED, POS_PTRS)
        if NORM and NORM_SUMS:
            sum_sq = tl.load(sums_ptr + tok64 * 2, mask=tok_ok, other=0.0).to(tl.float32)
        elif NORM:
            sum_sq = tl.sum(a * a, axis=2) + tl.sum(b * b, axis=2)""")
v1 = sub(v1, """        if ROWS_AFTER_DATA:
            # The cos/sin rows only now""", """        if ROWS_AFTER_DATA and not POS_PTRS:
            # The cos/sin rows only now""")
pathlib.Path("build/ab14/v1.py").write_text(v1)

v2 = sub(v1, "POS_PTRS: tl.constexpr = (ROWS_AFTER_DATA or WHOLE_ROW) and not (POS_AHEAD or MROPE)",
         "POS_PTRS: tl.constexpr = (ROWS_AFTER_DATA and not (WHOLE_ROW or POS_AHEAD)) or (WHOLE_ROW and not "
         "(POS_AHEAD or MROPE))")
v2 = sub(v2, """    if POS_PTRS:
        rows = _cache_row(tl.load(rows, mask=tok_ok, other=0), max_position, cache_stride)
""", """    if POS_PTRS:
        if MROPE:
            rows_h = _cache_row(tl.load(rows_h, mask=tok_ok, other=0), max_position, cache_stride)
            rows_w = _cache_row(tl.load(rows_w, mask=tok_ok, other=0), max_position, cache_stride)
        rows = _cache_row(tl.load(rows, mask=tok_ok, other=0), max_position, cache_stride)
""")
v2 = sub(v2, """            if MROPE:
                rows_h = _cache_row(pos_h, max_position, cache_stride)
                rows_w = _cache_row(pos_w, max_position, cache_stride)""", """            if MROPE and POS_PTRS:
                rows_h = rows + pos_axis_stride
                rows_w = rows + 2 * pos_axis_stride
            elif MROPE:
                rows_h = _cache_row(pos_h, max_position, cache_stride)
                rows_w = _cache_row(pos_w, max_position, cache_stride)""")
pathlib.Path("build/ab14/v2.py").write_text(v2)
