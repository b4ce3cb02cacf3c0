"""The test tiers: which cases of a grid the default tier runs, and which only the full tier.

The default tier (``pytest``; ``scripts/run_tests.sh``) deselects every case marked ``full``
(``tests/conftest.py``); the full tier (``pytest --full``; ``SUITES=full scripts/run_tests.sh``)
runs them too. A grid of cases x variants (launch plans, dtypes, flags) is *rotated* in the
default tier: each case runs under one variant and each variant under at least one case, so
every variant still runs in every default run; the whole cross product runs in the full tier.
A helper module: ``import tiers``.
"""

from __future__ import annotations

import itertools

import pytest

#: The mark of a case that only the full tier runs.
full = pytest.mark.full

_PARAM = type(pytest.param(None))


def _name(value) -> str:
    """A test id for a plain value: a geometry's label, a tuple's items joined by ``-``, else ``str``."""
    if isinstance(value, tuple):
        return "-".join(map(_name, value))
    return getattr(value, "label", None) or str(value)


def _params(values) -> list:
    return [v if isinstance(v, _PARAM) else pytest.param(v, id=_name(v)) for v in values]


def rotated(cases, variants) -> list:
    """The cross product ``cases x variants`` as ``pytest.param`` s of ``(*case, *variant)``, all
    but a rotation marked :data:`full`.

    Each of ``cases`` and ``variants`` is a plain value (one parameter) or a ``pytest.param`` (one
    or more parameters, its id and marks). The default tier keeps pair ``i`` =
    ``(cases[i % C], variants[i % V])`` for ``i < max(C, V)``: every case and every variant at
    least once. Ids are ``<case id>-<variant id>``, as stacked ``parametrize`` s give.
    """
    cases, variants = _params(cases), _params(variants)
    kept = {(i % len(cases), i % len(variants)) for i in range(max(len(cases), len(variants)))}
    params = []
    for (ci, case), (vi, variant) in itertools.product(enumerate(cases), enumerate(variants)):
        marks = list(case.marks) + list(variant.marks) + ([] if (ci, vi) in kept else [full])
        params.append(pytest.param(*case.values, *variant.values, id=f"{case.id}-{variant.id}", marks=marks))
    return params
