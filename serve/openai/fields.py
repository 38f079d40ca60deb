"""Every field of OpenAI's completions and chat requests, and what this server does with it (FATES): applied,
accepted and ignored (it changes nothing here), or refused in OpenAI's error format naming the field. The
table is checked against the `openai` package's own request types (tests/serve/test_openai_fields.py) and is
the one docs/serving.md prints. Plain Python: no Ray, no torch.
"""

from __future__ import annotations

from runtime.penalties import BIAS_RANGE, PENALTY_RANGE

from .common import CHAT, COMPLETIONS, OpenAIError, number

APPLIED, IGNORED, REFUSED = "applied", "ignored", "refused"

# field -> (fate, what happens), for both routes unless a route's own table says otherwise
SHARED = {
    "model": (APPLIED, "must be the served model's id (GET /v1/models); another is a 404 model_not_found"),
    "max_tokens": (APPLIED, "the most new tokens (completions' default 16; chat's: as many as fit)"),
    "stop": (
        APPLIED,
        "up to 4 strings, looked for in the completion alone (one begun in the prompt does not "
        "count, as OpenAI's); the text ends before the first one made",
    ),
    "n": (
        APPLIED,
        "n independent choices, each a row of the continuous batch; with a seed, choice i draws "
        "from SeedSequence([seed, i]) (choice 0 is the n=1 answer)",
    ),
    "stream": (APPLIED, "server-sent events as OpenAI's chunks, ending with data: [DONE]"),
    "stream_options": (
        APPLIED,
        "include_usage: a last chunk with the usage; include_obfuscation is accepted "
        "and ignored (no padding field is added)",
    ),
    "temperature": (APPLIED, "0..2; 0 is greedy"),
    "top_p": (APPLIED, "0..1; 0 is greedy (as transformers reads it), 1 is off"),
    "seed": (APPLIED, "each choice's draws reproducible; the seed used (given or fresh) is in the answer"),
    "frequency_penalty": (APPLIED, "-2..2, OpenAI's formula over the tokens made so far (runtime/penalties.py)"),
    "presence_penalty": (APPLIED, "-2..2, OpenAI's formula over the tokens made so far (runtime/penalties.py)"),
    "logit_bias": (APPLIED, "{token id: -100..100} added to the logits before sampling"),
    "logprobs": (APPLIED, "the model's log-softmax of each new token and its alternatives"),
    "user": (IGNORED, "an end user's id for OpenAI's abuse monitoring: accepted, nothing here reads it"),
}
COMPLETION_FIELDS = {
    **SHARED,
    "prompt": (APPLIED, "a string, token ids, or a list of either: one choice (n) per prompt, in order"),
    "echo": (APPLIED, "the prompt's text before the answer's (not with logprobs: prompt logprobs are not made)"),
    "best_of": (
        APPLIED,
        "best_of candidates per prompt (>= n), the n of highest mean log-probability per token "
        "returned, as OpenAI ranks them; not streamed",
    ),
    "suffix": (REFUSED, "a text after the insertion needs a fill-in-the-middle model; only null or empty"),
}
CHAT_FIELDS = {
    **SHARED,
    "messages": (
        APPLIED,
        "rendered by the model's chat template as transformers' apply_chat_template; text "
        "parts only, tool messages and assistant tool_calls as the template writes them",
    ),
    "max_completion_tokens": (APPLIED, "as max_tokens (it wins where both are given)"),
    "top_logprobs": (APPLIED, "0..20 alternatives per token, with logprobs true"),
    "response_format": (
        APPLIED,
        "text, json_object or json_schema: decoding constrained by llguidance, so the "
        "answer parses (and validates against the schema)",
    ),
    "tools": (
        APPLIED,
        "function tools, passed to the chat template as apply_chat_template(tools=...); custom tools are refused",
    ),
    "tool_choice": (
        APPLIED,
        "none, auto, required, a named function, or allowed_tools; required and a named "
        "function constrain decoding to calls whose arguments validate",
    ),
    "parallel_tool_calls": (APPLIED, "false: at most one call per answer"),
    "reasoning_effort": (
        APPLIED,
        "passed to the chat template as the variable reasoning_effort (templates that "
        "read it, e.g. gpt-oss's, use it; others render as without)",
    ),
    "modalities": (APPLIED, '["text"] only; "audio" is refused (this server makes text)'),
    "audio": (REFUSED, "audio output: this server makes text; only null"),
    "functions": (
        APPLIED,
        "OpenAI's deprecated form of tools (not with them): the same functions, one call an "
        "answer, answered as message.function_call with finish_reason function_call",
    ),
    "function_call": (APPLIED, "OpenAI's deprecated form of tool_choice: none, auto or {name}"),
    "web_search_options": (REFUSED, "no web search here; only null"),
    "moderation": (REFUSED, "no moderation model here; only null"),
    "metadata": (IGNORED, "tags for stored completions: nothing is stored here"),
    "store": (IGNORED, "nothing is stored here (no stored-completions routes)"),
    "service_tier": (IGNORED, "one tier here; accepted and ignored"),
    "prediction": (IGNORED, "predicted output only speeds OpenAI's decoding up; the answer is the same without"),
    "prompt_cache_key": (IGNORED, "a cache routing hint; one replica's cache is per request here"),
    "prompt_cache_options": (IGNORED, "a cache hint; accepted and ignored"),
    "prompt_cache_retention": (IGNORED, "a cache hint; accepted and ignored"),
    "safety_identifier": (IGNORED, "an end user's id for OpenAI's abuse monitoring: accepted, not read"),
    "verbosity": (IGNORED, "a hint to OpenAI's reasoning models; no template here reads it"),
}
FATES = {COMPLETIONS: COMPLETION_FIELDS, CHAT: CHAT_FIELDS}
EXTRAS = {  # beyond OpenAI's fields, as vLLM takes them (the client's extra_body)
    "top_k": "0 is off",
    "min_p": "0..1",
    "repetition_penalty": "> 0, transformers' (1 is off)",
}


def check_refused(doc: dict, route: str) -> None:
    """A field this server cannot honour, given a value that asks for something: OpenAIError naming it."""
    fates = FATES[route]
    for name, value in doc.items():
        fate, why = fates.get(name, (None, ""))
        if fate != REFUSED or value in (None, "", [], False):
            continue  # asks for nothing
        raise OpenAIError(f"{name}={value!r:.60} is not served here: {why}", param=name)
    modalities = doc.get("modalities") if route == CHAT else None
    if modalities is not None and (not isinstance(modalities, list) or set(modalities) - {"text"}):
        raise OpenAIError(f'modalities={modalities!r}: this server makes text only (["text"])', param="modalities")


def penalties(doc: dict) -> dict:
    """frequency_penalty and presence_penalty (-2..2) and logit_bias ({id: -100..100}), checked."""
    out = {name: number(doc, name, *PENALTY_RANGE) for name in ("frequency_penalty", "presence_penalty")}
    bias = doc.get("logit_bias")
    if bias is not None:
        if not isinstance(bias, dict):
            raise OpenAIError(f"logit_bias={bias!r:.60} must map token ids to numbers in -100..100", param="logit_bias")
        for key, value in bias.items():
            if not (isinstance(key, str) and key.isascii() and key.isdigit()):
                raise OpenAIError(f"logit_bias key {key!r} is not a token id", param="logit_bias")
            low, high = BIAS_RANGE
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
                raise OpenAIError(f"logit_bias[{key}]={value!r} must be a number in -100..100", param="logit_bias")
        out["logit_bias"] = bias or None
    return {k: v for k, v in out.items() if v}


def choices(doc: dict, route: str) -> tuple[int, int]:
    """(n, best_of): n choices (1..128) per prompt, the best n of best_of candidates (completions; n..128)."""
    n = number(doc, "n", 1, 128, integer=True) or 1
    best_of = number(doc, "best_of", 1, 128, integer=True) if route == COMPLETIONS else None
    if best_of is not None and best_of < n:
        raise OpenAIError(f"best_of={best_of} must be >= n={n}", param="best_of")
    if best_of not in (None, n) and doc.get("stream"):
        raise OpenAIError(f"best_of={best_of} > n={n} cannot be streamed (OpenAI's rule)", param="best_of")
    return n, best_of or n


def stream_options(doc: dict) -> bool:
    """include_usage from stream_options ({include_usage, include_obfuscation}, booleans)."""
    options = doc.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict) or set(options) - {"include_usage", "include_obfuscation"}:
        raise OpenAIError(
            f"stream_options={options!r}: only {{'include_usage': bool, 'include_obfuscation': bool}}",
            param="stream_options",
        )
    if not all(isinstance(v, bool) for v in options.values()):
        raise OpenAIError(f"stream_options={options!r}: the values are true or false", param="stream_options")
    return bool(options.get("include_usage"))


def markdown_table() -> str:
    """The table docs/serving.md prints (tests/serve/test_openai_fields.py checks the page holds it)."""
    rows = ["| field | routes | fate | what happens |", "|---|---|---|---|"]
    for name in sorted(set(COMPLETION_FIELDS) | set(CHAT_FIELDS)):
        routes = [r for r, table in ((COMPLETIONS, COMPLETION_FIELDS), (CHAT, CHAT_FIELDS)) if name in table]
        fate, why = (COMPLETION_FIELDS.get(name) or CHAT_FIELDS[name]) if len(routes) == 1 else CHAT_FIELDS[name]
        where = "both" if len(routes) == 2 else ("completions" if routes == [COMPLETIONS] else "chat")
        rows.append(f"| `{name}` | {where} | {fate} | {why} |")
    return "\n".join(rows)


__all__ = [
    "APPLIED",
    "CHAT_FIELDS",
    "COMPLETION_FIELDS",
    "EXTRAS",
    "FATES",
    "IGNORED",
    "REFUSED",
    "check_refused",
    "choices",
    "markdown_table",
    "penalties",
    "stream_options",
]
