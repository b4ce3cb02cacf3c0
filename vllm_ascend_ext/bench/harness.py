"""The benchmark's one run loop (:func:`measure`), the rows it returns, the argument checks and the
check against the float64 reference, for every op family (prologue, KV-cache write, MLA, TP ranks).

A family's run gives :func:`measure` its layers, its token counts and a function making one
:class:`Case` of a (layer, token count): the inputs made once, each provider as a :class:`Timed`
(the callables timed, the fastest counting, and the check against the reference), and how a
provider's row is made. :func:`measure` then, per provider, reports progress, runs the check and
makes the row (which times the provider), and drops the case's tensors before the next one.

The rows (:class:`Row`, :class:`KVRow`, :class:`TPRow`) are what the CSV and JSON files hold,
field by field (``report.write_outputs``).
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from .catalog import AMORTISED_CALLS, CHECKED_PROVIDERS, CPU_AMORTISED_CALLS, CPU_TOKENS, GPU_TOKENS

__all__ = ["TOLERANCE", "Case", "KVRow", "Row", "TPRow", "Timed", "check_rows", "checked_calls",
           "checked_providers", "checked_tokens", "max_rel_err", "measure", "run_meta", "triton_version"]

TOLERANCE = {torch.bfloat16: 2.0**-6, torch.float16: 2.0**-9, torch.float32: 1e-5}


@dataclass
class Row:
    """One (geometry, token count, provider) measurement of the prologue run."""

    model: str
    tp: int
    geometry: str
    tokens: int
    provider: str
    us: float
    max_rel_err: float
    bytes: int
    floor_us: float
    launch_us: float
    copy_us: float  # the same bytes moved by a plain copy kernel, timed the same way

    @property
    def gbps(self) -> float:
        return self.bytes / self.us / 1e3 if self.us > 0 else float("nan")


@dataclass
class KVRow:
    """One (geometry, token count, provider) measurement timed both ways: the KV-cache run's and the
    MLA run's."""

    model: str
    tp: int
    geometry: str
    tokens: int
    provider: str
    us: float  # one call per captured graph
    us_amortised: float  # ``calls`` calls captured in one graph, per call
    calls: int
    max_rel_err: float  # NaN for a copy (nothing to check)
    bytes: int  # the fused op's fewest bytes, the same for every provider of a (geometry, T)

    @property
    def gbps(self) -> float:
        return self.bytes / self.us / 1e3 if self.us > 0 else float("nan")

    @property
    def gbps_amortised(self) -> float:
        return self.bytes / self.us_amortised / 1e3 if self.us_amortised > 0 else float("nan")


@dataclass
class TPRow:
    """One (geometry, token count, rank, provider) measurement of the multi-rank run."""

    model: str
    tp: int
    rank: int
    geometry: str  # the rank's local geometry
    tokens: int
    provider: str
    us: float
    max_rel_err: float  # NaN for copy+allreduce (nothing to check)
    bytes: int  # the op's fewest bytes on this rank (bytes_moved of the local geometry)
    timing: str  # "graph" (CUDA graph replays), "events" (eager calls: capture failed), "wall" (CPU)

    @property
    def gbps(self) -> float:
        return self.bytes / self.us / 1e3 if self.us > 0 else float("nan")


@dataclass
class Timed:
    """One provider of one case.

    Attributes
    ----------
    fns : sequence of callable
        Zero-argument callables, each timed; the fastest counts (none: the timing is NaN).
    check : callable, optional
        Runs the provider once and returns its largest error against the reference; ``None``:
        nothing to check (the error is NaN).
    """

    fns: Sequence[Callable[[], object]]
    check: Callable[[], float] | None = None

    def best(self, timer: Callable[..., float], calls: int = 1) -> float:
        """The fastest of ``timer(fn, calls)`` over :attr:`fns` (NaN when there is none)."""
        return min((timer(fn, calls) for fn in self.fns), default=float("nan"))


@dataclass
class Case:
    """One (layer, token count) of a run.

    Attributes
    ----------
    label : str
        ``"<model> tp<N> T=<count>"``: what progress reports, before the provider's name.
    providers : dict of str to Timed
        The providers of the run, in its order.
    row : callable
        ``row(provider, timed, err)``: times ``timed`` and returns the provider's row.
    """

    label: str
    providers: dict
    row: Callable[[str, Timed, float], object]


def measure(geometries, tokens, make_case: Callable[[object, int], Case],
            progress: Callable[[str], None] | None = None, done: Callable[[object], None] | None = None) -> list:
    """Check and time every (layer, token count, provider): the run loop of every op family.

    Parameters
    ----------
    geometries : sequence
        The run's layers, each handed to ``make_case`` as it is.
    tokens : sequence of int
        Token counts.
    make_case : callable
        ``make_case(geometry, count)`` -> :class:`Case`.
    progress : callable, optional
        Called with ``"<case label> <provider>"`` before each provider's check and timings.
    done : callable, optional
        Called with each row once it is measured.

    Returns
    -------
    list
        The rows, per layer, token count and provider in that order.
    """
    rows = []
    for geometry in geometries:
        for count in tokens:
            case = make_case(geometry, count)
            for provider, timed in case.providers.items():
                if progress:
                    progress(f"{case.label} {provider}")
                err = timed.check() if timed.check is not None else float("nan")
                rows.append(case.row(provider, timed, err))
                if done:
                    done(rows[-1])
            del case  # its tensors go before the next case's are made
    return rows


def checked_tokens(tokens, is_cpu: bool, cpu_tokens: tuple[int, ...] = CPU_TOKENS) -> tuple[int, ...]:
    """``tokens``, else ``cpu_tokens`` on CPU and ``GPU_TOKENS`` elsewhere; ``ValueError`` naming
    ``tokens`` unless each is a positive int."""
    tokens = tuple(tokens or (cpu_tokens if is_cpu else GPU_TOKENS))
    if any(isinstance(t, bool) or not isinstance(t, int) or t < 1 for t in tokens):
        raise ValueError(f"tokens must be positive ints, got {tokens!r}")
    return tokens


def checked_providers(providers, known: tuple[str, ...]) -> tuple[str, ...]:
    """``providers`` (default all of ``known``); ``ValueError`` naming ``providers`` unless it is a
    non-empty subset of ``known``."""
    providers = tuple(known if providers is None else providers)
    if not providers or any(p not in known for p in providers):
        raise ValueError(f"providers must be a non-empty subset of {known}, got {providers!r}")
    return providers


def checked_calls(calls, is_cpu: bool) -> int:
    """Calls per amortised timing: ``calls``, else ``CPU_AMORTISED_CALLS`` on CPU and
    ``AMORTISED_CALLS`` elsewhere; ``ValueError`` naming ``calls`` unless a positive int."""
    calls = calls if calls is not None else (CPU_AMORTISED_CALLS if is_cpu else AMORTISED_CALLS)
    if isinstance(calls, bool) or not isinstance(calls, int) or calls < 1:
        raise ValueError(f"calls must be a positive int, got {calls!r}")
    return calls


def max_rel_err(outputs, reference) -> float:
    """The largest ``|out - ref|`` over each pair, relative to the reference's largest magnitude."""
    err = 0.0
    for out, ref in zip(outputs, reference):
        scale = ref.abs().max().item() or 1.0
        err = max(err, (out.double() - ref).abs().max().item() / scale)
    return err


def check_rows(rows) -> list[str]:
    """The rows of our ops (``CHECKED_PROVIDERS``) further from the float64 reference than bf16 allows.

    Parameters
    ----------
    rows : list of Row, KVRow or TPRow
        A run's rows.

    Returns
    -------
    list of str
        One line per failing row (empty when every check passed).
    """
    limit = TOLERANCE[torch.bfloat16]
    return [f"{r.model} tp{r.tp} T={r.tokens}{f' rank {r.rank}' if isinstance(r, TPRow) else ''} {r.provider}: "
            f"rel err {r.max_rel_err:.2e} > {limit:.1e}"
            for r in rows if r.provider in CHECKED_PROVIDERS and not r.max_rel_err <= limit]


def triton_version() -> str:
    """The installed Triton's version, or ``"absent"``."""
    try:
        import triton

        return triton.__version__
    except ImportError:
        return "absent"


def run_meta(device: torch.device, op: str) -> dict:
    """What every run's ``meta`` starts with: the op, the device (a GPU's name), the versions and
    whether the Triton interpreter ran."""
    from ..ops import settings

    return {"op": op, "device": torch.cuda.get_device_name(device) if device.type == "cuda" else str(device),
            "torch": torch.__version__, "triton": triton_version(), "python": platform.python_version(),
            "interpreter": settings.triton_interpret()}
