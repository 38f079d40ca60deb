"""Named locations inside a block, and hooks at them (TransformerLens's hook points, per einops step).

    q        (b h t dk)   after the modifiers (QK-norm, rotary): what the scores read
    k        (b g s dk)   the same; in a decode step, over the whole cache (a static cache: its capacity)
    v        (b g s dv)
    scores   (b h t s)    Q K^T * scale, the score map (softcap), bias and mask (-inf); before the softmax
    pattern  (b h t s)    A = softmax(scores); rows sum to 1 (a row with no allowed key: 0; a sink takes a share)
    z        (b h t dv)   A V, after head_mask: what W_O reads
    result   (b t h c)    head r's own share of the output, z_r W_O^(r); sum over h + W_O's bias = y
    out      (b t c)      y

    y, cache = block.run_with_cache(x)                    # cache["pattern"] (b h t s), ...
    y = block.run_with_hooks(x, hooks={"z": fn})           # fn(tensor, name) -> replacement or None
    with zoo.hooks.hooked(block, {"q": fn}):               # any call: forward, decode, a static cache
        y = block.decode(x, cache=static)

The plain forward pays one `is None` test per location: a block holds `hook = None` unless a run
installs one. scores and pattern exist on the explicit path only, so a run that reads or hooks
them takes it (the fused kernel otherwise); result is formed only when read or hooked.

A model names its blocks (`HookedModel.hook_blocks`: {"L0": block, ...}) and its residual stream
points (`model.resid(name, x)` in its forward): "L1.pattern", "L0.resid_pre", "X0.z".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager

from einops import einsum, rearrange
from torch import Tensor, nn

from .errors import ArgumentError, InputError, InputTypeError

LOCATIONS = ("q", "k", "v", "scores", "pattern", "z", "result", "out")
EXPLICIT = frozenset({"scores", "pattern"})
# the head axis of each location (k and v: the kv-head axis g); None: no head axis
HEAD_AXIS = {"q": 1, "k": 1, "v": 1, "scores": 1, "pattern": 1, "z": 1, "result": 2, "out": None}
RESID = ("resid_pre", "resid_post")

HookFn = Callable[[Tensor, str], "Tensor | None"]


class HookRun:
    """The hooks and the cache of one run on one block (or one model's residual stream).

    fns: {location: fn}; cache: a dict to store the named tensors into (None: no cache), `names`
    the locations it stores (None: all); prefix: what the names are called by ("L1.").
    """

    __slots__ = ("fns", "cache", "names", "prefix", "explicit", "_wanted")

    def __init__(
        self,
        fns: Mapping[str, HookFn] | None = None,
        cache: dict | None = None,
        names: Iterable[str] | None = None,
        prefix: str = "",
        locations: Iterable[str] = LOCATIONS,
    ) -> None:
        self.fns = dict(fns or {})
        self.cache = cache
        self.names = None if names is None else frozenset(names)
        self.prefix = prefix
        wanted = set(self.fns)
        if cache is not None:
            wanted |= set(locations) if self.names is None else self.names
        self._wanted = frozenset(wanted)
        self.explicit = bool(self._wanted & EXPLICIT)

    def wants(self, loc: str) -> bool:
        return loc in self._wanted

    def __call__(self, loc: str, tensor: Tensor) -> Tensor:
        if loc not in self._wanted:
            return tensor
        name = self.prefix + loc
        fn = self.fns.get(loc)
        if fn is not None:
            new = fn(tensor, name)
            if new is not None:
                if not isinstance(new, Tensor) or new.shape != tensor.shape:
                    got = tuple(new.shape) if isinstance(new, Tensor) else type(new).__name__
                    raise InputError(
                        f"the hook at {name!r} returned {got}; return a tensor of shape {tuple(tensor.shape)} or None"
                    )
                if new.dtype != tensor.dtype or new.device != tensor.device:
                    raise InputError(
                        f"the hook at {name!r} returned a {new.dtype} tensor on {new.device}; return one of the "
                        f"dtype and device it was given ({tensor.dtype} on {tensor.device}: .to(t)) or None"
                    )
                tensor = new
        if self.cache is not None and (self.names is None or loc in self.names):
            self.cache[name] = tensor
        return tensor


def check_locations(names: Iterable[str], known: Iterable[str] = LOCATIONS, what: str = "a block") -> list[str]:
    known = tuple(known)
    out = list(names)
    for n in out:
        if n not in known:
            raise ArgumentError(f"location {n!r} is not one of {what}'s: {', '.join(known)}")
    return out


def _check_hooks(hooks: object) -> dict[str, HookFn]:
    if not isinstance(hooks, Mapping):
        raise InputTypeError(f"hooks must be a dict {{location: fn}}, got {type(hooks).__name__}")
    for name, fn in hooks.items():
        if not callable(fn):
            raise InputTypeError(f"the hook at {name!r} is {type(fn).__name__}, not a function fn(tensor, name)")
    return dict(hooks)


def head_results(z: Tensor, out_proj: nn.Linear) -> Tensor:
    """result (b t h c): head r's share z_r W_O^(r) of the output, without W_O's bias."""
    w = rearrange(out_proj.weight, "c (h d) -> h d c", h=z.shape[1])
    return einsum(z, w.to(z.dtype), "b h t d, h d c -> b t h c")


def output(z: Tensor, out_proj: nn.Linear, hook: HookRun | None, merge: str) -> Tensor:
    """y from z (b h t dv): W_O over the merged heads, or (when `result` is read or hooked) the sum
    of the heads' results plus W_O's bias."""
    if hook is None:
        return out_proj(rearrange(z, merge))
    z = hook("z", z)
    if hook.wants("result"):
        result = hook("result", head_results(z, out_proj))
        y = result.sum(2)
        if out_proj.bias is not None:
            y = y + out_proj.bias.to(y.dtype)
    else:
        y = out_proj(rearrange(z, merge))
    return hook("out", y)


@contextmanager
def hooked(module: nn.Module, run: HookRun | Mapping[str, HookFn]) -> Iterator[HookRun]:
    """Install a HookRun (or {location: fn}) on a block for the duration of the `with`."""
    if not isinstance(run, HookRun):
        run = HookRun(check_locations_dict(run))
    if getattr(module, "hook", None) is not None:
        raise ArgumentError(f"{type(module).__name__} already runs with hooks; runs do not nest")
    module.hook = run
    try:
        yield run
    finally:
        module.hook = None


def check_locations_dict(hooks: object) -> dict[str, HookFn]:
    hooks = _check_hooks(hooks)
    check_locations(hooks)
    return hooks


class HookPoints:
    """run_with_cache / run_with_hooks for a block whose forward and decode call `self.hook`."""

    hook: HookRun | None = None

    def run_with_hooks(self, *args, hooks: Mapping[str, HookFn], decode: bool = False, **kwargs):
        """self(*args, **kwargs) (or self.decode with decode=True), with fn(tensor, name) called at
        each location of `hooks`; its return value (a tensor of the same shape) replaces it, None keeps it."""
        with hooked(self, HookRun(check_locations_dict(hooks))):
            return self.decode(*args, **kwargs) if decode else self(*args, **kwargs)

    def run_with_cache(
        self, *args, names: Iterable[str] | None = None, hooks: Mapping[str, HookFn] | None = None, decode=False, **kw
    ):
        """(what the call returns, {location: tensor}) for `names` (default: every location)."""
        cache: dict[str, Tensor] = {}
        names = None if names is None else check_locations([names] if isinstance(names, str) else names)
        fns = check_locations_dict(hooks or {})
        with hooked(self, HookRun(fns, cache, names)):
            out = self.decode(*args, **kw) if decode else self(*args, **kw)
        return out, cache


# -- models ------------------------------------------------------------------------------------------


def layer_blocks(layers: Iterable[nn.Module], prefix: str = "L", attr: str | None = "attn") -> dict[str, nn.Module]:
    """{"L0": block, ...}: the zoo blocks of a model's layers (layer.attn; attr=None: the layers
    themselves are the blocks), for a model's `hook_blocks`."""
    return {f"{prefix}{i}": (layer if attr is None else getattr(layer, attr)) for i, layer in enumerate(layers)}


class HookedModel:
    """run_with_cache / run_with_hooks for a model of zoo blocks, by names "L{layer}.{location}".

    A model gives `hook_blocks()` -> {prefix: block} (e.g. layer_blocks(self.layers)) and, for the
    residual stream, calls `x = self.resid("L{i}.resid_pre", x)` in its forward (free without hooks).
    """

    resid_hook: HookRun | None = None

    def hook_blocks(self) -> dict[str, nn.Module]:
        raise ArgumentError(f"{type(self).__name__} names no blocks: define hook_blocks() -> {{'L0': block, ...}}")

    def resid_names(self) -> list[str]:
        """The residual-stream points this model's forward calls `resid` at."""
        return [f"{p}.{r}" for p in self.hook_blocks() for r in RESID if p.startswith("L")]

    def hook_names(self) -> list[str]:
        """Every name this model offers, blocks' locations first, then the residual stream."""
        return [f"{p}.{loc}" for p in self.hook_blocks() for loc in LOCATIONS] + self.resid_names()

    def resid(self, name: str, x: Tensor) -> Tensor:
        run = self.resid_hook
        return x if run is None else run(name, x)

    @contextmanager
    def hooks(self, hooks: Mapping[str, HookFn] | None = None, cache: dict | None = None, names=None):
        """Install hooks {name: fn} (and a cache of `names`, None: all) for the `with`; yields the cache."""
        hooks = _check_hooks(hooks or {})
        blocks = self.hook_blocks()
        known = set(self.hook_names())
        wanted = None if names is None else ([names] if isinstance(names, str) else list(names))
        for n in [*hooks, *(wanted or [])]:
            if n not in known:
                raise ArgumentError(
                    f"{n!r} is not a location of this model: names are PREFIX.LOCATION with a prefix in "
                    f"{', '.join(blocks)} and a location in {', '.join(LOCATIONS + RESID)}"
                )
        runs: list[tuple[nn.Module, str, HookRun]] = []
        for prefix, block in blocks.items():
            p = prefix + "."
            fns = {k[len(p) :]: f for k, f in hooks.items() if k.startswith(p)}
            sub = None if wanted is None else [n[len(p) :] for n in wanted if n.startswith(p)]
            sub = [n for n in sub if n in LOCATIONS] if sub is not None else None
            fns = {k: f for k, f in fns.items() if k in LOCATIONS}
            if fns or cache is not None and (sub is None or sub):
                runs.append((block, prefix, HookRun(fns, cache, sub, p)))
        rnames = set(self.resid_names())
        rfns = {k: f for k, f in hooks.items() if k in rnames}
        rsub = None if wanted is None else [n for n in wanted if n in rnames]
        resid = None
        if rfns or cache is not None and (rsub is None or rsub):
            resid = HookRun(rfns, cache, rsub, "", locations=rnames)
        done: list[nn.Module] = []
        try:
            for block, _, run in runs:
                if block.hook is not None:
                    raise ArgumentError("this model already runs with hooks; runs do not nest")
                block.hook = run
                done.append(block)
            self.resid_hook = resid
            yield cache
        finally:
            for block in done:
                block.hook = None
            self.resid_hook = None

    def run_with_hooks(self, *args, hooks: Mapping[str, HookFn], **kwargs):
        """self(*args, **kwargs) with fn(tensor, name) at each named location of `hooks`."""
        with self.hooks(hooks):
            return self(*args, **kwargs)

    def run_with_cache(self, *args, names=None, hooks: Mapping[str, HookFn] | None = None, **kwargs):
        """(self(*args, **kwargs), {name: tensor}) for `names` (default: every name), under `hooks`."""
        cache: dict[str, Tensor] = {}
        with self.hooks(hooks, cache, names):
            out = self(*args, **kwargs)
        return out, cache
