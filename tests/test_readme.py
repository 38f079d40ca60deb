"""The documentation's code runs: README.md and every page under docs/. Each page's Python blocks run
in order, in one namespace and one temporary folder of their own (as a reader would paste a page
into one session), every `attnzoo ...` command line of its shell blocks parses, and every relative
link points at a file (and a heading) that is there. A documented call that goes missing
(`analysis.head_scores` once did) fails here, naming the page."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from cli.main import build_parser
from helpers import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
# Blocks that talk to a running server: their imports run, their calls need `attnzoo serve`
# (tests/serve/test_serve.py drives the same Client against a real one, tests/serve/test_openai.py the openai one).
NEEDS_SERVER = re.compile(r"Client\(|OpenAI\(")
FENCE = re.compile(r"```(\w*)\n(.*?)```", re.S)


def _name(page: Path) -> str:
    return page.relative_to(REPO).as_posix()


def _blocks(page: Path, lang: str) -> list[tuple[int, str]]:
    """(line, code) of each fenced block of `lang` in the page."""
    text = page.read_text()
    return [(text[: m.start()].count("\n") + 1, m.group(2)) for m in FENCE.finditer(text) if m.group(1) == lang]


PYTHON_PAGES = [page for page in PAGES if _blocks(page, "python")]


def test_the_pages_hold_the_python_blocks():
    assert sum(len(_blocks(page, "python")) for page in PAGES) >= 5
    assert REPO / "README.md" in PYTHON_PAGES


@pytest.mark.parametrize("page", PYTHON_PAGES, ids=_name)
def test_every_python_block_runs_in_order(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the blocks write out.onnx, dec.onnx, q.onnx, ...
    namespace: dict = {}
    ran = 0
    for line, code in _blocks(page, "python"):
        if NEEDS_SERVER.search(code):
            code = "\n".join(ln for ln in code.splitlines() if ln.startswith(("import ", "from ")))
        try:
            exec(compile(code, f"{_name(page)}:{line}", "exec"), namespace)
        except Exception as e:  # noqa: BLE001 - name the block
            pytest.fail(f"{_name(page)} block at line {line} fails: {type(e).__name__}: {e}")
        ran += 1
    assert ran >= 1


OPERATORS = {"&&", "||", "|", ";", "&"}


def _command_lines(page: Path) -> list[list[str]]:
    """Each `attnzoo` command of the page's shell blocks, as its argv (quotes and comments as the shell reads them)."""
    found = []
    for _, code in _blocks(page, "bash") + _blocks(page, "console"):
        for raw in code.replace("\\\n", " ").splitlines():
            raw = re.sub(r"\$\([^)]*\)", "X", raw.strip().removeprefix("$ "))
            words, command = shlex.split(raw, comments=True), []
            for w in [*words, ";"]:
                if w in OPERATORS:
                    if command[:1] == ["attnzoo"]:
                        found.append(command)
                    command = []
                else:
                    command.append(w)
    return found


COMMANDS = [(_name(page), argv) for page in PAGES for argv in _command_lines(page)]


@pytest.mark.parametrize(("page", "argv"), COMMANDS, ids=[f"{page}: {' '.join(argv)}" for page, argv in COMMANDS])
def test_every_attnzoo_command_line_parses(page, argv):
    try:
        build_parser().parse_args(argv[1:])
    except SystemExit as e:
        pytest.fail(f"{page}: `{' '.join(argv)}` does not parse (exit {e.code})")


def _prose(text: str) -> str:
    """The page without its fenced blocks and inline code, where `#` and `](` are code, not Markdown."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))


def _anchors(page: Path) -> set[str]:
    """GitHub's anchor of each heading: lower case, punctuation dropped, spaces as hyphens."""
    found: set[str] = set()
    for heading in re.findall(r"^#+ (.+)$", FENCE.sub("", page.read_text()), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        n, anchor = 0, slug
        while anchor in found:
            n += 1
            anchor = f"{slug}-{n}"
        found.add(anchor)
    return found


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_relative_link_resolves(page):
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", _prose(page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue  # http(s) and mailto are not checked here
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target} (no file {linked})")
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(f"{target} (no heading #{anchor} in {_name(linked)})")
    assert not broken, f"{_name(page)} links to what is not there: {'; '.join(broken)}"


def test_families_table_is_the_commands():
    from cli.cmd_zoo import families_markdown

    page = (REPO / "docs" / "transformers.md").read_text()
    assert families_markdown() in page, "docs/transformers.md's families table differs from `attnzoo families`"


def test_every_docs_page_is_in_the_readmes_list():
    """docs/seq2seq.md was linked from nowhere: each page is an entry of README's "The rest, in docs/"."""
    section = (REPO / "README.md").read_text().split("## The rest, in docs/")[1].split("\n## ")[0]
    missing = [p.name for p in sorted((REPO / "docs").glob("*.md")) if f"](docs/{p.name})" not in section]
    assert missing == []


def test_the_readmes_generate_usage_names_every_flag():
    """The command-line block's `attnzoo generate` lines name every flag the command takes."""
    text = (REPO / "README.md").read_text()
    start = text.index("\nattnzoo generate FOLDER|MODEL.onnx")
    usage = text[start : text.index("\nattnzoo ", start + 1)]
    parser = build_parser()
    generate = next(a for a in parser._subparsers._group_actions[0].choices.items() if a[0] == "generate")[1]
    flags = [s for a in generate._actions for s in a.option_strings if s not in ("-h", "--help")]
    assert [f for f in flags if f not in usage] == []
