"""`attnzoo generate`'s flags for sampling, stopping, streaming and chat, and what they become: the options of
runtime.generation.Generation, and a chat's prompt rendered with the checkpoint's template (runtime/chat.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from .common import CliError, number_in


def read_prompt(args, stdin=None) -> None:
    """--prompt-file PATH, else a piped stdin (when no --prompt, --prompt-ids or --messages is given and stdin is not
    a terminal), into args.prompt; one trailing newline dropped (the one `echo` and editors add)."""
    import sys

    stdin = sys.stdin if stdin is None else stdin
    given = [
        flag
        for flag, value in (("--prompt", args.prompt), ("--prompt-ids", args.prompt_ids), ("--messages", args.messages))
        if value is not None
    ]
    if args.prompt_file is not None:
        if given:
            raise CliError(f"--prompt-file {args.prompt_file} is the prompt; leave out {given[0]}")
        try:
            text = Path(args.prompt_file).read_text(encoding="utf-8")
        except OSError as e:
            raise CliError(f"--prompt-file {args.prompt_file}: {e.strerror or e}") from None
        except UnicodeDecodeError:
            raise CliError(f"--prompt-file {args.prompt_file} is not UTF-8 text") from None
    elif not given and stdin is not None and not stdin.isatty():
        try:
            text = stdin.read()
        except (OSError, ValueError):  # closed, or a test runner's stand-in: no prompt there
            return
        if not text:
            return
    else:
        return
    args.prompt = text.removesuffix("\n")


def chat_prompt(args, tok, source: Path) -> None:
    """--chat / --messages: the messages rendered by the checkpoint's chat template into args.prompt."""
    from runtime.chat import ChatTemplate, read_messages

    if args.messages is not None:
        if args.prompt is not None or args.prompt_ids is not None:
            raise CliError("--messages FILE is the whole prompt; leave out --prompt and --prompt-ids")
        try:
            messages = read_messages(Path(args.messages).read_text())
        except OSError as e:
            raise CliError(f"--messages {args.messages}: {e.strerror or e}") from None
    else:
        if args.prompt is None:
            raise CliError("--chat takes the user's message as --prompt TEXT (or give --messages FILE.json)")
        messages = [{"role": "user", "content": args.prompt}]
    if tok is None:
        raise CliError(f"--chat needs the checkpoint's tokenizer.json beside {source}")
    folder, stem = (source, "") if source.is_dir() else (source.parent, source.stem + ".")
    if not source.is_dir() and not (folder / f"{stem}tokenizer_config.json").is_file():
        stem = ""  # an export without its own copy: the folder's
    args.prompt = ChatTemplate.from_folder(folder, stem).render(messages, add_generation_prompt=True)
    args.prompt_ids = None


def options(args) -> dict:
    """The generation options the command line gives (None: the checkpoint's generation_config decides)."""
    knobs = ("do_sample", "temperature", "top_k", "top_p", "min_p", "repetition_penalty", "seed")
    out = {k: getattr(args, k) for k in knobs if getattr(args, k) is not None}
    if args.stop:
        out["stop"] = args.stop
    if args.max_time is not None:
        out["max_time"] = args.max_time
    if args.eos_token_id is not None:
        out["eos_token_id"] = args.eos_token_id
    if args.json_schema is not None:
        out["json_schema"] = json_schema(args.json_schema)
    elif args.json_object:
        out["response_format"] = {"type": "json_object"}
    if args.prompt_lookup is not None:
        out["prompt_lookup_num_tokens"] = args.prompt_lookup
    if args.ngram is not None:
        out["max_matching_ngram_size"] = args.ngram
    if args.draft_tokens is not None:
        out["num_assistant_tokens"] = args.draft_tokens
    return out


def json_schema(path: str) -> dict:
    """--json-schema FILE: the schema the text is constrained to (runtime/constraints.py)."""
    import json

    try:
        schema = json.loads(Path(path).read_text())
    except OSError as e:
        raise CliError(f"--json-schema {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise CliError(f"--json-schema {path} is not JSON ({e})") from None
    if not isinstance(schema, dict):
        raise CliError(f"--json-schema {path} holds a {type(schema).__name__}; a JSON schema is an object")
    return schema


def beam_options(args) -> dict:
    """--num-beams, --length-penalty, --early-stopping, --num-return-sequences as given (None: the checkpoint's)."""
    keys = ("num_beams", "length_penalty", "early_stopping", "num_return_sequences")
    return {k: getattr(args, k) for k in keys if getattr(args, k, None) is not None}


def refuse_with_beams(args, beams: int, live_asked: bool) -> None:
    """Beam search with what it does not do here: one line naming the flag."""
    sampling = (
        args.do_sample
        or (args.temperature or 0) > 0
        or any(getattr(args, k) is not None for k in ("top_k", "top_p", "min_p", "seed"))
    )
    given = [
        name
        for name, on in (
            ("--do-sample / --temperature / --top-k / --top-p / --min-p / --seed (sampling)", sampling),
            ("--stream", live_asked),
            ("--stop", bool(getattr(args, "stop", None))),
        )
        if on
    ]
    if given:
        raise CliError(
            f"{given[0]} with beam search (num_beams={beams}, --num-beams or the checkpoint's generation_config): "
            "not done here; drop it, or pass --num-beams 1"
        )


def early_stopping(text: str):
    """--early-stopping: true, false or never (transformers' early_stopping)."""
    value = {"true": True, "false": False, "never": "never"}.get(text.lower())
    if value is None:
        raise argparse.ArgumentTypeError(f"{text!r}: give true, false or never")
    return value


def speculates(args) -> bool:
    """Whether the call verifies candidates (--prompt-lookup or --draft): a folder is then exported with the
    logits of every position."""
    return args.prompt_lookup is not None or args.draft is not None


def add_speculation_flags(sp, title: str = "exact: greedy gives greedy's tokens; docs/generation.md") -> None:
    g = sp.add_argument_group(f"speculative decoding ({title})")
    g.add_argument(
        "--prompt-lookup",
        type=number_in(int, 1),
        metavar="K",
        help="propose up to K tokens that followed the text's last n-gram earlier in it (transformers' "
        "prompt_lookup_num_tokens); the target verifies them in one call",
    )
    g.add_argument(
        "--ngram",
        type=number_in(int, 1),
        metavar="N",
        help="--prompt-lookup matches n-grams of at most N tokens (default 2, transformers' max_matching_ngram_size)",
    )
    g.add_argument(
        "--draft",
        metavar="FOLDER|MODEL.onnx",
        help="a smaller model of the same tokenizer proposes the tokens (transformers' assistant_model)",
    )
    g.add_argument(
        "--draft-tokens",
        type=number_in(int, 1),
        metavar="K",
        help="--draft proposes at most K tokens a round (default 5; transformers' num_assistant_tokens)",
    )


def run_live(run, tok, ids: list[int], live: bool) -> float | None:
    """Every step of a generation run (a decoder's or an encoder-decoder's), each piece printed as it comes when
    `live`; the seconds it took, or None after Ctrl-C (said in one line: exit 130)."""
    import sys
    import time

    from . import interrupt

    if live:
        echo = short(tok.decode(ids)) if tok is not None else f"{len(ids)} prompt tokens"
        print(f"{echo!r} ->" if tok is not None else f"{echo} ->", end=" ", flush=True)
    started = time.perf_counter()
    try:
        for token in run:
            if live:
                print(run.pieces[0] if tok is not None else f"{int(token[0])} ", end="", flush=True)
    except KeyboardInterrupt:
        interrupt.handled()
        print(f"\nattnzoo generate: interrupted after {run.made} new tokens", file=sys.stderr)
        return None
    total = time.perf_counter() - started
    if live:
        print()
    return total


def short(text: str, keep: int = 60) -> str:
    """A long prompt's echo: its start and end."""
    return text if len(text) <= 2 * keep + 5 else f"{text[:keep]} ... {text[-keep:]}"


def add_generation_flags(sp) -> None:
    g = sp.add_argument_group("sampling (default: greedy, or the checkpoint's generation_config.json)")
    g.add_argument("--do-sample", action="store_true", default=None, help="sample (transformers' do_sample)")
    g.add_argument("--temperature", type=number_in(float, 0.0), help="above 0 samples; 0 is greedy")
    g.add_argument("--top-k", type=number_in(int, 0), help="keep the k likeliest tokens (0 = all; default 50)")
    g.add_argument("--top-p", type=float, help="keep the likeliest tokens up to this probability mass (0..1]")
    g.add_argument("--min-p", type=float, help="drop tokens below min_p x the top token's probability")
    g.add_argument("--repetition-penalty", type=float, help="> 1 makes tokens already in the text less likely")
    g.add_argument("--seed", type=number_in(int, 0), help="the seed of a sampling call (default: fresh, printed)")
    b = sp.add_argument_group("beam search (default: the checkpoint's generation_config.json num_beams, else 1)")
    b.add_argument("--num-beams", type=number_in(int, 1), help="beam search with this many beams (1: greedy)")
    b.add_argument(
        "--length-penalty", type=float, help="a hypothesis' score is its log-probability / length ** this (default 1)"
    )
    b.add_argument(
        "--early-stopping",
        type=early_stopping,
        metavar="{true,false,never}",
        help="true: stop once num_beams hypotheses end; false (default) and never: transformers' heuristics",
    )
    b.add_argument("--num-return-sequences", type=number_in(int, 1), help="the best N hypotheses (<= --num-beams)")
    sp.add_argument("--stop", action="append", metavar="TEXT", help="stop at this text (repeat for several)")
    sp.add_argument(
        "--json-schema", metavar="FILE", help="constrain the text to a JSON document valid under this JSON schema"
    )
    sp.add_argument("--json-object", action="store_true", help="constrain the text to one JSON object (JSON mode)")
    sp.add_argument("--max-time", type=float, metavar="SECONDS", help="stop after this many seconds")
    sp.add_argument(
        "--chat",
        action="store_true",
        help="--prompt is a user message, rendered with the checkpoint's chat template",
    )
    sp.add_argument("--messages", metavar="FILE.json", help="chat messages as JSON ([{role, content}, ...])")
    sp.add_argument(
        "--prompt-file",
        metavar="PATH",
        help="the prompt's text from a file (UTF-8; one trailing newline dropped); without --prompt, --prompt-ids, "
        "--messages or this, a piped stdin is the prompt (echo TEXT | attnzoo generate FOLDER)",
    )
    sp.add_argument(
        "--stream",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="print the text as it is made (default: on a terminal)",
    )
