"""``vllm-ascend-ext report PATH``: per-kernel time and bandwidth from a profile.

Readers (``PATH`` is a file, or a folder searched recursively for these names):

* msprof's ``op_summary_*.csv`` (application form). Columns as documented in CANN's
  "op_summary (Operator Details)":
  https://www.hiascend.com/document/detail/en/canncommercial/850/devaids/profiling/atlasprofiling_16_0067.html
  Needed: ``Op Name``, ``Task Duration(us)``; used when present: ``OP Type``, ``Task Type``,
  ``Block Dim``, ``Input Shapes``, ``Input Data Types``, ``Output Shapes``, ``Output Data Types``.
* ``msprof op``'s ``OpBasicInfo.csv``: ``Op Name``, ``Op Type``, ``Task Duration(us)``,
  ``Block Dim``, as documented in "OpBasicInfo (Basic Operator Information)":
  https://www.hiascend.com/document/detail/en/canncommercial/850/devaids/optool/atlasopdev_16_0098.html
* torch_npu's profiler ``kernel_details.csv``: ``Name``, ``Duration(us)``; used when present:
  ``Type``, ``Accelerator Core``, ``Block Dim``, the four shape/type columns. Documented in
  "Timeline and Summary Data" (kernel_details.csv):
  https://www.hiascend.com/document/detail/en/canncommercial/850/devaids/profiling/atlasprofiling_16_1149.html
* our torch.profiler export (``profile`` on CUDA): Chrome-trace JSON; events with
  ``"cat": "kernel"`` and ``"ph": "X"`` give a kernel's name and duration (``dur``, in us).

Bytes per call come from the tensor shapes and dtypes the CSV lists (inputs + outputs: an
upper bound on traffic), else, for the fused kernel, from the known geometry
(:func:`vllm_ascend_ext.bench.bytes_moved`, the benchmark's floor) given by a ``workload.json`` that
``profile`` writes next to each run, or by ``--model/--tp/--tokens/--dtype``.

Each kernel falls in a group: the provider named by the run's ``workload.json`` (``ours``,
``eager``, ``compile``), else ``fused`` / ``unfused`` / ``other`` by the ``--fused`` and
``--unfused`` patterns. Groups are shown side by side: time per prologue, kernels launched,
and the floor bandwidth (the bytes the fused op must move over that time).

A missing column, an empty file, an unparsable or negative number (a duration, a dimension), a
CSV field too long for Python's ``csv`` module, a JSON file that nests too deep or holds an
integer Python cannot read (:func:`~vllm_ascend_ext.cli.common.read_json`), or a malformed
``workload.json`` field is a one-line error naming the file (exit 2).
"""

from __future__ import annotations

import csv
import json
import math
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .common import CliError, CliParser, output_dir, read_json, shown
from .geometry import DTYPE_BYTES, resolve_model, shard_checked

__all__ = ["KernelStats", "Record", "add_parser", "arguments", "load", "read_sidecar", "run", "summarize"]

#: Kernels of the fused op: ours (Triton) and vllm-ascend's (``qkv_rmsnorm_rope``).
FUSED_PATTERN = r"split_qkv_rmsnorm_rope|qkv_rmsnorm_rope"
#: Kernels of the unfused prologue: RMSNorm, rotary embedding, the split and copies around them.
UNFUSED_PATTERN = r"(?i)rms_?norm|rotary|rope|split_with_sizes|strided_?slice"
#: Vendor peak memory bandwidth (GB/s) by a device-name fragment; used when --peak-gbps is not
#: given. NVIDIA datasheets: H200 SXM 4.8 TB/s, H100 SXM 3.35 TB/s. No Ascend figure is listed
#: because none was checked here: pass --peak-gbps for an NPU.
PEAK_GBPS = {"H200": 4800.0, "H100": 3350.0}
SIDECAR = "workload.json"
#: Suffix of the group of a kernel launched fewer times than the run's prologues: set-up work
#: (input creation, caches), listed but left out of the side-by-side.
SETUP = "setup"

#: Bytes per element of the dtype names msprof / torch_npu write (``DT_BF16``, ``FLOAT16``...).
_PROFILE_DTYPE_BYTES = {
    "float": 4, "float32": 4, "fp32": 4, "float16": 2, "fp16": 2, "half": 2, "bf16": 2,
    "bfloat16": 2, "double": 8, "float64": 8, "int64": 8, "uint64": 8, "int32": 4, "uint32": 4,
    "int16": 2, "uint16": 2, "int8": 1, "uint8": 1, "bool": 1, "complex64": 8,
}


@dataclass(frozen=True)
class Layout:
    """A profile file layout: its columns, and which of them name and time a kernel."""

    kind: str
    name_column: str
    duration_column: str
    type_column: str | None
    optional: tuple[str, ...] = ()


OP_SUMMARY = Layout("msprof op_summary", "Op Name", "Task Duration(us)", "OP Type",
                    ("Task Type", "Block Dim", "Input Shapes", "Input Data Types",
                     "Output Shapes", "Output Data Types"))
OP_BASIC_INFO = Layout("msprof op OpBasicInfo", "Op Name", "Task Duration(us)", "Op Type", ("Block Dim",))
KERNEL_DETAILS = Layout("torch_npu kernel_details", "Name", "Duration(us)", "Type",
                        ("Accelerator Core", "Block Dim", "Input Shapes", "Input Data Types",
                         "Output Shapes", "Output Data Types"))


@dataclass(frozen=True)
class Record:
    """One kernel launch as a profile lists it."""

    name: str
    duration_us: float
    nbytes: int | None
    group: str
    source: str


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


@dataclass
class Context:
    """What is known about the run: geometry (for bytes), iterations, peak, patterns."""

    geometry: object = None
    tokens: int | None = None
    elem_bytes: int = 2
    cache_bytes: int = 4
    iterations: int | None = None
    peak_gbps: float | None = None
    peak_from: str = ""
    fused: re.Pattern = field(default_factory=lambda: re.compile(FUSED_PATTERN))
    unfused: re.Pattern = field(default_factory=lambda: re.compile(UNFUSED_PATTERN))
    notes: list = field(default_factory=list)

    @property
    def floor_bytes(self) -> int | None:
        """Bytes the fused op must move for the run's tokens, when the geometry is known."""
        if self.geometry is None or self.tokens is None:
            return None
        from ..bench import bytes_moved

        return bytes_moved(self.geometry, self.tokens, self.elem_bytes, self.cache_bytes)


def _dtype_bytes(name: str) -> int | None:
    key = name.strip().lower()
    if key.startswith("dt_"):
        key = key[3:]
    return _PROFILE_DTYPE_BYTES.get(key)


def tensor_bytes(shapes: str, dtypes: str) -> int | None:
    """Bytes of the tensors a profile lists as ``"4096,6144;128"`` with ``"DT_BF16;FLOAT"``.

    Tensors are separated by ``;``, dimensions by ``,``; an empty shape is a scalar.

    Returns
    -------
    int or None
        ``None`` when the two lists do not line up or a dtype or dimension is not understood.

    Raises
    ------
    ValueError
        Naming ``shapes`` when a dimension is negative (a size cannot be).
    """
    shapes, dtypes = (shapes or "").strip().strip('"'), (dtypes or "").strip().strip('"')
    if not shapes or not dtypes or shapes.upper() == "N/A" or dtypes.upper() == "N/A":
        return None
    shape_list, dtype_list = shapes.split(";"), dtypes.split(";")
    if len(shape_list) != len(dtype_list):
        return None
    total = 0
    for shape, dtype in zip(shape_list, dtype_list):
        size = _dtype_bytes(dtype)
        if size is None:
            if not dtype.strip() and not shape.strip():
                continue
            return None
        try:
            dims = [int(d) for d in shape.split(",") if d.strip()]
        except ValueError:
            return None
        if any(d < 0 for d in dims):
            raise ValueError(f"shapes lists a negative dimension: {shape.strip()!r}")
        total += math.prod(dims) * size
    return total


#: The largest ``tp``, ``tokens`` or ``iterations`` a ``workload.json`` may give: 2**31 - 1, an
#: int32 (what a launch grid counts in). Past it a value is a typo, and near 10**308 the
#: bandwidth arithmetic overflows a float.
SIDECAR_MAX_INT = 2**31 - 1


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= SIDECAR_MAX_INT


#: ``workload.json``'s fields and what each must be: a checker, and the words for the error line.
_SIDECAR_FIELDS = {
    "provider": (lambda v: isinstance(v, str) and bool(v), "a non-empty string"),
    "model": (lambda v: isinstance(v, str) and bool(v), "a non-empty string (a preset or config.json)"),
    "tp": (_count, f"a positive integer (at most {SIDECAR_MAX_INT})"),
    "tokens": (_count, f"a positive integer (at most {SIDECAR_MAX_INT})"),
    "iterations": (_count, f"a positive integer (at most {SIDECAR_MAX_INT})"),
    "dtype": (lambda v: v in DTYPE_BYTES, "one of " + ", ".join(sorted(DTYPE_BYTES))),
    "cache_dtype": (lambda v: v in DTYPE_BYTES, "one of " + ", ".join(sorted(DTYPE_BYTES))),
    "device": (lambda v: isinstance(v, str), "a string"),
}


def read_sidecar(path: Path) -> dict:
    """The fields of one ``workload.json``, checked.

    Parameters
    ----------
    path : Path
        The file.

    Returns
    -------
    dict
        Its fields; each known field present is of the right kind (:data:`_SIDECAR_FIELDS`),
        unknown fields are kept as they are.

    Raises
    ------
    CliError
        One line naming the file and the field, when it is not a JSON object or a field is
        malformed (``"tokens": "abc"``, ``"dtype": "int8"``...), or the file is not JSON
        (:func:`~vllm_ascend_ext.cli.common.read_json`).
    """
    data = read_json(path)
    if not isinstance(data, dict):
        raise CliError(f"{path}: not a JSON object")
    for key, (valid, expected) in _SIDECAR_FIELDS.items():
        if key in data and data[key] is not None and not valid(data[key]):
            raise CliError(f"{path}: field {key!r} must be {expected}, got {shown(data[key])}")
    return data


def _read_sidecar(path: Path, stop: Path) -> dict | None:
    """The ``workload.json`` of the run ``path`` belongs to (searched up to ``stop``), checked."""
    for folder in [path.parent, *path.parent.parents]:
        candidate = folder / SIDECAR
        if candidate.is_file():
            return read_sidecar(candidate)
        if folder == stop or folder == folder.parent:
            break
    return None


def _group(name: str, ctx: Context, sidecar: dict | None) -> str:
    if sidecar and isinstance(sidecar.get("provider"), str):
        return sidecar["provider"]
    if ctx.fused.search(name):
        return "fused"
    if ctx.unfused.search(name):
        return "unfused"
    return "other"


def _layout_of(path: Path, header: list[str]) -> Layout:
    columns = set(header)
    for layout in (OP_SUMMARY, KERNEL_DETAILS, OP_BASIC_INFO):
        if layout.name_column in columns and layout.duration_column in columns:
            if layout is OP_SUMMARY and "OpBasicInfo" in path.name:
                return OP_BASIC_INFO
            return layout
    if path.name.startswith("op_summary") or path.name == "OpBasicInfo.csv":
        expected = OP_SUMMARY
    elif path.name.startswith("kernel_details"):
        expected = KERNEL_DETAILS
    else:
        raise CliError(f"{path}: not a profile CSV this reads (needs 'Op Name' + 'Task Duration(us)' "
                       "as msprof writes, or 'Name' + 'Duration(us)' as torch_npu writes)")
    missing = [c for c in (expected.name_column, expected.duration_column) if c not in columns]
    raise CliError(f"{path}: missing column {missing[0]!r} of the {expected.kind} layout "
                   f"(columns found: {', '.join(header[:8]) or 'none'})")


def read_csv(path: Path, ctx: Context, stop: Path) -> list[Record]:
    """Kernel launches from one msprof or torch_npu CSV (see the module docstring)."""
    try:
        with path.open(newline="", encoding="utf-8-sig") as handle:
            reader = csv.reader(handle)
            try:
                rows = list(reader)
            except csv.Error as exc:
                raise CliError(f"{path}, line {reader.line_num}: not a CSV this reads ({exc})") from None
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise CliError(f"{path}: not a text CSV") from None
    rows = [row for row in rows if any(cell.strip() for cell in row)]
    if not rows:
        raise CliError(f"{path} is empty")
    header = [cell.strip() for cell in rows[0]]
    layout = _layout_of(path, header)
    if len(rows) == 1:
        raise CliError(f"{path} has a header but no rows")
    index = {name: i for i, name in enumerate(header)}
    sidecar = _read_sidecar(path, stop)
    records = []
    for number, row in enumerate(rows[1:], start=2):
        def cell(column, row=row):
            i = index.get(column)
            return row[i].strip() if i is not None and i < len(row) else ""

        name = cell(layout.name_column)
        raw = cell(layout.duration_column)
        if raw.upper() in ("", "N/A", "NA"):
            continue  # e.g. communication tasks without a duration of their own
        try:
            duration = float(raw)
        except ValueError:
            raise CliError(f"{path}, line {number}: {layout.duration_column} {raw!r} is not a number") from None
        if not math.isfinite(duration) or duration < 0:
            raise CliError(f"{path}, line {number}: {layout.duration_column} {raw!r} is not a duration")
        nbytes = None
        if "Input Shapes" in index:
            try:
                inputs = tensor_bytes(cell("Input Shapes"), cell("Input Data Types"))
                outputs = tensor_bytes(cell("Output Shapes"), cell("Output Data Types"))
            except ValueError as exc:
                raise CliError(f"{path}, line {number}: {exc}") from None
            if inputs is not None and outputs is not None:
                nbytes = inputs + outputs
        records.append(Record(name or "(unnamed)", duration, nbytes, _group(name, ctx, sidecar), str(path)))
    if not records:
        raise CliError(f"{path}: no row has a {layout.duration_column}")
    return records


def read_trace(path: Path, ctx: Context, stop: Path) -> list[Record]:
    """Kernel launches from a Chrome-trace JSON that torch.profiler exported."""
    data = read_json(path)
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise CliError(f"{path}: no traceEvents list (not a torch.profiler Chrome trace)")
    sidecar = _read_sidecar(path, stop)
    records = []
    for event in events:
        if not isinstance(event, dict) or str(event.get("cat", "")).lower() != "kernel" or event.get("ph") != "X":
            continue
        raw = event.get("dur")
        if isinstance(raw, bool) or not isinstance(raw, (int, float)):  # "21.5" is text, not a number
            raise CliError(f"{path}: a kernel event without a numeric 'dur' (got {shown(raw)})")
        try:
            duration = float(raw)
        except OverflowError:  # an integer past float's range
            duration = math.inf
        name = str(event.get("name", "(unnamed)"))
        if not math.isfinite(duration) or duration < 0:
            raise CliError(f"{path}: kernel event {shown(name)} has 'dur' {shown(raw)}, not a duration "
                           "(a finite number >= 0)")
        records.append(Record(name, duration, None, _group(name, ctx, sidecar), str(path)))
    if not records:
        raise CliError(f"{path}: no GPU kernel events (cat 'kernel') in the trace")
    return records


def find_profiles(root: Path) -> list[Path]:
    """Profile files under ``root`` (or ``root`` itself), in a stable order."""
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise CliError(f"{root}: no such file or folder")
    found = []
    for pattern in ("op_summary_*.csv", "OpBasicInfo.csv", "kernel_details.csv", "*trace*.json"):
        found += sorted(root.rglob(pattern))
    if not found:
        raise CliError(f"{root}: no op_summary_*.csv, OpBasicInfo.csv, kernel_details.csv or "
                       "*trace*.json inside")
    return found


def load(root: Path, ctx: Context) -> list[Record]:
    """Every kernel launch of every profile file under ``root``."""
    records = []
    stop = root if root.is_dir() else root.parent
    for path in find_profiles(root):
        reader = read_trace if path.suffix.lower() == ".json" else read_csv
        records += reader(path, ctx, stop)
    return records


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
    ctx = _context(args, _read_sidecar(files[0], stop))
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
