"""What the subcommands share: the error type, the backend probe, a progress bar, file output.

Nothing here imports ``torch_npu``, vLLM or Triton at module import time; :func:`detect_backend`
imports ``torch`` (and ``torch_npu`` only when it is installed) when it is called.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BACKENDS",
    "Backend",
    "CliError",
    "CliParser",
    "Progress",
    "detect_backend",
    "dist_version",
    "ensure_interpreter",
    "results_dir",
]

#: The backends the CLI knows, by the name ``--backend`` takes.
BACKENDS = ("npu", "cuda", "cpu")
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

    def error(self, message: str):  # noqa: D102 - argparse's hook
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def dist_version(name: str) -> str | None:
    """Installed version of distribution ``name``, or ``None`` when it is not installed."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class Backend:
    """Where the op would run here, and why.

    Attributes
    ----------
    name : str
        ``"npu"``, ``"cuda"`` or ``"cpu"`` (the Triton interpreter).
    reason : str
        One sentence saying why this backend was chosen over the others.
    device : str
        The torch device string the op would use (``"npu:0"``, ``"cuda:0"``, ``"cpu"``).
    forced : bool
        Chosen with ``--backend`` rather than found: the device may not exist here.
    """

    name: str
    reason: str
    device: str
    forced: bool = False


def _npu_available() -> tuple[bool, str]:
    """Whether an NPU is usable, importing ``torch_npu`` only when it is installed."""
    if importlib.util.find_spec("torch_npu") is None:
        return False, "torch_npu is not installed"
    try:
        import torch
        import torch_npu  # noqa: F401  (registers torch.npu)
    except Exception as exc:  # torch_npu raises many kinds when CANN is missing or mismatched
        return False, f"torch_npu does not import ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
    try:
        count = torch.npu.device_count()
    except Exception as exc:
        return False, f"torch.npu.device_count() failed ({type(exc).__name__})"
    if count < 1:
        return False, "torch_npu imports but sees no NPU"
    return True, f"torch_npu sees {count} NPU(s)"


def detect_backend(forced: str | None = None) -> Backend:
    """The backend the op would run on in this process.

    Order: an NPU (``torch_npu`` installed, importable, at least one device), else a CUDA GPU,
    else the CPU through the Triton interpreter.

    Parameters
    ----------
    forced : str or None
        ``"npu"``, ``"cuda"`` or ``"cpu"`` to skip the probe (``--backend``); the reason then
        says so.

    Returns
    -------
    Backend

    Raises
    ------
    CliError
        If ``forced`` is not a known backend name.
    """
    if forced is not None:
        if forced not in BACKENDS:
            raise CliError(f"--backend must be one of {', '.join(BACKENDS)}, got {forced!r}")
        device = {"npu": "npu:0", "cuda": "cuda:0", "cpu": "cpu"}[forced]
        return Backend(forced, "chosen with --backend", device, forced=True)
    npu_ok, npu_why = _npu_available()
    if npu_ok:
        return Backend("npu", npu_why, "npu:0")
    import torch

    if torch.cuda.is_available():
        name = torch.cuda.get_device_name(0)
        return Backend("cuda", f"no NPU ({npu_why}); CUDA GPU found: {name}", "cuda:0")
    cuda_why = "torch has no CUDA build" if torch.version.cuda is None else "torch sees no CUDA GPU"
    return Backend("cpu", f"no NPU ({npu_why}) and no CUDA GPU ({cuda_why}): "
                          "the op runs through the Triton interpreter on CPU tensors", "cpu")


def ensure_interpreter(backend: Backend) -> None:
    """Turn on Triton's interpreter for the CPU backend, before the op module is imported.

    Triton reads ``TRITON_INTERPRET`` when a kernel is decorated, so this must run before
    ``vllm_ascend_ext.ops`` is first imported.
    """
    if backend.name == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"


def results_dir(root: str | os.PathLike | None, what: str) -> Path:
    """A fresh ``<root>/<what>-<timestamp>`` folder (``root`` defaults to ``results/``)."""
    base = Path(root if root is not None else RESULTS_ROOT)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = base / f"{what}-{stamp}"
    suffix = 1
    while path.exists():
        suffix += 1
        path = base / f"{what}-{stamp}-{suffix}"
    try:
        path.mkdir(parents=True)
    except OSError as exc:
        raise CliError(f"cannot create the output folder {path}: {exc.strerror}", code=1) from None
    return path


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
