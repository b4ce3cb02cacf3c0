"""The profile files ``vllm-ascend-ext report`` reads, as kernel launches (:class:`Record`).

Layouts (``PATH`` is a file, or a folder searched recursively for these names: :func:`find_profiles`):

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

Bytes per launch come from the tensor shapes and dtypes the CSV lists (inputs + outputs:
:func:`tensor_bytes`). Each launch falls in a group: the provider named by the run's
``workload.json`` (:func:`read_sidecar`; ``ours``, ``eager``, ``compile``), else ``fused`` /
``unfused`` / ``other`` by the :class:`Context`'s name patterns.

A missing column, an empty file, an unparsable or negative number (a duration, a dimension), a
CSV field too long for Python's ``csv`` module, a JSON file that nests too deep or holds an
integer Python cannot read (:func:`~vllm_ascend_ext.cli.common.read_json`), or a malformed
``workload.json`` field is a one-line error naming the file (exit 2).
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from .common import CliError, read_json, shown
from .geometry import DTYPE_BYTES

__all__ = [
    "Context", "FUSED_PATTERN", "KERNEL_DETAILS", "Layout", "OP_BASIC_INFO", "OP_SUMMARY", "Record", "SIDECAR",
    "UNFUSED_PATTERN", "find_profiles", "load", "read_csv", "read_sidecar", "read_trace", "sidecar_of",
    "tensor_bytes",
]

#: Kernels of the fused op: ours (Triton) and vllm-ascend's (``qkv_rmsnorm_rope``).
FUSED_PATTERN = r"split_qkv_rmsnorm_rope|qkv_rmsnorm_rope"
#: Kernels of the unfused prologue: RMSNorm, rotary embedding, the split and copies around them.
UNFUSED_PATTERN = r"(?i)rms_?norm|rotary|rope|split_with_sizes|strided_?slice"
#: The file ``profile`` writes next to each run: its provider, geometry, iterations, device.
SIDECAR = "workload.json"

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
        from ..bench.cases import bytes_moved

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


def sidecar_of(path: Path, stop: Path) -> dict | None:
    """The ``workload.json`` of the run ``path`` belongs to, checked (:func:`read_sidecar`).

    Parameters
    ----------
    path : Path
        A profile file.
    stop : Path
        The last folder searched: ``path``'s folder and those above it, up to ``stop``.

    Returns
    -------
    dict or None
        The nearest ``workload.json``'s fields, ``None`` when there is none.
    """
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
    sidecar = sidecar_of(path, stop)
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
    sidecar = sidecar_of(path, stop)
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
