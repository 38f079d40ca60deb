"""Chat templates (runtime/chat.py) render as transformers' apply_chat_template does, on real public
templates (tests/runtime/chat_templates/README.md names their sources) and one of ours, and refuse
what transformers' sandbox refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import PreTrainedTokenizerFast

from helpers import REPO
from runtime.chat import ChatTemplate, ChatTemplateError, read_messages
from runtime.stopping import Codec

TEMPLATES = sorted((Path(__file__).parent / "chat_templates").glob("*.jinja"))
TOKENIZER = REPO / "models" / "tiny-stdlib-llama" / "tokenizer.json"
SPECIAL = {"bos_token": "<s>", "eos_token": "</s>"}
CHATS = [
    [{"role": "user", "content": "Hello, how are you?"}],
    [
        {"role": "system", "content": "You are terse. Ünïcode ✓"},
        {"role": "user", "content": "Name a prime."},
        {"role": "assistant", "content": "  Seven.  "},
        {"role": "user", "content": "Another?"},
    ],
]


@pytest.fixture(scope="module")
def hf_tokenizer():
    return PreTrainedTokenizerFast(tokenizer_file=str(TOKENIZER), **SPECIAL)


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.stem)
@pytest.mark.parametrize("chat", range(len(CHATS)))
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_a_template_renders_and_encodes_as_apply_chat_template(path, chat, add_generation_prompt, hf_tokenizer):
    source = path.read_text()
    ours = ChatTemplate(source, SPECIAL).render(CHATS[chat], add_generation_prompt=add_generation_prompt)
    kw = {"chat_template": source, "add_generation_prompt": add_generation_prompt}
    assert ours == hf_tokenizer.apply_chat_template(CHATS[chat], tokenize=False, **kw)
    theirs = hf_tokenizer.apply_chat_template(CHATS[chat], tokenize=True, **kw)
    theirs = theirs["input_ids"] if isinstance(theirs, dict) or hasattr(theirs, "keys") else theirs
    assert Codec(str(TOKENIZER)).encode(ours) == list(theirs)


def test_a_folder_gives_its_jinja_file_first_then_its_tokenizer_config(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": "config {{ eos_token }}", "eos_token": {"content": "</s>", "special": True}})
    )
    assert ChatTemplate.from_folder(tmp_path).render([]) == "config </s>"
    (tmp_path / "chat_template.jinja").write_text("file {{ bos_token | default('none') }}")
    assert ChatTemplate.from_folder(tmp_path).render([]) == "file none"
    named = tmp_path / "named"
    named.mkdir()
    (named / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": [{"name": "tool_use", "template": "t"}, {"name": "default", "template": "d"}]})
    )
    assert ChatTemplate.from_folder(named).render([]) == "d"


@pytest.mark.parametrize(
    ("source", "match"),
    [
        ("{{ raise_exception('roles must alternate') }}", "roles must alternate"),
        ("{{ ''.__class__.__mro__ }}", "unsafe|access"),  # the sandbox: no Python internals
        ("{% set ns = namespace(_x=1) %}", "_x"),
        ("{% for m in messages %}", "does not parse"),
    ],
)
def test_the_sandbox_and_the_templates_own_refusals_are_one_line_errors(source, match):
    with pytest.raises(ChatTemplateError, match=match):
        ChatTemplate(source).render([{"role": "user", "content": "x"}])


def test_a_folder_without_a_template_and_bad_messages_are_refused(tmp_path):
    with pytest.raises(ChatTemplateError, match="no chat template"):
        ChatTemplate.from_folder(tmp_path)
    with pytest.raises(ChatTemplateError, match="list of messages"):
        read_messages('{"role": "user"}')
    assert read_messages('{"messages": [{"role": "user", "content": "a"}]}')[0]["content"] == "a"
