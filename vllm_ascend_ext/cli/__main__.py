"""``python -m vllm_ascend_ext.cli``: the same as the ``vllm-ascend-ext`` console script."""

from .main import main

raise SystemExit(main())
