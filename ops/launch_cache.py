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

import operator
import threading

import torch

__all__ = ["MAX_ENTRIES", "MAX_TOKEN_COUNTS", "TOKEN_KEYS", "LaunchCache", "PlannedLaunches", "ZeroWidth", "call_key",
           "clear", "positions_key", "prepared", "rows_key", "slots_key", "stats", "tensor_key", "tokens_agree"]

#: Token counts an entry keeps per-count state for (its plans and grids, its ``[T, 0]`` outputs, the
#: AscendC tilings): a bound on each per-count dict, which starts over past it.
MAX_TOKEN_COUNTS = 4096

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


class PlannedLaunches:
    """What an entry of a Triton op keeps per token count: the plan's grid and bound kernel, each
    plan bound once (a few plans per entry, one grid per token count, :data:`MAX_TOKEN_COUNTS`
    of them). The op's class gives ``call.shape``, :meth:`_plan` and :meth:`_bind`."""

    def _init_launches(self) -> None:
        self._per_tokens: dict[int, tuple] = {}
        self._bound: dict = {}

    def _plan(self, num_tokens: int):
        """The launch plan for ``num_tokens`` tokens."""
        raise NotImplementedError

    def _bind(self, plan, grid: int, sources: tuple, num_tokens: int):
        """The bound kernel of ``plan`` on the first call's ``sources``."""
        raise NotImplementedError

    def bound_for(self, num_tokens: int, sources: tuple) -> tuple:
        """``(grid, bound kernel)`` for ``num_tokens`` (kept per token count; ``sources``: a call's
        tensors by index, the first call's are bound)."""
        shape = self.call.shape
        plan = self._plan(num_tokens)
        grid = plan.grid(shape, num_tokens)
        bound = self._bound.get(plan)
        if bound is None:
            bound = self._bound[plan] = self._bind(plan, grid, sources, num_tokens)
        if len(self._per_tokens) >= MAX_TOKEN_COUNTS:
            self._per_tokens.clear()
        self._per_tokens[num_tokens] = grid, bound
        return grid, bound


class ZeroWidth:
    """The ``[T, 0]`` outputs of one entry's calls: per token count, ``count`` distinct tensors
    made once and returned by every call of that count.

    A ``[T, 0]`` tensor holds no element, so sharing one between calls shares no data; distinct
    tensors keep the outputs of one call from aliasing each other (a functional custom op's
    rule). They are made outside inference mode, so they serve calls in and out of it alike. A
    caller that changes one's metadata in place (``resize_``, ``set_``) changes every call's.

    Parameters
    ----------
    dtype : torch.dtype
    device : torch.device
    count : int
        Tensors per token count.
    """

    def __init__(self, dtype: torch.dtype, device: torch.device, count: int):
        self._made: dict[int, tuple] = {}
        self._dtype, self._device, self._count = dtype, device, count

    def __call__(self, num_tokens: int) -> tuple:
        made = self._made.get(num_tokens)
        if made is None:
            with torch.inference_mode(False):
                made = tuple(torch.empty((num_tokens, 0), dtype=self._dtype, device=self._device)
                             for _ in range(self._count))
            if len(self._made) >= MAX_TOKEN_COUNTS:
                self._made.clear()
            self._made[num_tokens] = made
        return made


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
    of the tensor), whose sizes include the token count; every argument's type (``True`` is not
    ``1`` to the validator); lists and tuples as tuples (of :func:`tensor_key` for tensors);
    other objects (a process group, a callable) as themselves. A tensor that requires grad while
    grad mode is on makes the key ``None``: the validator refuses the call, every time.

    Which argument is keyed how depends only on the names and types of the arguments: that is
    worked out once per (names, types) (:class:`_KeyPlan`, which writes the key's function out
    for them), so a call costs the tensors' reads, not a Python pass over every argument.
    """
    values = tuple(args.values())
    kinds = tuple(map(type, values))
    signature = (tuple(args), kinds, id(token_keys))
    plan = _PLANS.get(signature)
    if plan is None or plan.token_keys is not token_keys:
        plan = _KeyPlan(signature, token_keys)
    if plan.tensors and torch.is_grad_enabled():
        for t in plan.tensors(values):
            if t.requires_grad:
                return None
    return plan.key(values)


#: The key plans by (argument names, argument types, token keys), bounded as a cache is.
_PLANS: dict = {}


def _gather(positions: list):
    """A function of a tuple that returns the tuple of its items at ``positions`` (C-level)."""
    if not positions:
        return lambda values: ()
    if len(positions) == 1:
        only = positions[0]
        return lambda values: (values[only],)
    return operator.itemgetter(*positions)


class _KeyPlan:
    """How :func:`call_key` keys the calls whose arguments have one set of names and types:
    which positions are plain tensors (:func:`tensor_key`), token-sized tensors (their
    ``token_keys`` function), sequences, and everything else (keyed as itself). The plan is the
    key's first item, so the names and types are in the key by identity."""

    __slots__ = ("key", "tensors", "token_keys")

    def __init__(self, signature: tuple, token_keys: dict):
        names, kinds, _ = signature
        plain, special, sequences, scalars, tensors = [], [], [], [], []
        for i, (name, kind) in enumerate(zip(names, kinds)):
            if issubclass(kind, torch.Tensor):
                tensors.append(i)
                fn = token_keys.get(name)
                if fn is None:
                    plain.append(i)
                else:
                    special.append((i, fn))
            elif kind is list or kind is tuple:
                sequences.append(i)
            else:
                scalars.append(i)
        self.token_keys = token_keys
        self.tensors = tensors and _gather(tensors)
        self.key = _key_function(self, plain, special, sequences, scalars)
        if len(_PLANS) >= MAX_ENTRIES:
            _PLANS.clear()
        _PLANS[signature] = self


def _key_function(plan: _KeyPlan, plain: list, special: list, sequences: list, scalars: list):
    """``key(values)``: the key of a call whose arguments (``values``, in order) have ``plan``'s
    names and types: ``(plan, scalars, plain tensors' keys, token-sized tensors' keys, sequences'
    keys)``, each a tuple; a plain tensor's key is :func:`tensor_key`'s, read inline. Written out
    once per plan, so that a call runs one function and no loop."""
    def tup(items):
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"

    tensor = "(v{0}.dtype, v{0}.device, v{0}.shape, v{0}.stride(), not v{0}.data_ptr() & 15)"
    lines = ["def key(values):"] + [f"    v{i} = values[{i}]" for i in plain]
    lines.append("    return (plan, " + ", ".join([
        tup([f"values[{i}]" for i in scalars]),
        tup([tensor.format(i) for i in plain]),
        tup([f"f{i}(values[{i}])" for i, _ in special]),
        tup([f"sequence(values[{i}])" for i in sequences])]) + ")")
    namespace = {"plan": plan, "sequence": _sequence_key, **{f"f{i}": fn for i, fn in special}}
    exec(compile("\n".join(lines), "<launch-cache key>", "exec"), namespace)
    return namespace["key"]


def _sequence_key(value) -> tuple:
    """A list or tuple argument (mRoPE's sections, a list through ``torch.ops``; MLA's (nope, rope)
    caches) as a tuple; the list and the tuple of one value are two keys (their types differ), each
    validated once."""
    return tuple(tensor_key(v) if isinstance(v, torch.Tensor) else (v, type(v)) for v in value)


def tensor_key(t):
    """What the validator reads of a tensor whose sizes do not depend on the token count
    (``None`` stays ``None``; anything else that is no tensor raises, and the op takes the full
    path). The pointer's 16-byte alignment is in the key: a compiled kernel is specialised on it.
    :func:`_key_function` reads the same fields inline (a test holds the two equal)."""
    if t is None:
        return None
    return t.dtype, t.device, t.shape, t.stride(), not t.data_ptr() & 15


def rows_key(t):
    """The key of a tensor whose first dim is the token count (qkv): all but that count, which is
    bucketed (0, 1, more: the validators' row-stride rules look at more than one row)."""
    shape = t.shape
    tokens = shape[0]
    return t.dtype, t.device, shape[1:], t.stride(), not t.data_ptr() & 15, tokens if tokens < 2 else 2


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
    of the key (the implementation requested, for the selector's cache). A call without a key
    (:func:`call_key` gives ``None`` or fails; an unhashable argument) validates every time.
    """
    try:
        key = call_key(args, token_keys)
        if key is not None:
            if extra is not None:
                key = (key, extra)
            entry = cache._entries.get(key)
            if entry is not None and entry.tokens_agree(args):
                cache.hits += 1
                return entry
    except (AttributeError, TypeError, RuntimeError):  # no tensor where one belongs, an unhashable argument
        key = None
    return cache.put(key, make(validate(**args), args))
