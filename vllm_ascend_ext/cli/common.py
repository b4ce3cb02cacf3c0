"""What the subcommands share: the error type and its one-line form, the ``--backend`` check, the
settings check, the one reader of the JSON files a user gives, a progress bar, output folders.

The device probe itself is :mod:`vllm_ascend_ext.devices`.
Nothing here imports ``torch_npu``, vLLM or Triton at module import time.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import reprlib
import sys
import tempfile
import time
from pathlib import Path

from ..devices import Device, detect_device, unavailable_reason
from ..ops import settings

__all__ = [
    "PROG",
    "CliError",
    "CliParser",
    "Progress",
    "check_settings",
    "dist_version",
    "error_line",
    "output_dir",
    "read_json",
    "results_dir",
    "shown",
    "usable_device",
]

PROG = "vllm-ascend-ext"
#: What each device (``devices.DEVICE_NAMES``) is called in messages.
DEVICE_TITLES = {"npu": "Ascend NPU", "cuda": "CUDA GPU", "cpu": "CPU"}
#: Where ``profile`` (and ``bench`` by default) write; ``results/`` is git-ignored.
RESULTS_ROOT = "results"
#: How deep a JSON file the CLI reads may nest (lists and objects inside one another). Hugging
#: Face configs reach 5 (``quantization_config.config_groups.group_0.weights``), torch.profiler
#: traces 5 (``traceEvents[i].args.grid``); Python's reader runs out of stack near 1000, and
#: ``str`` of a value that deep, in an error line or a kernel name, would too.
JSON_MAX_DEPTH = 64


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


_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxlist, _SHOWN.maxdict, _SHOWN.maxstring, _SHOWN.maxlong, _SHOWN.maxother = \
    3, 8, 4, 60, 40, 60


def shown(value) -> str:
    """``repr(value)`` cut short for an error line: a 4000-digit integer or a 10 000-item list from
    a file is shown by its ends (``reprlib``)."""
    return _SHOWN.repr(value)


class _LongInt(str):
    """An integer literal of a JSON file with more digits than ``int()`` reads (its text)."""


def _int_or_long(text: str):
    try:
        return int(text)
    except ValueError:
        return _LongInt(text)


def _field(parts) -> str:
    """A field's path as error lines name it: ``rope_scaling.mrope_section[2]``, cut after 4 parts."""
    text = ""
    for part in parts[:4]:
        if isinstance(part, int):
            text += f"[{part}]"
        elif re.fullmatch(r"[\w.-]{1,40}", part, re.ASCII):
            text += f".{part}" if text else part
        else:
            text += f"[{shown(part)}]"
    return text + ("..." if len(parts) > 4 else "")


def _first_long_int(data):
    """The path (keys and indices) of the first :class:`_LongInt` in document order, or ``None``.
    No recursion: the value may nest as deep as the reader allowed."""
    stack = [((), data)]
    while stack:
        parts, value = stack.pop()
        if isinstance(value, _LongInt):
            return parts
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        stack.extend(reversed([(parts + (key,), item) for key, item in items]))
    return None


def _nests_deeper(data, limit: int) -> bool:
    """Whether a list or object in ``data`` lies inside ``limit`` others (no recursion)."""
    stack = [(0, data)] if isinstance(data, (dict, list)) else []
    while stack:
        depth, value = stack.pop()
        if depth >= limit:
            return True
        for item in value.values() if isinstance(value, dict) else value:
            if isinstance(item, (dict, list)):
                stack.append((depth + 1, item))
    return False


#: The tokens that matter to where a JSON text nests: a string (and the ``:`` that makes it a
#: key), a bracket, a comma.
_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"\s*:?|[][{},]')


def _too_deep_in_text(text: str) -> tuple[tuple, int]:
    """Where ``text`` first opens a list or object past :data:`JSON_MAX_DEPTH` levels: the path
    to it and its line (for a text too deep for Python's reader to give a value)."""
    stack: list[list] = []  # per open list or object: its bracket and the key or index now read
    for match in _JSON_TOKEN.finditer(text):
        token = match.group()
        if token[0] == '"':
            if token.endswith(":") and stack and stack[-1][0] == "{":
                stack[-1][1] = token[1:token.rindex('"')]
        elif token in "[{":
            if len(stack) == JSON_MAX_DEPTH:
                return tuple(entry[1] for entry in stack if entry[1] is not None), \
                    text.count("\n", 0, match.start()) + 1
            stack.append([token, 0 if token == "[" else None])
        elif token in "]}":
            if stack:
                stack.pop()
        elif stack and stack[-1][0] == "[":
            stack[-1][1] += 1
    return (), 1


def _too_deep(path, parts: tuple, line: int) -> CliError:
    where = f"{_field(parts)} nests" if parts else "nests"
    return CliError(f"{path}: {where} more than {JSON_MAX_DEPTH} levels deep (line {line})")


def read_json(path: str | os.PathLike):
    """The value of a JSON file the user gave (a ``config.json``, a ``workload.json``, a trace).

    Every JSON file the CLI reads is read here, so what a file can hold that Python's reader
    turns into a traceback is a one-line error naming the file (and the field) in one place.

    Parameters
    ----------
    path : str or path-like
        The file.

    Returns
    -------
    object
        The parsed value: no list or object in it nests more than :data:`JSON_MAX_DEPTH`
        levels, and every integer is an ``int``.

    Raises
    ------
    CliError
        Exit status 2, one line naming the file, when it cannot be read, is not UTF-8 text, is
        empty, is not JSON, nests more than :data:`JSON_MAX_DEPTH` levels (the field and line
        named), or holds an integer with more digits than Python reads (``int max str digits``,
        4300 by default; the field named). What each field must be is its reader's business.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise CliError(f"{path}: not a UTF-8 text file") from None
    if not text.strip():
        raise CliError(f"{path} is empty")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(f"{path} is not valid JSON (line {exc.lineno}: {exc.msg})") from None
    except RecursionError:
        raise _too_deep(path, *_too_deep_in_text(text)) from None
    except ValueError as exc:  # an integer literal longer than int() reads
        try:
            data = json.loads(text, parse_int=_int_or_long)
        except RecursionError:  # and, further on, nesting too deep for the reader
            raise _too_deep(path, *_too_deep_in_text(text)) from None
        parts = _first_long_int(data)
        if parts is None:
            raise CliError(f"{path} is not valid JSON ({exc})") from None
        for part in parts:
            data = data[part]
        raise CliError(f"{path}: {_field(parts) or 'the value'} is an integer of {len(data.lstrip('-'))} digits, "
                       "more than Python reads") from None
    if _nests_deeper(data, JSON_MAX_DEPTH):
        raise _too_deep(path, *_too_deep_in_text(text))
    return data


def dist_version(name: str) -> str | None:
    """Installed version of distribution ``name``, or ``None`` when it is not installed."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def usable_device(forced: str | None = None) -> Device:
    """The detected device, or the one ``--backend`` names when it is here.

    Parameters
    ----------
    forced : str or None
        ``--backend``'s value (``None``: detect).

    Returns
    -------
    Device

    Raises
    ------
    CliError
        Exit status 2 when ``forced`` names a device this machine does not have; the line says
        why and points at ``vllm-ascend-ext doctor``.
    """
    device = detect_device(forced)
    if device.forced:
        why = unavailable_reason(device.name)
        if why is not None:
            raise CliError(f"--backend {device.name}: no {DEVICE_TITLES[device.name]} on this machine ({why}); "
                           "`vllm-ascend-ext doctor` says what to install")
    return device


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
