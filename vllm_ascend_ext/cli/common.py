"""What the subcommands share: the error type and its one-line form, the backend check, the
settings check, a progress bar, output folders.

The backend probe itself is :mod:`vllm_ascend_ext.backends` (the benchmark library uses it too).
Nothing here imports ``torch_npu``, vLLM or Triton at module import time.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys
import tempfile
import time
from pathlib import Path

from ..backends import BACKENDS, Backend, detect_backend, unavailable_reason
from ..ops import settings

__all__ = [
    "BACKENDS",
    "PROG",
    "CliError",
    "CliParser",
    "Progress",
    "check_settings",
    "dist_version",
    "error_line",
    "output_dir",
    "results_dir",
    "usable_backend",
]

PROG = "vllm-ascend-ext"
#: What each backend's device is called in messages.
DEVICE_NAMES = {"npu": "Ascend NPU", "cuda": "CUDA GPU", "cpu": "CPU"}
#: Where ``profile`` (and ``bench`` by default) write; ``results/`` is git-ignored.
RESULTS_ROOT = "results"


class CliError(Exception):
    """A bad input or a missing piece: printed as one line, exit status :attr:`code`.

    Parameters
    ----------
    message : str
        The one-line reason (no trailing newline).
    code : int
        Exit status, 2 for bad input (as argparse uses), 1 for a missing piece or a failed run.
    """

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


class CliParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, ``vllm-ascend-ext <cmd>: error: ...``.

    argparse's default prints the usage block before the error; this one prints only the
    reason and a pointer to ``--help``, and exits 2.
    """

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def error_line(command: str | None, message: str) -> str:
    """The one line a failed command prints: ``vllm-ascend-ext <command>: error: <message>``."""
    where = f"{PROG} {command}" if command else PROG
    return f"{where}: error: {message}\n"


def dist_version(name: str) -> str | None:
    """Installed version of distribution ``name``, or ``None`` when it is not installed."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def usable_backend(forced: str | None = None) -> Backend:
    """The detected backend, or the one ``--backend`` names when its device is here.

    Parameters
    ----------
    forced : str or None
        ``--backend``'s value (``None``: detect).

    Returns
    -------
    Backend

    Raises
    ------
    CliError
        Exit status 2 when ``forced`` names a device this machine does not have; the line says
        why and points at ``vllm-ascend-ext doctor``.
    """
    backend = detect_backend(forced)
    if backend.forced:
        why = unavailable_reason(backend.name)
        if why is not None:
            raise CliError(f"--backend {backend.name}: no {DEVICE_NAMES[backend.name]} on this machine ({why}); "
                           "`vllm-ascend-ext doctor` says what to install")
    return backend


def check_settings() -> None:
    """Read the environment variables the op's launch plans are sized from, before any work starts.

    ``VLLM_ASCEND_EXT_SOC``, ``_UB_BYTES``, ``_VECTOR_CORES`` and ``_NUM_SMS`` are read when the
    op first plans a launch, which in a benchmark is after minutes of set-up, and
    ``TRITON_INTERPRET`` when the run is recorded; reading them here refuses a bad value at once.

    Raises
    ------
    vllm_ascend_ext.ops.settings.SettingError
        A ``ValueError`` naming the variable whose value does not parse (the command prints it
        as one line, exit status 2).
    """
    settings.soc()
    settings.ub_bytes()
    settings.vector_cores()
    settings.num_sms()
    settings.triton_interpret()


def output_dir(path: str | os.PathLike, option: str) -> Path:
    """Create the output folder ``path`` (and its parents) and check that files can be written in it.

    Called before any measurement, so a bad ``--out`` fails at once rather than after the run.

    Parameters
    ----------
    path : str or path-like
        The folder.
    option : str
        The option that named it (``"--out"``), for the error line.

    Returns
    -------
    Path

    Raises
    ------
    CliError
        Exit status 2 when the folder cannot be created or written in.
    """
    folder = Path(path)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except FileExistsError:
        raise CliError(f"{option} {folder}: exists and is not a folder") from None
    except OSError as exc:
        raise CliError(f"{option} {folder}: cannot write there ({exc.strerror or exc})") from None
    return folder


def results_dir(root: str | os.PathLike | None, what: str) -> Path:
    """A fresh ``<root>/<what>-<timestamp>`` folder (``root`` defaults to ``results/``), created.

    Raises
    ------
    CliError
        Exit status 2 when it cannot be created or written in (:func:`output_dir`).
    """
    base = Path(root if root is not None else RESULTS_ROOT)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = base / f"{what}-{stamp}"
    suffix = 1
    while path.exists():
        suffix += 1
        path = base / f"{what}-{stamp}-{suffix}"
    return output_dir(path, "the output folder")


class Progress:
    """A one-line progress bar on a stream (stderr by default), without dependencies.

    On a terminal the line is redrawn in place; elsewhere (CI logs, pipes) one line is printed
    per step, so logs stay readable.

    Parameters
    ----------
    total : int
        Steps expected.
    label : str
        Text before the bar.
    stream : file-like or None
        Where to draw; ``None`` means ``sys.stderr``.
    enabled : bool
        ``False`` draws nothing (``--no-progress``).
    """

    WIDTH = 24

    def __init__(self, total: int, label: str = "", stream=None, enabled: bool = True):
        self.total = max(int(total), 1)
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.done = 0
        self.started = time.monotonic()
        self._running = False
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())

    @property
    def active(self) -> bool:
        """Whether a step has begun and :meth:`finish` has not been called."""
        return self._running

    def begin(self, what: str) -> None:
        """Start the next step, ``what`` naming it; the step before it counts as done."""
        if self._running:
            self.done = min(self.done + 1, self.total)
        self._running = True
        self._draw(what)

    def finish(self, what: str = "done") -> None:
        """Count every step as done and end the line."""
        self.done, self._running = self.total, False
        self._draw(what)

    def _draw(self, what: str) -> None:
        if not self.enabled:
            return
        filled = self.WIDTH * self.done // self.total
        bar = "#" * filled + "." * (self.WIDTH - filled)
        elapsed = time.monotonic() - self.started
        line = f"{self.label} [{bar}] {self.done}/{self.total} {elapsed:6.1f}s {what}".rstrip()
        if self._tty:
            self.stream.write("\r\x1b[2K" + line)
            if self.done == self.total and not self._running:
                self.stream.write("\n")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        """End the bar's line on a terminal if it was left open."""
        if self.enabled and self._tty and self._running:
            self.stream.write("\n")
            self.stream.flush()
