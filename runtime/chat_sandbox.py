"""The jinja2 environment a chat template renders in (runtime/chat.py), and the budget of one rendering.

The environment is transformers' (utils/chat_template_utils.py): an ImmutableSandboxedEnvironment with
trim_blocks and lstrip_blocks, the loopcontrols extension and a `{% generation %}` block (rendered as its body);
`raise_exception`, `strftime_now`, a `tojson` that does not escape HTML, a `dict` and a `namespace` that refuses
underscore names.

A template comes with a checkpoint folder, which is untrusted input: the sandbox keeps it from Python's internals,
and the budget keeps it from the host's time and memory. Each rendering gets `Limits`: wall seconds, steps (each
loop iteration, call and filter is one), the depth of nested calls (a recursive macro), and the characters of the
output and of any string or list it builds. A template past one of them stops at the next step with
ChatTemplateLimitError, in its own thread: no signal, no process-wide state (the budget is a ContextVar), so a
server's replica keeps answering other requests. Where each check sits:

    loops        every `for` iterates through a counter (the parsed template's For nodes are rewritten)
    calls        SandboxedEnvironment.call: a step, the depth, the time; a str / list method's arguments and result
    filters      each wrapped: a step, the time, the arguments (`center(10**9)`) and the result
    operators    `*`, `+`, `%` and `**` checked before they compute ('x' * 10**8, 10 ** 10**8)
    `~`          every concatenation's result measured (a string doubled thirty times stops at the first past)
    str.format   a width past the budget refused before the string is made
    output       counted as it streams (Template.generate)

Python's own RecursionError, and jinja2's OverflowError for a range past 100,000 items, are the same one-line
error."""

from __future__ import annotations

import json
import re
import time
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache

import zoo


class ChatTemplateError(zoo.ArgumentError):
    """A chat template missing, unreadable, or refusing the messages (its own raise_exception)."""


class ChatTemplateLimitError(ChatTemplateError):
    """A chat template past its rendering budget (time, steps, call depth or size): one line, never a hang."""


@dataclass(frozen=True)
class Limits:
    """One rendering's budget. Real templates take milliseconds, a few thousand steps and a depth under ten."""

    seconds: float = 2.0  # wall time; the steps below end a runaway loop first, the same on any host
    steps: int = 1_000_000  # loop iterations + calls + filters
    depth: int = 64  # nested calls: a recursive macro (Python's own limit is about 200 macro levels away)
    chars: int = 2_000_000  # the output, and any one string or list built on the way (plus the messages' size)


class _Budget:
    def __init__(self, limits: Limits, chars: int) -> None:
        self.limits, self.chars = limits, chars
        self.deadline = time.perf_counter() + limits.seconds
        self.steps = self.depth = 0

    def step(self) -> None:
        self.steps += 1
        if self.steps > self.limits.steps:
            raise ChatTemplateLimitError(
                f"the chat template took more than {self.limits.steps:,} steps (loop iterations, calls, filters); "
                "a template that loops without end is refused"
            )
        if self.steps % 256 == 0 and time.perf_counter() > self.deadline:
            raise ChatTemplateLimitError(f"the chat template ran past its {self.limits.seconds:g} s budget")

    def size(self, n: int, what: str) -> None:
        if n > self.chars:
            raise ChatTemplateLimitError(
                f"the chat template {what} of {n:,} characters or items, past its budget of {self.chars:,}"
            )


_BUDGET: ContextVar[_Budget | None] = ContextVar("chat_template_budget", default=None)


def _budget() -> _Budget:
    budget = _BUDGET.get()
    return budget if budget is not None else _Budget(Limits(), Limits().chars)  # outside render_limited: per check


def _weight(value, depth: int = 0) -> int:
    """The characters (a str) or items (a list, tuple or dict, with their strings') a value holds."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, (list, tuple, dict)) and depth < 3:
        items = value.items() if isinstance(value, dict) else ((v, "") for v in value)
        return len(value) + sum(_weight(k, depth + 1) + _weight(v, depth + 1) for k, v in items)
    return len(value) if isinstance(value, (list, tuple, dict, set)) else 0


def _biggest_int(values) -> int:
    found = [abs(v) for v in values if isinstance(v, int) and not isinstance(v, bool)]
    for v in values:
        if isinstance(v, (list, tuple)):
            found.append(_biggest_int(v))
        elif isinstance(v, dict):
            found.append(_biggest_int(list(v.values())))
    return max(found, default=0)


def _check_arguments(value, args, kwargs, what: str) -> None:
    """Refuse a call on a str or list whose result could be past the budget, before it is made: a width or
    count past it (center(10**9), zfill), or a string made of value x arguments (replace, join)."""
    budget = _budget()
    others = [*args, *kwargs.values()]
    budget.size(_biggest_int(others), f"{what} was given a number")
    biggest = max((_weight(v) for v in others), default=0)
    budget.size((_weight(value) + 1) * (1 + biggest) - 1, f"{what} could make a string")


_WIDTH = re.compile(r"\d+")


class _Loops:
    """Rewrites a parsed template so that each `for` iterates through the budget's counter and each `~` is
    measured (jinja2 compiles both to plain Python that no sandbox hook sees)."""

    def __call__(self, tree):
        from jinja2 import nodes

        def wrap(node, name):
            return nodes.Filter(node, name, [], [], None, None, lineno=node.lineno)

        def measured(child):
            return wrap(child, "attnzoo_measured") if isinstance(child, nodes.Concat) else child

        parents = [tree, *tree.find_all(nodes.Node)]  # listed first: the rewrite adds nodes
        for parent in parents:
            if isinstance(parent, nodes.For):
                parent.iter = wrap(parent.iter, "attnzoo_counted")
            for field in parent.fields:  # each Concat replaced where its parent holds it
                child = getattr(parent, field, None)
                if isinstance(child, list):
                    setattr(parent, field, [measured(c) for c in child])
                elif child is not None:
                    setattr(parent, field, measured(child))
        return tree


def _counted(iterable):
    budget = _budget()
    for item in iterable:
        budget.step()
        yield item


def _measured(text):
    _budget().size(_weight(text), "built a string")
    return text


def _limited(f, name):
    def call(value, *args, **kwargs):
        _budget().step()
        _check_arguments(value, args, kwargs, f"filter {name}")
        out = f(value, *args, **kwargs)
        _budget().size(_weight(out), f"filter {name} made a value")
        return out

    for attr in ("jinja_pass_arg",):  # the filters that take the context or environment first keep that mark
        if hasattr(f, attr):
            setattr(call, attr, getattr(f, attr))
    return call


@lru_cache(maxsize=16)
def compiled(source: str):
    """`source` compiled in the budgeted sandbox (cached by source; safe to share between threads)."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):  # transformers' AssistantTracker, without the tracking
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    class Budgeted(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "+", "%", "**"})

        def _parse(self, source, name, filename):  # jinja2's one parsing entry (Environment.parse, .compile)
            return _Loops()(super()._parse(source, name, filename))

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 - jinja2's own naming, kept
            budget = _budget()
            budget.step()
            owner = getattr(__obj, "__self__", None)
            if isinstance(owner, (str, list, tuple, dict)):
                _check_arguments(owner, args, kwargs, f"{type(owner).__name__}.{getattr(__obj, '__name__', '')}")
            budget.depth += 1
            try:
                if budget.depth > budget.limits.depth:
                    raise ChatTemplateLimitError(
                        f"the chat template nested calls deeper than {budget.limits.depth} (a recursive macro?)"
                    )
                out = super().call(__context, __obj, *args, **kwargs)
            finally:
                budget.depth -= 1
            budget.size(_weight(out), "made a value")
            return out

        def call_binop(self, context, operator, left, right):
            budget = _budget()
            budget.step()
            if operator == "*":
                for seq, n in ((left, right), (right, left)):
                    if isinstance(seq, (str, list, tuple)) and isinstance(n, int):
                        budget.size(_weight(seq) * max(n, 0), f"repeated a {type(seq).__name__} into one")
            elif operator == "+":
                budget.size(_weight(left) + _weight(right), "joined a value")
            elif operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1:
                budget.size(abs(left).bit_length() * max(right, 0) // 3, "raised a number to a power with digits")
            elif operator == "%" and isinstance(left, str):
                args = right if isinstance(right, (tuple, dict)) else (right,)
                widths = [int(w) for w in _WIDTH.findall(left)]
                _check_arguments(left, (*widths, *(args.values() if isinstance(args, dict) else args)), {}, "%")
            return super().call_binop(context, operator, left, right)

        def wrap_str_format(self, value):  # str.format and format_map, as the sandbox hands them out
            sandboxed = super().wrap_str_format(value)
            if sandboxed is None:
                return None
            fmt = value.__self__

            def checked(*args, **kwargs):
                widths = [int(w) for w in _WIDTH.findall(fmt)]
                _check_arguments(fmt, (*widths, *args), kwargs, f"str.{value.__name__}")
                return sandboxed(*args, **kwargs)

            return checked

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    class TemplateDict:
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            TemplateNamespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"a chat template cannot store {name!r} on a namespace")

    env = Budgeted(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.filters = {name: _limited(f, name) for name, f in env.filters.items()}
    env.filters.update(attnzoo_counted=_counted, attnzoo_measured=_measured)
    env.globals.update(
        raise_exception=raise_exception, strftime_now=strftime_now, dict=TemplateDict(), namespace=TemplateNamespace
    )
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise ChatTemplateError(f"the chat template does not parse: {e.message} (line {e.lineno})") from None


def render_limited(template, limits: Limits, extra_chars: int, **variables) -> str:
    """`template`.render(**variables) within `limits` (chars: the limit plus `extra_chars`, the messages' size):
    streamed and counted; past a limit, or at Python's recursion limit or jinja2's range cap, a
    ChatTemplateLimitError."""
    budget = _Budget(limits, limits.chars + 8 * extra_chars)  # a message may be replaced, indented, escaped
    token = _BUDGET.set(budget)
    parts, made = [], 0
    try:
        for part in template.generate(**variables):
            made += len(part)
            budget.size(made, "wrote an output")
            budget.step()
            parts.append(part)
    except RecursionError:
        raise ChatTemplateLimitError("the chat template recursed past Python's limit (a recursive macro?)") from None
    except OverflowError as e:  # jinja2's range: "Range too big. The sandbox blocks ranges larger than MAX_RANGE"
        raise ChatTemplateLimitError(f"the chat template asked for too much: {e}") from None
    except MemoryError:
        raise ChatTemplateLimitError("the chat template ran out of memory") from None
    finally:
        _BUDGET.reset(token)
    return "".join(parts)


__all__ = ["ChatTemplateError", "ChatTemplateLimitError", "Limits", "compiled", "render_limited"]
