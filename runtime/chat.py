"""Chat templates (no torch): a checkpoint's `chat_template` rendered as transformers' `apply_chat_template`
renders it (utils/chat_template_utils.py), in the same sandbox: a template is data from a download, not code.

    template = ChatTemplate.from_folder("ckpt/")        # chat_template.jinja, else tokenizer_config.json's
    text = template.render([{"role": "user", "content": "Hi"}])     # add_generation_prompt=True

The environment is transformers' (runtime/chat_sandbox.py), with a budget per rendering (time, steps, call
depth, size: Limits) that a template from an untrusted folder cannot run past: ChatTemplateLimitError, one line.
The special tokens of tokenizer_config.json
(bos_token, eos_token, ...) are the template's variables, as transformers passes them. The rendered text
is then encoded without special tokens (transformers' apply_chat_template(tokenize=True) does the same).
"""

from __future__ import annotations

import json
from pathlib import Path

from .chat_sandbox import ChatTemplateError, ChatTemplateLimitError, Limits, compiled, render_limited

SPECIAL = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def _plain(value):
    """JSON types only reach the template (transformers' _plain_template_data)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    for kind in (str, bool, int, float):
        if isinstance(value, kind):
            return kind(value)
    raise ChatTemplateError(f"a message holds a {type(value).__name__}; give JSON values (str, numbers, lists, dicts)")


class ChatTemplate:
    """A chat template and the special tokens it may read."""

    def __init__(self, source: str, special: dict[str, str] | None = None, limits: Limits | None = None) -> None:
        if not isinstance(source, str) or not source:
            raise ChatTemplateError(f"chat template {source!r} is not a template (a non-empty str)")
        self.source = source
        self.special = dict(special or {})
        self.limits = limits or Limits()  # each rendering's budget (runtime/chat_sandbox.py)

    @classmethod
    def from_folder(cls, folder, stem: str = "") -> ChatTemplate:
        """From `folder`'s chat_template.jinja, else its tokenizer_config.json's chat_template (the "default"
        one of a list); `stem` prefixes the file names (an export's own: MODEL.tokenizer_config.json)."""
        folder = Path(folder)
        config_path = folder / f"{stem}tokenizer_config.json"
        config = {}
        if config_path.is_file():
            try:
                config = json.loads(config_path.read_text())
            except (ValueError, UnicodeDecodeError) as e:
                raise ChatTemplateError(f"{config_path} is not JSON ({type(e).__name__})") from None
        special = {}
        for name in SPECIAL:
            value = config.get(name)
            value = value.get("content") if isinstance(value, dict) else value
            if isinstance(value, str):
                special[name] = value
        jinja = folder / f"{stem}chat_template.jinja"
        source = jinja.read_text() if jinja.is_file() else config.get("chat_template")
        if isinstance(source, list):
            named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
            source = named.get("default")
        if not source:
            raise ChatTemplateError(
                f"{folder} has no chat template (no {jinja.name}, no chat_template in {config_path.name}); "
                "give the prompt as plain text instead (CLI: --prompt, without --chat or --messages)"
            )
        return cls(source, special)

    def render(self, messages: list[dict], add_generation_prompt: bool = True, **variables) -> str:
        """The text of `messages` (each a dict with role and content), as apply_chat_template(tokenize=False)."""
        import jinja2

        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise ChatTemplateError(f"messages must be a list of dicts with role and content, got {messages!r:.80}")
        data = {**self.special, "tools": None, "documents": None, **_plain(variables)}  # as transformers passes
        messages = _plain(messages)
        size = len(json.dumps([messages, data], ensure_ascii=False))
        try:
            return render_limited(
                compiled(self.source),
                self.limits,
                size,
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                **data,
            )
        except jinja2.exceptions.TemplateError as e:
            raise ChatTemplateError(f"the chat template refused the messages: {e}") from None


def read_messages(text: str) -> list[dict]:
    """Messages from a JSON document: a list of {"role", "content"} or {"messages": [...]}."""
    try:
        data = json.loads(text)
    except ValueError as e:
        raise ChatTemplateError(f"the messages are not JSON ({e})") from None
    if isinstance(data, dict):
        data = data.get("messages")
    if not isinstance(data, list) or not all(isinstance(m, dict) and "role" in m for m in data):
        raise ChatTemplateError('give a JSON list of messages, e.g. [{"role": "user", "content": "Hi"}]')
    return data


__all__ = ["ChatTemplate", "ChatTemplateError", "ChatTemplateLimitError", "Limits", "read_messages"]
