"""``vllm-ascend-ext report PATH``: per-kernel time and bandwidth from a profile.

The profile files are read by :mod:`vllm_ascend_ext.cli.profile_readers` (msprof's
``op_summary_*.csv``, ``msprof op``'s ``OpBasicInfo.csv``, torch_npu's ``kernel_details.csv``,
our torch.profiler Chrome trace), each launch in a group.

Bytes per call come from the tensor shapes and dtypes the CSV lists (inputs + outputs: an
upper bound on traffic), else, for the fused kernel, from the known geometry
(:func:`vllm_ascend_ext.bench.cases.bytes_moved`, the benchmark's floor) given by a ``workload.json`` that
``profile`` writes next to each run, or by ``--model/--tp/--tokens/--dtype``.

Each kernel falls in a group: the provider named by the run's ``workload.json`` (``ours``,
``eager``, ``compile``), else ``fused`` / ``unfused`` / ``other`` by the ``--fused`` and
``--unfused`` patterns. Groups are shown side by side: time per prologue, kernels launched,
and the floor bandwidth (the bytes the fused op must move over that time).
"""

from __future__ import annotations

import json
import math
import re
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from .common import CliError, CliParser, output_dir
from .geometry import DTYPE_BYTES, resolve_model, shard_checked
from .profile_readers import FUSED_PATTERN, UNFUSED_PATTERN, Context, Record, find_profiles, load, sidecar_of

__all__ = ["KernelStats", "add_parser", "arguments", "format_report", "group_summary", "run", "summarize",
           "write_png"]

#: Vendor peak memory bandwidth (GB/s) by a device-name fragment; used when --peak-gbps is not
#: given. NVIDIA datasheets: H200 SXM 4.8 TB/s, H100 SXM 3.35 TB/s. No Ascend figure is listed
#: because none was checked here: pass --peak-gbps for an NPU.
PEAK_GBPS = {"H200": 4800.0, "H100": 3350.0}
#: Suffix of the group of a kernel launched fewer times than the run's prologues: set-up work
#: (input creation, caches), listed but left out of the side-by-side.
SETUP = "setup"


@dataclass
class KernelStats:
    """Launches of one kernel in one group, summed; ``nbytes`` is the mean over launches."""

    group: str
    name: str
    calls: int = 0
    total_us: float = 0.0
    nbytes: int | None = None
    bytes_from: str = ""
    _bytes_total: int = 0
    _bytes_calls: int = 0

    @property
    def mean_us(self) -> float:
        """Mean time per launch."""
        return self.total_us / self.calls if self.calls else 0.0

    @property
    def gbps(self) -> float | None:
        """Achieved bandwidth of a mean launch, GB/s (bytes per call / mean time)."""
        if self.nbytes is None or self.mean_us <= 0:
            return None
        return self.nbytes / self.mean_us / 1e3


def summarize(records: list[Record], ctx: Context) -> list[KernelStats]:
    """Launches summed per (group, kernel); bytes per call from shapes, else geometry."""
    stats: dict[tuple[str, str], KernelStats] = {}
    for record in records:
        entry = stats.setdefault((record.group, record.name), KernelStats(record.group, record.name))
        entry.calls += 1
        entry.total_us += record.duration_us
        if record.nbytes is not None:  # launches of one name may differ in shape (q's norm, k's)
            entry._bytes_total += record.nbytes
            entry._bytes_calls += 1
            entry.nbytes = round(entry._bytes_total / entry._bytes_calls)
            entry.bytes_from = "shapes"
    floor = ctx.floor_bytes
    for entry in stats.values():
        if entry.nbytes is None and floor is not None and ctx.fused.search(entry.name):
            entry.nbytes, entry.bytes_from = floor, "geometry"
        if ctx.iterations and entry.calls < ctx.iterations:
            entry.group = f"{entry.group}/{SETUP}"
    return sorted(stats.values(), key=lambda s: (s.group, -s.total_us))


def group_summary(stats: list[KernelStats], ctx: Context) -> list[dict]:
    """Per group: kernels, launches and time per prologue, and the floor bandwidth.

    Time per prologue is the group's total over the run's iterations when they are known,
    else the sum of its kernels' mean times (each kernel counted once per prologue).
    """
    groups: dict[str, list[KernelStats]] = {}
    for entry in stats:
        if not entry.group.endswith("/" + SETUP):
            groups.setdefault(entry.group, []).append(entry)
    rows = []
    for group, entries in groups.items():
        if ctx.iterations:
            per_iter = sum(e.total_us for e in entries) / ctx.iterations
            launches = sum(e.calls for e in entries) / ctx.iterations
        else:
            per_iter = sum(e.mean_us for e in entries)
            launches = float(len(entries))
        floor = ctx.floor_bytes
        gbps = floor / per_iter / 1e3 if floor is not None and per_iter > 0 else None
        rows.append({"group": group, "kernels": len(entries), "launches_per_prologue": launches,
                     "us_per_prologue": per_iter, "floor_gbps": gbps})
    fastest = min((r["us_per_prologue"] for r in rows if r["us_per_prologue"] > 0), default=None)
    for row in rows:
        row["vs_fastest"] = row["us_per_prologue"] / fastest if fastest else None
    order = {"ours": 0, "fused": 0, "compile": 1, "eager": 2, "unfused": 2, "other": 9}
    return sorted(rows, key=lambda r: (order.get(r["group"], 5), r["group"]))


def _fmt(value, spec: str, missing: str = "n/a") -> str:
    return missing if value is None else format(value, spec)


def format_report(stats: list[KernelStats], groups: list[dict], ctx: Context) -> str:
    """The per-kernel table and the side-by-side group table, as text."""
    name_width = min(max(len(s.name) for s in stats), 48)
    gw = max(8, *(len(s.group) for s in stats))
    lines = [f"{'group':<{gw}} {'kernel':<{name_width}} {'calls':>6} {'total us':>11} {'mean us':>9} "
             f"{'bytes/call':>11} {'GB/s':>8} {'% peak':>7}"]
    for s in stats:
        name = _short(s.name, name_width)
        gbps = s.gbps
        pct = 100 * gbps / ctx.peak_gbps if gbps is not None and ctx.peak_gbps else None
        bytes_text = _fmt(s.nbytes, "d") + ("*" if s.bytes_from == "geometry" else "")
        lines.append(f"{s.group:<{gw}} {name:<{name_width}} {s.calls:>6} {s.total_us:>11.1f} {s.mean_us:>9.2f} "
                     f"{bytes_text:>11} {_fmt(gbps, '.1f'):>8} {_fmt(pct, '.1f'):>7}")
    lines.append("")
    per = "per prologue" + ("" if ctx.iterations else " (sum of kernel means)")
    lines.append(f"{'group':<8} {'kernels':>7} {'launches':>9} {'us ' + per:>{len(per) + 3}} {'floor GB/s':>11} "
                 f"{'x fastest':>10}")
    for g in groups:
        lines.append(f"{g['group']:<8} {g['kernels']:>7} {g['launches_per_prologue']:>9.1f} "
                     f"{g['us_per_prologue']:>{len(per) + 3}.2f} {_fmt(g['floor_gbps'], '.1f'):>11} "
                     f"{_fmt(g['vs_fastest'], '.2f'):>10}")
    lines.append("")
    peak = f"{ctx.peak_gbps:g} GB/s ({ctx.peak_from})" if ctx.peak_gbps else "unknown (pass --peak-gbps)"
    lines.append(f"device peak: {peak}")
    lines.append("bytes/call: tensor bytes of the listed inputs + outputs (an upper bound on traffic); "
                 "* = the fused op's floor from the known geometry")
    if any(s.group.endswith("/" + SETUP) for s in stats):
        lines.append(f"*/{SETUP}: launched fewer times than the run's {ctx.iterations} prologues "
                     "(input creation): left out of the side-by-side")
    if ctx.floor_bytes is not None:
        lines.append(f"floor: {ctx.floor_bytes} B per prologue (read + write q and k, read one cos/sin row "
                     "per token); floor GB/s = floor / time per prologue")
    lines += [f"note: {note}" for note in ctx.notes]
    return "\n".join(lines)


def write_png(stats: list[KernelStats], groups: list[dict], ctx: Context, path: Path) -> None:
    """Two panels: time per prologue by group (stacked by kernel), and bandwidth.

    The right panel shows each group's floor bandwidth (the bytes the fused op must move over
    the group's time per prologue) when the geometry is known, else each kernel's achieved
    bandwidth where its bytes are known; the device peak is a dashed line when known.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = [g["group"] for g in groups]
    cmap = plt.get_cmap("tab20")
    for x, group in enumerate(groups):
        bottom = 0.0
        members = sorted((s for s in stats if s.group == group["group"]), key=lambda s: -s.total_us)
        for k, s in enumerate(members):
            share = s.total_us / ctx.iterations if ctx.iterations else s.mean_us
            left.bar(x, share, bottom=bottom, color=cmap(k % 20), edgecolor="white", linewidth=0.5)
            bottom += share
        left.annotate(f"{group['us_per_prologue']:.1f} us\n{group['launches_per_prologue']:.0f} launches",
                      (x, bottom), ha="center", va="bottom", fontsize=8)
    left.set_xticks(range(len(names)), names)
    left.set_ylabel("us per prologue (segments: kernels)")
    left.set_title("time per prologue")
    left.margins(y=0.15)
    if ctx.floor_bytes is not None:
        values = [g["floor_gbps"] or 0.0 for g in groups]
        right.barh(names, values, color=[cmap(2 * i % 20) for i in range(len(names))])
        for y, value in enumerate(values):
            right.annotate(f" {value:.0f}", (value, y), va="center", fontsize=8)
        right.set_xlabel(f"GB/s: {ctx.floor_bytes} B floor / time per prologue")
        right.set_title("floor bandwidth per prologue")
        right.invert_yaxis()
    else:
        with_bw = [s for s in stats if s.gbps is not None]
        if with_bw:
            right.barh([f"{s.group}: {_short(s.name, 32)}" for s in with_bw], [s.gbps for s in with_bw])
            right.set_xlabel("GB/s (tensor bytes per call / mean time)")
        else:
            right.text(0.5, 0.5, "no byte counts: pass --model and --tokens", ha="center", va="center")
            right.set_axis_off()
        right.set_title("achieved bandwidth per kernel")
    if ctx.peak_gbps and right.axison:
        right.axvline(ctx.peak_gbps, color="k", linestyle="--", label=f"peak {ctx.peak_gbps:g} GB/s")
        right.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _short(name: str, width: int) -> str:
    """``name`` cut to ``width`` characters in the middle (C++ kernel names differ at both ends)."""
    if len(name) <= width:
        return name
    head = (width - 1) * 2 // 3
    return name[:head] + "~" + name[len(name) - (width - 1 - head):]


def _context(args, first_sidecar: dict | None) -> Context:
    ctx = Context()
    try:
        ctx.fused = re.compile(args.fused)
        ctx.unfused = re.compile(args.unfused)
    except re.error as exc:
        raise CliError(f"--fused/--unfused is not a valid regular expression: {exc}") from None
    side = first_sidecar or {}
    model = args.model or side.get("model")
    tokens = args.tokens or side.get("tokens")
    if model:
        if not tokens:
            raise CliError("--model needs --tokens (the token count of the profiled run)")
        ctx.tokens = tokens
        ctx.elem_bytes = DTYPE_BYTES[args.dtype or side.get("dtype") or "bf16"]
        ctx.cache_bytes = DTYPE_BYTES[args.cache_dtype or side.get("cache_dtype") or "fp32"]
        tp = args.tp or side.get("tp") or 1
        ctx.geometry, _ = shard_checked(resolve_model(str(model)), tp, ctx.elem_bytes, ctx.cache_bytes)
    elif tokens:
        raise CliError("--tokens needs --model (the geometry the tokens are of)")
    elif args.tp:
        raise CliError("--tp needs --model and --tokens (the geometry of the run)")
    ctx.iterations = args.iterations or side.get("iterations")
    if args.peak_gbps:
        ctx.peak_gbps, ctx.peak_from = args.peak_gbps, "--peak-gbps"
    else:
        device = str(side.get("device", ""))
        for fragment, gbps in PEAK_GBPS.items():
            if fragment in device:
                ctx.peak_gbps, ctx.peak_from = gbps, f"vendor figure for {fragment}"
    return ctx


def _public(stats: KernelStats) -> dict:
    fields = {k: v for k, v in asdict(stats).items() if not k.startswith("_")}
    return fields | {"mean_us": stats.mean_us, "gbps": stats.gbps}


def add_parser(subparsers) -> None:
    """Declare ``report`` and its options."""
    parser = subparsers.add_parser("report", **_PARSER)
    _declare(parser)
    parser.set_defaults(run=run)


_PARSER = dict(
    help="per-kernel calls, time and bandwidth from msprof / torch_npu / torch.profiler output",
    description="Read msprof's op_summary_*.csv (or msprof op's OpBasicInfo.csv), torch_npu's "
                "kernel_details.csv, or our torch.profiler Chrome trace, and print per kernel: "
                "calls, total and mean time, bytes moved, achieved bandwidth against the device "
                "peak; then fused vs unfused side by side; plus a PNG.")


def _declare(parser) -> None:
    """``report``'s arguments (one declaration for the subcommand and for :func:`arguments`)."""
    parser.add_argument("path", help="a profile file, or a folder searched for them (e.g. a `profile` run)")
    parser.add_argument("--model", help="geometry of the run (preset or config.json), for the fused "
                                        "kernel's bytes when the profile lists no shapes")
    parser.add_argument("--tp", type=_positive, help="tensor-parallel size of the run (default 1)")
    parser.add_argument("--tokens", type=_positive, help="tokens per call in the run")
    parser.add_argument("--dtype", choices=sorted(DTYPE_BYTES), help="qkv dtype of the run (default bf16)")
    parser.add_argument("--cache-dtype", choices=sorted(DTYPE_BYTES), help="cos/sin cache dtype (default fp32)")
    parser.add_argument("--iterations", type=_positive, help="prologues the run timed (default: from workload.json)")
    parser.add_argument("--peak-gbps", type=_positive_float, help="device peak memory bandwidth, GB/s")
    parser.add_argument("--fused", default=FUSED_PATTERN, help="regex of fused kernel names")
    parser.add_argument("--unfused", default=UNFUSED_PATTERN, help="regex of unfused prologue kernel names")
    parser.add_argument("--png", help="where to write the plot, a .png file (default results/report-<time>.png)")
    parser.add_argument("--no-png", action="store_true", help="write no plot")
    parser.add_argument("--json", action="store_true", help="print the tables as JSON")


def arguments(path, png=None):
    """``report``'s options for ``path`` as the command line would give them, for callers in-process.

    Parameters
    ----------
    path : str or path-like
        The profile file or folder.
    png : str or path-like, optional
        ``--png``.

    Returns
    -------
    argparse.Namespace
        What :func:`run` takes (every other option at its default).
    """
    parser = CliParser(prog="vllm-ascend-ext report", **{k: v for k, v in _PARSER.items() if k != "help"})
    _declare(parser)
    argv = [str(path)] + (["--png", str(png)] if png is not None else [])
    return parser.parse_args(argv)


def _positive(text: str) -> int:
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    import argparse

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def _png_path(args) -> Path | None:
    """Where the plot goes (checked and its folder created), or ``None`` for no plot.

    Raises
    ------
    CliError
        Exit status 2 when ``--png`` does not name a ``.png`` file or its folder cannot be
        written; 1 when ``--png`` is given and matplotlib is not installed.
    """
    if args.no_png:
        return None
    if args.png is not None and Path(args.png).suffix.lower() != ".png":
        raise CliError(f"--png must name a .png file, got {args.png!r}")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        if args.png is not None:
            raise CliError("--png needs matplotlib: pip install matplotlib", code=1) from None
        return None
    png = Path(args.png) if args.png is not None else Path("results") / f"report-{time.strftime('%Y%m%d-%H%M%S')}.png"
    if png.is_dir():
        raise CliError(f"--png {png}: is a folder, not a .png file")
    output_dir(png.parent, "--png")
    return png


def run(args) -> int:
    """Read the profile(s) at ``args.path``, print the tables, write the PNG.

    ``--png`` is checked before anything is read.
    """
    png = _png_path(args)
    root = Path(args.path)
    files = find_profiles(root)
    stop = root if root.is_dir() else root.parent
    ctx = _context(args, sidecar_of(files[0], stop))
    records = load(root, ctx)
    stats = summarize(records, ctx)
    groups = group_summary(stats, ctx)
    if args.json:
        print(json.dumps({"kernels": [_public(s) for s in stats],
                          "groups": groups, "peak_gbps": ctx.peak_gbps, "floor_bytes": ctx.floor_bytes,
                          "iterations": ctx.iterations, "files": [str(f) for f in files]}, indent=2))
    else:
        print(format_report(stats, groups, ctx))
    if png is None:
        if not args.no_png:
            sys.stderr.write("report: no PNG (matplotlib is not installed: pip install matplotlib)\n")
        return 0
    try:
        write_png(stats, groups, ctx, png)
    except OSError as exc:
        raise CliError(f"cannot write {png}: {exc.strerror or exc}", code=1) from None
    (sys.stderr if args.json else sys.stdout).write(f"plot: {png}\n")
    return 0
