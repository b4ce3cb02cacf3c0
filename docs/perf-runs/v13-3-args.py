import triton
import triton.language as tl

@triton.jit
def few(p0, p1, p2, p3):
    if tl.program_id(0) < 0:
        tl.store(p0, tl.load(p1))

ARGS = ", ".join([f"p{i}" for i in range(16)] + [f"s{i}" for i in range(36)])


@triton.jit
def many(p0, p1, p2, p3, p4, p5, p6, p7, p8, p9, p10, p11, p12, p13, p14, p15, s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15, s16, s17, s18, s19, s20, s21, s22, s23, s24, s25, s26, s27, s28, s29, s30, s31, s32, s33, s34, s35):
    if tl.program_id(0) < 0:
        tl.store(p0, tl.load(p1) + s0 + s1 + s2 + s3 + s4 + s5 + s6 + s7 + s8 + s9 + s10 + s11 + s12 + s13 + s14 + s15 + s16 + s17 + s18 + s19 + s20 + s21 + s22 + s23 + s24 + s25 + s26 + s27 + s28 + s29 + s30 + s31 + s32 + s33 + s34 + s35)
