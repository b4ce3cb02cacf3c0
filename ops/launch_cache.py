"""The launch cache: a call's validation, plans and compiled kernels, done once per key.

A call of an op is validated fully, planned and compiled the first time its **key** is seen;
the key is everything the validator looks at except the token count (device, dtypes, every
shape and stride but the token dimension, flags, scalars, the implementation requested). Later
calls with the same key compute the key, re-check only what the key leaves open (the token count
against positions and slot mapping), and launch the bound kernel. Nothing here knows an op: each
op module builds its own keys and entries (:class:`LaunchCache` only stores them).

Keys are built by the ops from :func:`tensor_key` (for a tensor whose sizes do not depend on
the token count; the ops spell the few that do, qkv, positions and slot mapping, themselves).
Where a key cannot be built cheaply (an argument of an unexpected type, a tensor that requires
grad while grad mode is on), the op takes the full path every time, which raises the same
``ValueError`` as ever: the cache changes what a call costs, never what it does.

The caches are bounded (:data:`MAX_ENTRIES` each, oldest dropped first), safe to use from
several threads (a dict read needs no lock; an insertion takes one), and cleared together by
:func:`clear` (tests; a process that changes ``VLLM_ASCEND_EXT_*`` settings read at plan time).
"""

from __future__ import annotations

import threading

import torch

__all__ = ["MAX_ENTRIES", "TOKEN_KEYS", "LaunchCache", "call_key", "clear", "positions_key", "prepared", "rows_key",
           "slots_key", "stats", "tensor_key", "tokens_agree"]

#: Entries per cache: a model has a few layer geometries, each with at most three token-count
#: buckets (0, 1, more) per cache; 256 leaves room for many models and tests in one process.
MAX_ENTRIES = 256

_caches: list[LaunchCache] = []


class LaunchCache:
    """A bounded, thread-safe map from a call's key to its prepared launch.

    Parameters
    ----------
    name : str
        The op's name (:func:`stats` reports per name).
    """

    def __init__(self, name: str):
        self.name = name
        self._entries: dict = {}
        self._lock = threading.Lock()
        #: Full validations (misses) and launches through a cached entry (hits) since the last
        #: :func:`clear`: what the tests read to see that the key works.
        self.misses = 0
        self.hits = 0
        _caches.append(self)

    def get(self, key):
        """The entry for ``key``, or ``None`` (``key`` ``None``, or unhashable: never cached)."""
        if key is None:
            return None
        try:
            entry = self._entries.get(key)
        except TypeError:  # an unhashable argument: the full path, every time
            return None
        if entry is not None:
            self.hits += 1
        return entry

    def put(self, key, entry):
        """Store ``entry`` under ``key`` (not when ``key`` is ``None``) and return it."""
        self.misses += 1
        if key is None:
            return entry
        try:
            hash(key)
        except TypeError:
            return entry
        with self._lock:
            if len(self._entries) >= MAX_ENTRIES:
                self._entries.pop(next(iter(self._entries)))
            self._entries[key] = entry
        return entry

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.misses = self.hits = 0

    def __len__(self) -> int:
        return len(self._entries)


def clear() -> None:
    """Empty every launch cache of the process (the next call of each key validates fully)."""
    for cache in _caches:
        cache.clear()


def stats() -> dict[str, tuple[int, int, int]]:
    """``{op name: (entries, full validations, cached launches)}`` since the last :func:`clear`."""
    return {cache.name: (len(cache), cache.misses, cache.hits) for cache in _caches}


def call_key(args: dict, token_keys: dict):
    """The key of one call from its arguments by name (an op passes its ``locals()``), or
    ``None`` when the call is not to be cached.

    Tensors enter as :func:`tensor_key`, except those named in ``token_keys`` (name -> function
    of the tensor), whose sizes include the token count; scalars with their type (``True`` is
    not ``1`` to the validator); lists and tuples as tuples; other objects (a process group, a
    callable) as themselves. A tensor that requires grad while grad mode is on makes the key
    ``None``: the validator refuses the call, every time.
    """
    grad = torch.is_grad_enabled()
    values, kinds = [], []
    for name, value in args.items():
        kind = type(value)
        if kind is torch.Tensor or isinstance(value, torch.Tensor):
            if grad and value.requires_grad:
                return None
            special = token_keys.get(name)
            values.append(tensor_key(value) if special is None else special(value))
        elif kind is list or kind is tuple:  # mRoPE's sections; MLA's (nope, rope) caches
            values.append(tuple(tensor_key(v) if isinstance(v, torch.Tensor) else (v, type(v)) for v in value))
            kind = tuple  # the validators take a list as the same tuple (int[] reaches an op as a list)
        else:
            values.append(value)
        kinds.append(kind)
    return tuple(values), tuple(kinds)


def tensor_key(t):
    """What the validator reads of a tensor whose sizes do not depend on the token count
    (``None`` stays ``None``; anything else that is no tensor raises, and the op takes the full
    path). The pointer's 16-byte alignment is in the key: a compiled kernel is specialised on it."""
    if t is None:
        return None
    return t.dtype, t.device, t.shape, t.stride(), not t.data_ptr() & 15




def rows_key(t):
    """The key of a tensor whose first dim is the token count (qkv): all but that count, which is
    bucketed (0, 1, more: the validators' row-stride rules look at more than one row)."""
    tokens = t.shape[0]
    return t.dtype, t.device, t.shape[1:], t.stride(), not t.data_ptr() & 15, tokens if tokens < 2 else 2


def positions_key(positions):
    """positions' key: ``[T]`` or ``[3, T]``, its lane stride (the axis stride of ``[3, T]`` is a
    run-time argument); the token count is checked per call (``tokens_agree``)."""
    return (positions.dtype, positions.device, positions.shape[:-1], positions.stride(-1),
            not positions.data_ptr() & 15)


def slots_key(slot_mapping):
    """slot_mapping's key: its length (at least the token count, checked per call) bucketed as
    :func:`rows_key` does."""
    slots = slot_mapping.shape[0] if slot_mapping.dim() else 0
    return (slot_mapping.dtype, slot_mapping.device, slot_mapping.dim(), slot_mapping.stride(),
            not slot_mapping.data_ptr() & 15, slots if slots < 2 else 2)


def tokens_agree(args: dict) -> bool:
    """Whether positions and slot mapping hold the token count of qkv (the key leaves it out)."""
    tokens = args["qkv"].shape[0]
    if args["positions"].shape[-1] != tokens:
        return False
    slots = args.get("slot_mapping")
    return slots is None or slots.shape[0] >= tokens


#: The arguments of the split-QKV family whose sizes include the token count, and their key.
TOKEN_KEYS = {"qkv": rows_key, "positions": positions_key, "slot_mapping": slots_key}


def prepared(cache: LaunchCache, args: dict, validate, make, token_keys: dict, extra=None):
    """The prepared call (the cache's entry) for ``args``, an op's arguments by name.

    On a miss, ``make(validate(**args), args)`` makes one (``validate``: the op's validator,
    raising ``ValueError`` on a bad argument). A hit re-checks what the key leaves open
    (``entry.tokens_agree(args)``: the token counts of positions and slot mapping) and on a
    mismatch validates fully, which raises. ``token_keys``: as :func:`call_key`; ``extra``: more
    of the key (the implementation requested, for the selector's cache).
    """
    try:
        key = call_key(args, token_keys)
    except (AttributeError, TypeError, RuntimeError):  # no tensor where one belongs, say
        key = None
    if key is not None and extra is not None:
        key = (key, extra)
    entry = cache.get(key)
    if entry is not None and entry.tokens_agree(args):
        return entry
    return cache.put(key, make(validate(**args), args))
