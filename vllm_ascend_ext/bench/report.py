"""What a run shows and writes: the helpers every family's text table uses, the text a run prints
(:func:`summary`), and the files: CSV, JSON and text of every run (:func:`write_outputs`,
:func:`write_host_outputs`), the prologue's PNG (:func:`plot`) and the host mode's.

Each family's table and bar verdict are in its module (``prologue``, ``kv_cache``, ``mla``,
``tp``, ``host``); this module imports none of them.
"""

from __future__ import annotations

import csv
import json
from dataclasses import asdict
from pathlib import Path

from .catalog import OP, PROVIDERS
from .harness import KVRow, check_rows

__all__ = ["CPU_DISCLAIMER", "cells", "plot", "ratio", "summary", "write_host_outputs", "write_outputs"]

CPU_DISCLAIMER = ("CPU run: the kernel ran through the Triton interpreter; these timings mean "
                  "nothing for NPU or GPU speed.")


def cells(rows, key=lambda r: (r.model, r.tp, r.geometry, r.tokens)) -> dict:
    """Rows by ``key`` (default (model, TP, geometry, T)), then by provider, in the rows' order."""
    by_key: dict = {}
    for r in rows:
        by_key.setdefault(key(r), {})[r.provider] = r
    return by_key


def ratio(cells_of_key: dict, mine: str, other: str, attr: str = "us") -> float:
    """``mine``'s ``attr`` over ``other``'s among one key's cells; NaN when either was not run."""
    if mine not in cells_of_key or other not in cells_of_key:
        return float("nan")
    return getattr(cells_of_key[mine], attr) / getattr(cells_of_key[other], attr)


def summary(result: dict, table: str, bar_lines: list[str]) -> tuple[str, list[str]]:
    """The text a run prints and writes, and its failed checks.

    Parameters
    ----------
    result : dict
        A run's ``{"rows": ..., "meta": ...}``.
    table : str
        The run's text table.
    bar_lines : list of str
        Its bar verdict (the caller leaves out what its device does not hold to a bar).

    Returns
    -------
    text : str
        ``table``; then on CPU :data:`CPU_DISCLAIMER`, elsewhere ``bar_lines`` prefixed ``bar:``;
        then ``CHECK FAILED:`` lines.
    failures : list of str
        ``harness.check_rows``' lines.
    """
    lines = [table]
    if result["meta"]["device"] == "cpu":
        lines.append(CPU_DISCLAIMER)
    else:
        lines += ["bar: " + line for line in bar_lines]
    failures = check_rows(result["rows"])
    lines += ["CHECK FAILED: " + line for line in failures]
    return "\n".join(lines), failures


def _write_files(out_dir: Path, stem: str, meta: dict, records: list[dict], text: str | None) -> list[Path]:
    """``<stem>.csv`` and ``<stem>.json`` of ``records`` (the JSON with ``meta``), and ``<stem>.txt``
    of ``text`` when given (ending in one newline), in ``out_dir`` (created if missing)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path, json_path = out_dir / f"{stem}.csv", out_dir / f"{stem}.json"
    with csv_path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(records[0]) if records else [])
        writer.writeheader()
        writer.writerows(records)
    json_path.write_text(json.dumps({"meta": meta, "rows": records}, indent=1))
    paths = [csv_path, json_path]
    if text is not None:
        paths.append(out_dir / f"{stem}.txt")
        paths[-1].write_text(text if text.endswith("\n") else text + "\n")
    return paths


def write_outputs(result: dict, out_dir: Path, text: str | None = None) -> list[Path]:
    """CSV and JSON of every row, the text shown (if given), and for :data:`~.catalog.OP` a PNG
    (bandwidth vs tokens per provider, with the floor); the files are named ``bench_<op>.*``.

    Parameters
    ----------
    result : dict
        What a run returned (any op's: the rows' fields are the columns, and ``gbps``, with
        ``gbps_amortised`` for rows timed both ways).
    out_dir : Path
        The folder (created if missing); nothing is written outside it.
    text : str, optional
        Written as ``bench_<op>.txt`` (the table and bar lines as printed).

    Returns
    -------
    list of Path
        The files written (no PNG without matplotlib, none but for :data:`~.catalog.OP`).
    """
    op = result["meta"].get("op", OP)

    def record(r):
        return asdict(r) | {"gbps": r.gbps} | ({"gbps_amortised": r.gbps_amortised} if isinstance(r, KVRow) else {})

    paths = _write_files(out_dir, f"bench_{op}", result["meta"], [record(r) for r in result["rows"]], text)
    png = plot(result, out_dir / f"bench_{op}.png") if op == OP else None
    if png:
        paths.append(png)
    return paths


def _pyplot():
    """matplotlib's pyplot on the Agg backend, or ``None`` when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def plot(result: dict, path: Path) -> Path | None:
    """Bandwidth (GB/s) vs tokens of a prologue run, one panel per geometry, one line per provider,
    and the copy bandwidth as the ceiling.

    Parameters
    ----------
    result : dict
        What ``prologue.run`` returned.
    path : Path
        The PNG to write.

    Returns
    -------
    Path or None
        ``path``, or ``None`` when matplotlib is not installed.
    """
    plt = _pyplot()
    if plt is None:
        return None
    rows = result["rows"]
    labels = list(dict.fromkeys(r.geometry for r in rows))
    fig, axes = plt.subplots(1, len(labels), figsize=(4.2 * len(labels), 3.6), squeeze=False)
    for ax, label in zip(axes[0], labels):
        for provider in PROVIDERS:
            pts = [(r.tokens, r.gbps) for r in rows if r.geometry == label and r.provider == provider]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=provider)
        ceiling = result["meta"]["copy_bandwidth_GBps"]
        if ceiling == ceiling:
            ax.axhline(ceiling, color="gray", linestyle="--", label="copy bandwidth (floor)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(label)
        ax.set_xlabel("tokens")
        ax.set_ylabel("GB/s (min bytes / time)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"split_qkv_rmsnorm_rope on {result['meta']['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_host_outputs(result: dict, out_dir: Path, text: str | None = None) -> list[Path]:
    """``bench_host.csv``, ``.json``, ``.txt`` (the table) and ``.png`` (bars per case) in ``out_dir``.

    Parameters
    ----------
    result : dict
        What ``host.run_host`` returned.
    out_dir : Path
        The folder (created if missing).
    text : str, optional
        The table as printed.

    Returns
    -------
    list of Path
        The files written (no PNG without matplotlib).
    """
    records = [asdict(r) for r in result["rows"]]
    paths = _write_files(out_dir, "bench_host", result["meta"], records, text)
    plt = _pyplot()
    if plt is None:
        return paths
    fig, ax = plt.subplots(figsize=(10, 4))
    names = [f"{r['case']}\n{r['op'].replace('split_qkv_', '')}" for r in records]
    keys = ("add_", "unfused", "launch", "key", "ours", "torch_ops")
    width = 0.8 / len(keys)
    for i, key in enumerate(keys):
        ax.bar([x + i * width for x in range(len(records))], [r[key] or 0 for r in records], width, label=key)
    ax.set_xticks([x + (len(keys) - 1) / 2 * width for x in range(len(records))], names, fontsize=7)
    ax.set_ylabel("host µs per call (T = 1)")
    ax.set_title(f"host cost per call, {result['meta']['device']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    png = out_dir / "bench_host.png"
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return paths + [png]
