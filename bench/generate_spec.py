"""`attnzoo bench --generate --speculative`: speculative decoding side by side (bench/generate.py runs the paths).

    attnzoo bench --generate --speculative --checkpoint models/tiny-stdlib-llama --workload grounded \
        --prompt 384 --new 128 --precision fp32,int4 [--spec-k 10] [--ngram 3] [--draft DIR]
        (--workload grounded,free: both; a row's prompt is "LENGTH WORKLOAD")

The paths: attnzoo plain, attnzoo with prompt lookup (runtime/speculative.py) and with a draft (--draft DIR),
transformers' generate plain, with `prompt_lookup_num_tokens` and with `assistant_model` (its "heuristic" schedule
from k), each in its own process (bench/generate_peers.py), greedy. The same k and n-gram for all; transformers'
prompt lookup proposes k every round, attnzoo's backs off (runtime/speculative.py). With --llama-python and
--genai-python the peers' own (bench/peer_spec.py): llama.cpp and onnxruntime-genai plain, `-prompt-lookup` and
(--draft) `-draft`, each speculating path on its plain path's model and compared with its plain path's tokens.

In a speculative run every attnzoo row runs the same all_logits export (plain decoding's step is the same
graph at t = 1; its prefill also computes the head at every prompt position).

Workloads: "grounded" is continuing text given in the prompt: the prompt is a held-out source's first P - C
tokens, then its first C again (C = GROUNDED_REPEAT), as when a model re-writes a file it was shown (an edit), so
the continuation is in the prompt; "free" is the bench's own prompt (bench.checkpoints.prompt_ids): the same text,
once, continued freely. Each row reports tokens/s, the acceptance rate (attnzoo), the new tokens per target call
after the prefill, whether its tokens equal its plain path's greedy tokens at the same precision, and (grounded)
how many of them re-write the prompt's text before the first that does not (`rewritten`): a model that loops
makes prompt lookup pay from its own text, not from the prompt's.
"""

from __future__ import annotations

from typing import Any

from .jobs import BenchError

WORKLOADS = ("grounded", "free")
GROUNDED_REPEAT = 32  # the tokens of the file's start given again at the prompt's end
PLAIN = {"attnzoo-prompt-lookup": "attnzoo", "attnzoo-draft": "attnzoo"}
PLAIN.update({"transformers-prompt-lookup": "transformers-dynamic", "transformers-assistant": "transformers-dynamic"})
# the peers' own speculation, each run on its plain path's model (the same GGUF, the same genai folder)
PEERS = {f"{peer}-{kind}": peer for peer in ("llama.cpp", "onnxruntime-genai") for kind in ("prompt-lookup", "draft")}
PLAIN.update(PEERS)
GENAI_MAX_K = 16  # onnxruntime-genai's speculative.max_draft_tokens and ngram_size: at most 16


def check(speculative: dict[str, Any] | None, paths) -> None:
    """A speculating path needs --speculative; a draft path needs --draft DIR."""
    asked = [p for p in paths or () if p in PLAIN]
    if asked and not speculative:
        raise BenchError(f"--paths {','.join(asked)}: speculating paths go with --speculative")
    if speculative:
        bad = [w for w in speculative.get("workloads") or [None] if w not in WORKLOADS]
        if bad:
            raise BenchError(f"--workload {bad[0]!r} is not one of {', '.join(WORKLOADS)}")
        drafts = [p for p in paths or () if p.endswith(("-draft", "-assistant"))]
        if drafts and not speculative.get("draft"):
            raise BenchError(f"--paths {','.join(drafts)} need --draft DIR (a checkpoint of the same tokenizer)")


def default_paths(paths: tuple[str, ...], speculative: dict[str, Any] | None) -> list[str]:
    """The paths a run takes when none are named: without --speculative the bench's own."""
    if not speculative:
        return list(paths)
    out = ["attnzoo", "attnzoo-prompt-lookup", "transformers-dynamic", "transformers-prompt-lookup"]
    if speculative.get("draft"):
        out[2:2] = ["attnzoo-draft"]
        out.append("transformers-assistant")
    for peer in (p for p in paths if p in ("onnxruntime-genai", "llama.cpp")):  # each with its own speculation
        out += [peer, f"{peer}-prompt-lookup"] + ([f"{peer}-draft"] if speculative.get("draft") else [])
    return out


def refusal(path: str, speculative: dict[str, Any] | None) -> str | None:
    """Why a peer's speculating path cannot run with these settings (its row is skipped saying so), or None."""
    if not speculative or not path.startswith("onnxruntime-genai-"):
        return None
    if speculative["k"] > GENAI_MAX_K:
        return f"onnxruntime-genai's max_draft_tokens is 1 to {GENAI_MAX_K}; --spec-k {speculative['k']}"
    if path.endswith("-prompt-lookup") and speculative["ngram"] + 1 > GENAI_MAX_K:
        return f"onnxruntime-genai's ngram_size (--ngram + 1) is 2 to {GENAI_MAX_K}; --ngram {speculative['ngram']}"
    return None


def spec_job(path: str, speculative: dict[str, Any] | None) -> dict[str, Any]:
    """What a worker's job carries for `path`: {"spec": {...}} for a speculating one, else nothing."""
    if not speculative or path not in PLAIN:
        return {}
    spec = {"k": speculative["k"], "ngram": speculative["ngram"]}
    if path.endswith(("-draft", "-assistant")):
        spec["draft"] = speculative["draft"]
    return {"spec": spec}


def build_order(paths: list[str]) -> list[str]:
    """The order the models are built in: the one all_logits export every attnzoo row shares first, the peers'
    speculating paths after their plain path (whose model they run)."""
    return sorted(paths, key=lambda p: (p != "attnzoo-prompt-lookup", p in PEERS))


def shared_model(
    path: str, precision: str, models: dict, speculative: dict[str, Any] | None
) -> tuple[str | None, bool]:
    """(the model `path` runs that another path built, whether it still builds its draft beside it), or
    (None, False): build its own. Every attnzoo row of a speculative run takes the one all_logits target (plain
    decoding's step is the same graph at t = 1; the draft path exports its draft only); a peer's speculating path
    takes its plain path's GGUF or genai folder (a draft path writes its draft's beside it)."""
    if not speculative:
        return None, False
    if path in ("attnzoo", "attnzoo-draft"):
        shared = models.get(("attnzoo-prompt-lookup", precision))
    elif path in PEERS:
        shared = models.get((PEERS[path], precision))
    else:
        return None, False
    return shared, bool(shared) and path.endswith("-draft")


def workload_ids(folder: str, lengths: list[int], speculative: dict[str, Any] | None, prompt_ids) -> dict:
    """The rows' prompts, {label: ids}: each length's (label: the length), or with --speculative each workload's
    (label "LENGTH WORKLOAD"): the bench's own text, or (grounded) its first length - C tokens then its first C
    again."""
    if not speculative:
        return {n: prompt_ids(folder, n) for n in lengths}
    out = {}
    for workload in speculative["workloads"]:
        for n in lengths:
            if workload == "free":
                out[f"{n} free"] = prompt_ids(folder, n)
                continue
            if n <= 2 * GROUNDED_REPEAT:
                raise BenchError(f"--workload grounded needs --prompt above {2 * GROUNDED_REPEAT}, got {n}")
            text = prompt_ids(folder, n - GROUNDED_REPEAT)
            out[f"{n} grounded"] = text + text[:GROUNDED_REPEAT]
    return out


def equal_to_plain(rows: list[dict[str, Any]]) -> None:
    """Each speculating row: its tokens against its plain path's at the same prompt and precision."""
    for row in rows:
        base = PLAIN.get(row["path"])
        if base is None or not row.get("ok"):
            continue
        plain = next(
            (
                r
                for r in rows
                if r["path"] == base and r["prompt"] == row["prompt"] and r["precision"] == row["precision"]
            ),
            None,
        )
        if plain is not None and plain.get("ok"):
            row["equal_to_plain"] = row["tokens"] == plain["tokens"]


def rewritten(rows: list[dict[str, Any]], ids_of: dict) -> None:
    """Each grounded row's "rewritten": how many of its new tokens re-write the text the prompt repeated the start
    of (its tokens after that start) before the first that does not: a speed-up that comes from the prompt's text
    shows here; one from the model's own loop (prompt lookup matching the text it just wrote) does not."""
    for row in rows:
        if not row.get("ok") or not str(row["prompt"]).endswith(" grounded"):
            continue
        ids = ids_of[row["prompt"]]
        source = ids[GROUNDED_REPEAT : len(ids) - GROUNDED_REPEAT]
        row["rewritten"] = next((i for i, (a, b) in enumerate(zip(row["tokens"], source)) if a != b), len(source))


def format_speculative_table(report: dict[str, Any]) -> str:
    """The speculative run's markdown table: one row per (prompt, precision, path), speed against plain."""
    m, spec = report["machine"], report["speculative"]
    lines = [
        f"generate --speculative: {report['checkpoint']}, CPU float32, B 1, "
        f"{report['new']} new tokens, k {spec['k']}, n-gram {spec['ngram']}"
        + (f", draft {spec['draft']}" if spec.get("draft") else "")
        + f", {report['threads']} threads, best of {report['repeats']}; {m.get('cpu')} "
        f"({'AVX-512' if m.get('avx512') else 'no AVX-512'}), load {', '.join(f'{x:.1f}' for x in m['load_avg'])}",
        "",
        "| prompt | precision | path | end to end s | tokens/s | vs its plain | acceptance | tokens per target call "
        "| equal to plain greedy | re-written from the prompt |",
        "|---:|---|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    rows = report["rows"]
    for r in rows:
        head = f"| {r['prompt']} | {r['precision']} | {r['path']} |"
        if not r.get("ok"):
            lines.append(f"{head} error: {r.get('error', '?')} | | | | | | |")
            continue
        base = PLAIN.get(r["path"], r["path"])
        plain = next(
            (p for p in rows if p["path"] == base and p["prompt"] == r["prompt"] and p["precision"] == r["precision"]),
            None,
        )
        ratio = f"{plain['end_to_end_s'] / r['end_to_end_s']:.2f}x" if plain and plain.get("ok") else ""
        s = r.get("speculation") or {}
        accept = f"{s['acceptance_rate']:.2f}" if "acceptance_rate" in s else ""
        per_call = f"{s['tokens_per_target_call']:.2f}" if "tokens_per_target_call" in s else ""
        equal = {True: "yes", False: "no"}.get(r.get("equal_to_plain"), "")
        copied = f"{r['rewritten']} of {len(r['tokens'])}" if "rewritten" in r else ""
        lines.append(
            f"{head} {r['end_to_end_s']:.3f} | {r['tokens_per_s']:.0f} | {ratio} | {accept} | {per_call} | {equal} "
            f"| {copied} |"
        )
    for s in report["skipped"]:
        lines.append(f"| | {s['precision']} | {s['path']} | skipped: {s['why']} | | | | | | |")
    return "\n".join(lines)


__all__ = [
    "GROUNDED_REPEAT",
    "WORKLOADS",
    "build_order",
    "check",
    "default_paths",
    "equal_to_plain",
    "format_speculative_table",
    "refusal",
    "rewritten",
    "shared_model",
    "spec_job",
    "workload_ids",
]
