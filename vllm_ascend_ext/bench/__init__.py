"""The benchmark: timing, providers per op, report and plot (``vllm-ascend-ext bench`` is its command,
:mod:`vllm_ascend_ext.cli.bench`; nothing here imports the command line).

Read in this order:

* :mod:`.catalog`: the ops, each one's providers, the default token counts and layers, fixed sizes;
* :mod:`.timing`: :class:`~.timing.Timer` (CUDA-graph replays on CUDA), the launch floor, the copy
  bandwidth, the same-bytes copy;
* :mod:`.harness`: the one run loop (:func:`~.harness.measure`) every op family runs through, the
  rows it returns (the CSV and JSON columns), the argument checks, the check against the reference;
* :mod:`.cases`: each family's inputs of one row and the fewest bytes it moves;
* one module per op family, its providers (the unfused peers), its run, its table and bar verdict:
  :mod:`.prologue` (``split_qkv_rmsnorm_rope`` vs eager and ``torch.compile``), :mod:`.kv_cache`
  (the KV-cache write vs the prologue and a separate scatter), :mod:`.mla` (the MLA prologue vs
  vLLM's kernel), :mod:`.tp` (the norm across TP ranks, one process a rank);
* :mod:`.host`: ``--host``, the host time per call of each op at T = 1;
* :mod:`.report`: the text a run prints, its CSV, JSON, text and PNG files.

Nothing is imported here: import the module you need.
"""
