"""v15 A/B 2 variants: the landed kernel with programmatic dependent launch (PDL) on CUDA. p1: the
kernel waits for the previous grid (griddepcontrol.wait) before touching memory and lets the next
one launch at once (launch_dependents); p2: the wait only (the next grid launches as ours exits)."""
import pathlib
src = pathlib.Path("ops/split_qkv_rmsnorm_rope.py").read_text()
out = pathlib.Path(__file__).parent
AT = "    num_tiles = tl.cdiv(num_tokens, BLOCK_T) * HEAD_BLOCKS\n"
LAUNCH = "        **plan.launch_options,\n"
assert src.count(AT) == 1 and src.count(LAUNCH) == 1
pdl = src.replace(LAUNCH, LAUNCH + "        launch_pdl=True,\n")
(out / "p1.py").write_text(pdl.replace(AT, "    tl.extra.cuda.gdc_wait()\n    tl.extra.cuda.gdc_launch_dependents()\n" + AT))
(out / "p2.py").write_text(pdl.replace(AT, "    tl.extra.cuda.gdc_wait()\n" + AT))
