"""Where `attnzoo generate`'s prompt comes from and what is said when it cannot be read: --prompt, --prompt-file, a
piped stdin; a Hugging Face Hub id (not fetched); a folder of the wrong kind for the command (an encoder to
`generate`, a decoder to `embed`); a chat template past its budget. Each refusal is one line."""

from __future__ import annotations

import io
import json

import pytest

from cli.main import main
from helpers import one_line_error

RUN = ["--max-new-tokens", "4", "--no-stream"]


@pytest.fixture
def tiny(cached_tiny, monkeypatch):
    folder, cache, _ = cached_tiny
    monkeypatch.setenv("ATTNZOO_CACHE", str(cache))
    return folder


def _text_line(capsys, argv, stdin=None, monkeypatch=None):
    if stdin is not None:
        monkeypatch.setattr("sys.stdin", stdin)
    assert main(argv) == 0
    return next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("text "))


def test_the_prompt_from_a_file_or_a_piped_stdin_is_the_prompts_text(tiny, tmp_path, capsys, monkeypatch):
    given = _text_line(capsys, ["generate", str(tiny), "--prompt", "def main(", *RUN])
    assert given.startswith("text   'def main(' -> ")
    (tmp_path / "p.txt").write_text("def main(\n")  # the newline an editor adds is dropped
    assert _text_line(capsys, ["generate", str(tiny), "--prompt-file", str(tmp_path / "p.txt"), *RUN]) == given
    piped = io.StringIO("def main(\n")  # echo 'def main(' | attnzoo generate FOLDER
    assert _text_line(capsys, ["generate", str(tiny), *RUN], piped, monkeypatch) == given


def test_a_terminal_is_not_read_for_the_prompt(tiny, capsys, monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr("sys.stdin", Terminal("def main(\n"))
    assert "give the prompt: --prompt TEXT" in one_line_error(capsys, ["generate", str(tiny), *RUN])


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--prompt-file", "{tmp}/none.txt"], "--prompt-file {tmp}/none.txt: No such file"),
        (["--prompt-file", "{tmp}/p.txt", "--prompt", "x"], "leave out --prompt"),
        (["--prompt-file", "{tmp}/bad.txt"], "is not UTF-8 text"),
    ],
)
def test_a_prompt_file_that_cannot_be_the_prompt_is_one_line(tiny, tmp_path, capsys, argv, words):
    (tmp_path / "p.txt").write_text("x")
    (tmp_path / "bad.txt").write_bytes(b"\xff\xfe\x00")
    argv = [a.format(tmp=tmp_path) for a in argv]
    assert words.format(tmp=tmp_path) in one_line_error(capsys, ["generate", str(tiny), *argv, *RUN])


@pytest.mark.parametrize("command", ["generate", "embed"])
def test_a_hub_id_is_not_fetched_and_the_line_says_how_to_get_a_folder(command, capsys):
    flag = "--prompt" if command == "generate" else "--text"
    line = one_line_error(capsys, [command, "Qwen/Qwen3-0.6B", flag, "hi"])
    assert "does not fetch Hub ids" in line and "huggingface-cli download Qwen/Qwen3-0.6B --local-dir DIR" in line
    assert "save_pretrained(DIR)" in line
    assert "no such folder or file" in one_line_error(capsys, ["generate", "models/no-such-folder", "--prompt", "h"])


HOSTILE = {
    "loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "recursion": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "range": "{% for i in range(10**6) %}{% endfor %}",
    "size": "{{ 'x' * 10**8 }}",
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_chat_template_past_its_budget_is_one_line(tiny, tmp_path, capsys, case):
    import shutil

    folder = tmp_path / "tiny"
    shutil.copytree(tiny, folder)
    (folder / "chat_template.jinja").write_text(HOSTILE[case])
    line = one_line_error(capsys, ["generate", str(folder), "--chat", "--prompt", "hi", *RUN])
    assert line.startswith("attnzoo generate: error: the chat template "), line


def test_each_command_points_at_the_one_that_reads_the_folder(tiny, tmp_path, capsys):
    encoder = tmp_path / "bert"
    encoder.mkdir()
    (encoder / "config.json").write_text(json.dumps({"model_type": "bert"}))
    line = one_line_error(capsys, ["generate", str(encoder), "--prompt", "hi"])
    assert "holds an encoder (model_type='bert')" in line and f"`attnzoo embed {encoder} --text TEXT`" in line
    line = one_line_error(capsys, ["embed", str(tiny), "--text", "hi"])
    assert "holds a decoder (model_type='llama')" in line and f"`attnzoo generate {tiny} --prompt TEXT`" in line
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "no-such-family"}))
    line = one_line_error(capsys, ["generate", str(other), "--prompt", "hi"])
    assert "reads decoders (llama, " in line and "encoder-decoders (t5, " in line and "`attnzoo embed`" in line
