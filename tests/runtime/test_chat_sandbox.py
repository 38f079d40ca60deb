"""A chat template's rendering budget (runtime/chat_sandbox.py): hostile templates (loops without end, huge
strings and numbers, recursion) each end with one ChatTemplateLimitError, by count rather than by the clock, so
the same on a loaded host; real templates render as before (tests/runtime/test_chat.py).

The hostile cases run in a child process under a timeout: a limit that does not hold fails the test instead of
hanging it or eating the host's memory."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading

import pytest

from helpers import REPO
from runtime.chat import ChatTemplate, ChatTemplateLimitError, Limits

HOSTILE = {
    "nested range loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "nested loops over a string": "{% set s = 'x' * 50000 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}",
    "a string repeated": "{{ 'x' * 10**8 }}",
    "a list repeated": "{{ ([1] * 10**8) | length }}",
    "a huge power": "{{ 10 ** 100000000 }}",
    "a recursive macro": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "a range past jinja2's cap": "{% for i in range(10**6) %}{% endfor %}",
    "a string doubled by ~": "{% set s = 'x' * 1000 %}" + "{% set s = s ~ s %}" * 30 + "{{ s | length }}",
    "a namespace doubled": "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
    "{% endfor %}",
    "a format width": "{{ '{:>100000000}'.format(1) }}",
    "a % width": "{{ '%100000000d' % 1 }}",
    "a filter's width": "{{ 'x' | center(10**9) }}",
    "a method's width": "{{ 'x'.ljust(10**9) }}",
    "a replace that multiplies": "{% set s = 'x' * 10000 %}{{ s.replace('x', s) }}",
    "a join that multiplies": "{% set s = 'x' * 10000 %}{{ s.join(s) }}",
    "a long output": "{% for i in range(90000) %}{{ 'y' * 100 }}{% endfor %}",
    "strings added": "{% set s = 'x' * 1500000 %}{{ (s + s + s) | length }}",
}

CHILD = textwrap.dedent(
    """
    import json, sys
    from runtime.chat import ChatTemplate

    out = {}
    for name, source in json.loads(sys.argv[1]).items():
        try:
            ChatTemplate(source).render([{"role": "user", "content": "x"}])
            out[name] = "rendered"
        except Exception as e:
            out[name] = f"{type(e).__name__}: {e}"
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def hostile():
    p = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(HOSTILE)],
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": ""},
        capture_output=True,
        text=True,
        timeout=240,  # every case ends in well under a second; a limit that does not hold ends here instead
    )
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout)


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_template_ends_with_one_limit_error(hostile, case):
    said = hostile[case]
    assert said.startswith("ChatTemplateLimitError: the chat template "), said
    assert "\n" not in said


def test_the_steps_count_every_loop_iteration_and_call():
    messages = [{"role": "user", "content": str(i)} for i in range(50)]
    loop = ChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}", limits=Limits(steps=40))
    with pytest.raises(ChatTemplateLimitError, match="more than 40 steps"):
        loop.render(messages)
    assert ChatTemplate(loop.source, limits=Limits(steps=200)).render(messages) == "".join(map(str, range(50)))
    calls = ChatTemplate("{{ messages[0].content.upper() * 3 }}", limits=Limits(steps=1))
    with pytest.raises(ChatTemplateLimitError, match="more than 1 steps"):
        calls.render(messages)


def test_the_size_budget_grows_with_the_messages():
    """A long conversation is no attack: the budget is the limit plus a multiple of the messages' size."""
    long = [{"role": "user", "content": "z" * 50_000}]
    template = ChatTemplate("{% for m in messages %}{{ m.content | replace('z', 'zz') }}{% endfor %}")
    assert len(ChatTemplate(template.source, limits=Limits(chars=1000)).render(long)) == 100_000


def test_each_rendering_has_its_own_budget_in_its_own_thread():
    """Two threads render at once, one past its budget, one within: each gets its own answer; and a rendering
    after a refused one starts from a fresh budget."""
    spin = ChatTemplate("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}")
    fine = ChatTemplate("{% for m in messages %}[{{ m.content }}]{% endfor %}", limits=Limits(steps=100))
    got = {}

    def render(name, template):
        try:
            got[name] = template.render([{"role": "user", "content": "a"}] * 20)
        except ChatTemplateLimitError as e:
            got[name] = type(e).__name__

    threads = [threading.Thread(target=render, args=(n, t)) for n, t in (("spin", spin), ("fine", fine))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == {"spin": "ChatTemplateLimitError", "fine": "[a]" * 20}
    assert fine.render([{"role": "user", "content": "b"}] * 20) == "[b]" * 20
