"""What every command module shares: the one-line CLI error and the argument parsers.

cli/main.py builds the parser from the command modules (cmd_zoo, cmd_onnx, ...); they
import this module, never cli.py, so there is no import circle. Spec overrides (--set KEY=VALUE)
are parsed by zoo.parse_overrides, next to the spec they change.
"""

from __future__ import annotations

import argparse
import math

import zoo


class CliError(zoo.AttnzooError, ValueError):
    """A user mistake on the command line: printed as one line, exit status 2."""


def refuse_broken_cuda(provider: str) -> None:
    """--provider cuda where CUDA does not work here: one line, before any export or start."""
    if provider == "cuda":
        from runtime.providers import cuda_status

        ok, why = cuda_status()
        if not ok:
            raise CliError(f"--provider cuda: {why}; use --provider cpu or auto")


def shipped_folder(text: str):
    """The shipped checkpoint a bare name means (`tiny-stdlib-llama` -> models/tiny-stdlib-llama), where `text` is
    no path here; else None. generate, serve and embed take it as `heads` takes the tiny models' names."""
    from pathlib import Path

    given = Path(text)
    folder = Path(__file__).resolve().parent.parent / "models" / text
    if given.exists() or given.name != text or not (folder / "config.json").is_file():
        return None
    return folder


def refuse_hub_id(text: str) -> None:
    """A Hugging Face Hub id (ORG/NAME, and no ORG folder here) given where a local folder goes: one line saying ids
    are not fetched and how to get the folder."""
    import re
    from pathlib import Path

    given = Path(text)
    if given.exists() or given.parent.exists() or not re.fullmatch(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*", text):
        return
    raise CliError(
        f"{text}: no such folder here, and attnzoo does not fetch Hub ids; download the checkpoint into a folder and "
        f"give that: `huggingface-cli download {text} --local-dir DIR` (or save_pretrained(DIR) the model and "
        "tokenizer that transformers' from_pretrained loads)"
    )


def with_tf32(parser: argparse.ArgumentParser) -> None:
    """--tf32, on every command that opens a session: fp32 products in TF32 on CUDA (OnnxSession(tf32=True))."""
    parser.add_argument(
        "--tf32",
        action="store_true",
        help="on CUDA, run fp32 MatMul/Gemm in TF32: faster, ~1e-3 relative error a product (parity then holds "
        "fp32 to rtol=atol=2e-3). Default off: the session passes use_tf32=0, so fp32 is fp32 (not yet run on a GPU: "
        "docs/gpu.md)",
    )


def one_model(args: argparse.Namespace) -> None:
    """heads and patch take NAME (a trained tiny model) or --checkpoint DIR, exactly one; a folder given as
    NAME is named back as the --checkpoint it was meant to be."""
    from pathlib import Path

    if (args.name is None) == (args.checkpoint is None):
        raise CliError("give one of NAME (a trained model) and --checkpoint DIR (a whole model's folder)")
    if args.name is not None and Path(args.name).is_dir():
        raise CliError(f"{args.name} is a folder, not a trained model's name: give it as --checkpoint {args.name}")


def number_in(kind: type, low: float, *, low_open: bool = False, below: float | None = None):
    """An argparse type: a finite `kind` (int or float) v with low <= v (low < v with low_open)
    and v < below; each refusal is one line naming the value and the range."""
    noun = "an integer" if kind is int else "a number"
    show = str if kind is int else (lambda v: f"{v:g}")  # integers exactly (2**63 is not 9.22e+18)
    if below is not None:
        rule = f"in [{show(low)}, {show(below)})"
    elif low_open:
        rule = "positive" if low == 0 else f"> {show(low)}"
    else:
        rule = f">= {show(low)}"

    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None
        if not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if v < low or (low_open and v == low) or (below is not None and v >= below):
            raise argparse.ArgumentTypeError(f"{v} must be {rule}")
        return v

    return parse


positive = number_in(int, 0, low_open=True)
SEED_MAX = 2**63 - 1  # torch.manual_seed takes a 64-bit integer
seed = number_in(int, 0, below=SEED_MAX + 1)


def int_list(text: str) -> list[int]:
    """An argparse type: positive integers separated by commas or spaces, e.g. 1,16,512."""
    try:
        values = [positive(p) for p in text.replace(",", " ").split()]
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"{text!r}: give positive integers, e.g. 1,16,512 ({e})") from None
    if not values:
        raise argparse.ArgumentTypeError(f"{text!r}: give positive integers, e.g. 1,16,512")
    return values


def choice_list(choices: tuple[str, ...]):
    """An argparse type: one or more of `choices` separated by commas, e.g. fp32,int8,int4."""

    def parse(text: str) -> list[str]:
        values = [p for p in text.replace(",", " ").split() if p]
        bad = [v for v in values if v not in choices]
        if bad or not values:
            raise argparse.ArgumentTypeError(f"{text!r}: choose from {', '.join(choices)} (comma-separated)")
        return list(dict.fromkeys(values))

    return parse


def with_set(sp: argparse.ArgumentParser) -> None:
    """--set KEY=VALUE, the spec overrides every command that builds a block takes."""
    sp.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a spec field, e.g. --set d_model=256 --set heads=4 (repeatable)",
    )


# -- a block from a name, a transformers config or a checkpoint ------------------------------------


def with_source(sp: argparse.ArgumentParser, *, checkpoint: bool = True, config: bool = True) -> None:
    """--config / --checkpoint / --layer: a block from a transformers config.json or checkpoint folder,
    instead of a registered NAME (mutually exclusive with it; see `source_of`)."""
    if config:
        sp.add_argument(
            "--config",
            metavar="CONFIG_JSON",
            help="a transformers config.json (or its folder) instead of NAME: the spec of --layer (random weights)",
        )
    if checkpoint:
        sp.add_argument(
            "--checkpoint",
            metavar="DIR",
            help="a transformers checkpoint folder (config.json + *.safetensors) instead of NAME: "
            "layer --layer's attention with its weights",
        )
    given = " / ".join(flag for flag, on in (("--config", config), ("--checkpoint", checkpoint)) if on)
    sp.add_argument(
        "--layer",
        type=number_in(int, 0),
        default=None,
        help=f"which layer of {given} (default 0); layers differ (sliding, no rotary, ...)",
    )


def source_of(args: argparse.Namespace, positional: str) -> str:
    """'name', 'config' or 'checkpoint': exactly one of NAME, --config, --checkpoint (one-line errors)."""
    given = [
        what
        for what, value in (
            ("name", getattr(args, positional, None)),
            ("config", getattr(args, "config", None)),
            ("checkpoint", getattr(args, "checkpoint", None)),
        )
        if value is not None
    ]
    flags = {"name": positional.upper(), "config": "--config", "checkpoint": "--checkpoint"}
    if len(given) > 1:
        raise CliError(f"give one of {', '.join(flags[g] for g in given)}, not both: they name the block differently")
    if not given:
        choices = [flags["name"]] + [flags[k] for k in ("config", "checkpoint") if hasattr(args, k)]
        raise CliError(f"name the block: give {' or '.join(choices)}")
    if given[0] == "name" and args.layer is not None:
        raise CliError("--layer picks a layer of --config or --checkpoint; a registered NAME has none")
    if given[0] == "checkpoint" and getattr(args, "set", None):
        if hasattr(args, "config"):
            raise CliError("--set changes a spec, but --checkpoint's weights fix it; use --config to change fields")
        raise CliError(  # parity has no --config: a preset of the layer takes --set
            "--set changes a spec, but --checkpoint's weights fix it; drop --set, or check a changed spec as a "
            "preset: attnzoo preset --config DIR/config.json --name my-layer -o FOLDER/my-layer.toml, then "
            "ATTNZOO_PRESETS=FOLDER attnzoo parity my-layer --set ..."
        )
    return given[0]
