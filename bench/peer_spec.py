"""The peers' own speculative decoding for `attnzoo bench --generate --speculative`, in the peers' environments.

Loaded by bench/generate_peers.py from beside it (by path: under llama-cpp-python's or onnxruntime-genai's python
bench is no package), so like that file it imports only the standard library at the top, the peer inside the
functions. The paths (bench/generate_spec.py names them; each runs its plain path's model):

- `llama.cpp-prompt-lookup`: llama-cpp-python's `Llama(..., draft_model=LlamaPromptLookupDecoding(
  num_pred_tokens=K, max_ngram_size=N))` and its own `Llama.generate` loop at temp 0 (its greedy sampler). That
  loop evaluates the last token and the draft's K candidates in one batch, samples each position in turn and
  drops the cache after the first position whose token differs from the candidate; the lookup proposes K every
  round (no back-off), from the longest n-gram of at most N that matched, its first occurrence; this file cuts
  each round's candidates at the call's last new token (as attnzoo's and genai's are cut).
- `llama.cpp-draft`: the same loop with `draft_model=GreedyDraft`, a `LlamaDraftModel` of this file running a
  second `Llama` (the draft checkpoint's GGUF at the same precision) greedily for K tokens each round, keeping its
  own cache up to where the target's sequence still agrees with it.
- `onnxruntime-genai-prompt-lookup`: onnxruntime-genai's n-gram decoding,
  `GeneratorParams.set_speculative_options(ngram_size=N + 1, max_draft_tokens=K)` (its ngram_size counts the
  proposed token: it matches exactly the last N tokens, the most recent earlier occurrence, no shorter n-gram
  after a miss), fixed K (min_adaptive_k 0), no cooldown; the same og.Generator loop as the plain path.
- `onnxruntime-genai-draft`: its base speculative decoding: a genai_config.json whose `model.draft` is the draft
  checkpoint's decoder (built by the same builder at the same precision), `speculative.max_draft_tokens` K.

Acceptance: llama-cpp-python exposes no counts, so each round's candidates are recorded as the loop asks for them
and compared with the tokens it then returned (candidates past the N new tokens are not counted);
onnxruntime-genai's come from `Generator.get_speculative_stats()` (genai_summary says how).
"""

from __future__ import annotations

import json
import os

GENAI_SPEC_DIR = "speculative"  # the composite genai_config.json (target + draft), beside the draft's folder


# ---- llama.cpp: llama-cpp-python's generate loop with a draft model ----
def build_llama_draft(job: dict, build_llama) -> dict:
    """The target's GGUF (unless the plain path's is shared: draft_only), then the draft checkpoint's at the same
    precision, written the same way (bench/gguf_llama.py), at job["draft_model"]."""
    info = {} if job.get("draft_only") else build_llama(job)
    if info.get("ok") is False:
        return info
    draft = build_llama({**job, "checkpoint": job["spec"]["draft"], "model": job["draft_model"]})
    if draft.get("ok") is False:
        return {"ok": False, "error": f"the draft {job['spec']['draft']}: {draft['error']}"}
    return {**info, "draft_tensor_types": draft.get("tensor_types", {})}


def accepted_counts(prompt: int, tokens: list[int], proposals: list[tuple[int, list[int]]]) -> tuple[int, int]:
    """(proposed, accepted) of a llama-cpp-python run: each proposal (the sequence's length when it was asked for,
    its candidates) against the tokens the loop returned from that position; candidates past the last returned
    token were never checked and are not counted."""
    proposed = accepted = 0
    for length, candidates in proposals:
        start = length - prompt  # the index in `tokens` of the first candidate's position
        made = tokens[start : start + len(candidates)]
        proposed += len(made)
        accepted += next((i for i, (a, b) in enumerate(zip(candidates, made)) if a != b), len(made))
    return proposed, accepted


def load_llama_speculative(job: dict):
    """generate(n) through Llama.generate with the path's draft model; generate.stats its counts."""
    import ctypes

    import llama_cpp
    import numpy as np
    from llama_cpp.llama_speculative import LlamaDraftModel, LlamaPromptLookupDecoding

    prompt, spec, new = job["prompt"], job["spec"], job["new"]
    proposals: list[tuple[int, list[int]]] = []
    limit = [len(prompt) + new]  # the sequence's length at the end of the call

    class GreedyDraft(LlamaDraftModel):
        """K greedy tokens of a second Llama (the draft's GGUF) from the target's sequence so far."""

        def __init__(self, path: str, k: int):
            self.k, self.calls = k, 0
            self.llm = llama_cpp.Llama(
                model_path=path,
                n_ctx=len(prompt) + new,
                n_batch=len(prompt),
                n_threads=job["threads"],
                n_threads_batch=job["threads"],
                verbose=False,
            )
            self.n_vocab = self.llm.n_vocab()

        def __call__(self, input_ids, /, room: int | None = None, **kwargs):
            d, ids, k = self.llm, [int(t) for t in input_ids], min(self.k, room or self.k)
            have = d.input_ids[: d.n_tokens].tolist()
            keep = next((i for i, (a, b) in enumerate(zip(have, ids)) if a != b), min(len(have), len(ids)))
            d.n_tokens = min(keep, len(ids) - 1)  # its eval drops the cache from here; one token at least is new
            d.eval(ids[d.n_tokens :])
            out = []
            for i in range(k):
                pointer = llama_cpp.llama_get_logits_ith(d.ctx, -1)
                logits = np.ctypeslib.as_array(ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)), (self.n_vocab,))
                out.append(int(np.argmax(logits)))
                if i < k - 1:
                    d.eval([out[-1]])
            self.calls += 1
            return np.asarray(out, dtype=np.intc)

    if spec.get("draft"):
        inner = GreedyDraft(job["draft_model"], spec["k"])
    else:
        inner = LlamaPromptLookupDecoding(max_ngram_size=spec["ngram"], num_pred_tokens=spec["k"])

    class Recorded(LlamaDraftModel):
        """The draft as Llama.generate calls it, each round's candidates recorded and cut at the call's last new
        token (its loop does not know where the call ends: it would verify candidates past it, and write them
        past the arrays it sized by n_ctx)."""

        def __call__(self, input_ids, /, **kwargs):
            room = limit[0] - len(input_ids)
            extra = {"room": room} if spec.get("draft") else {}
            out = inner(input_ids, **extra, **kwargs)[:room] if room > 0 else np.zeros(0, np.intc)
            proposals.append((len(input_ids), [int(t) for t in out]))
            return out

    llm = llama_cpp.Llama(
        model_path=job["model"],
        n_ctx=len(prompt) + new,
        n_batch=len(prompt),
        n_threads=job["threads"],
        n_threads_batch=job["threads"],
        draft_model=Recorded(),
        logits_all=True,  # as a draft model sets it; said here, or its scores array has n_batch rows only
        verbose=False,
    )
    calls, evaluate = [0], llm.eval

    def counted_eval(tokens):  # the target's calls: the prompt's, then one a round
        calls[0] += 1
        evaluate(tokens)

    llm.eval = counted_eval
    stats: dict = {}

    def generate(n: int) -> list[int]:
        proposals.clear()
        calls[0], limit[0] = 0, len(prompt) + n
        if spec.get("draft"):
            inner.calls = 0
        llm.reset()  # n_tokens 0: no prefix of the last call's cache is reused, the prompt is evaluated again
        out: list[int] = []
        for token in llm.generate(prompt, temp=0.0, repeat_penalty=1.0):
            out.append(int(token))
            if len(out) == n:
                break
        proposed, accepted = accepted_counts(len(prompt), out, proposals)
        target = calls[0] - 1  # after the prefill
        stats.update(target_calls=target, proposed=proposed, accepted=accepted)
        stats.update(acceptance_rate=accepted / proposed if proposed else 0.0)
        stats.update(tokens_per_target_call=(n - 1) / max(target, 1))
        if spec.get("draft"):
            stats["draft_calls"] = inner.calls
        return out

    generate.stats = stats
    return generate


# ---- onnxruntime-genai: n-gram decoding and a draft model ----
def build_genai_draft(job: dict, build_genai) -> dict:
    """The target's genai folder (unless the plain path's is shared), the draft checkpoint's beside it by the same
    builder and precision, and a genai_config.json naming both (model.draft; speculative.max_draft_tokens K)."""
    info = {} if job.get("draft_only") else build_genai(job)
    if info.get("ok") is False:
        return info
    draft = build_genai({**job, "checkpoint": job["spec"]["draft"], "model": job["draft_model"]})
    if draft.get("ok") is False:
        return {"ok": False, "error": f"the draft {job['spec']['draft']}: {draft['error']}"}
    out = os.path.join(os.path.dirname(job["draft_model"]), GENAI_SPEC_DIR)
    _link_files(job["model"], out)  # genai refuses a config path with "..": the files are linked in
    _link_files(job["draft_model"], os.path.join(out, "draft"))
    config, draft_config = _genai_config(job["model"]), _genai_config(job["draft_model"])
    config["model"]["draft"] = draft_config["model"]["decoder"]
    config["model"]["draft"]["filename"] = "draft/" + draft_config["model"]["decoder"]["filename"]
    config["speculative"] = {"max_draft_tokens": job["spec"]["k"]}
    with open(os.path.join(out, "genai_config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return {**info, "draft_command": draft.get("command")}


def _link_files(folder: str, out: str) -> None:
    """Every file of `folder` (the model, its external data, the tokenizer) hard-linked into `out`, copied
    where a link cannot be made; not its genai_config.json."""
    import shutil

    os.makedirs(out, exist_ok=True)
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if os.path.isfile(path) and name != "genai_config.json":
            try:
                os.link(path, os.path.join(out, name))
            except OSError:
                shutil.copy2(path, os.path.join(out, name))


def _genai_config(folder: str) -> dict:
    with open(os.path.join(folder, "genai_config.json")) as f:
        return json.load(f)


def genai_folder(job: dict) -> str:
    """The folder og.Model opens: the composite one for the draft path, the plain path's model otherwise."""
    if (job.get("spec") or {}).get("draft"):
        return os.path.join(os.path.dirname(job["draft_model"]), GENAI_SPEC_DIR)
    return job["model"]


def genai_options(job: dict) -> dict:
    """set_speculative_options' keywords: fixed K, no adaptation, no cooldown; n-gram decoding of N tokens."""
    spec = job["spec"]
    options = {"max_draft_tokens": spec["k"], "min_adaptive_k": 0, "cooldown": False}
    if not spec.get("draft"):
        options["ngram_size"] = spec["ngram"] + 1  # genai's n-gram counts the proposed token
    return options


def genai_summary(raw: dict, n: int) -> dict:
    """The row's speculation from get_speculative_stats(). The target's calls: its target_forward_passes (verify,
    re-anchor, reconciliation) and its standard_fallback_steps (a lookup that found nothing runs one plain step,
    not counted there); the prompt's pass is one of them (the first round's verification when its lookup hits),
    so the calls after the prefill are their sum less 1. acceptance: accepted over proposed, as attnzoo's (genai's
    own acceptance_rate divides by the candidates it examined up to the first rejected one: kept in "genai")."""
    target = int(raw.get("target_forward_passes", 0)) + int(raw.get("standard_fallback_steps", 0)) - 1
    proposed, accepted = int(raw.get("draft_tokens_proposed", 0)), int(raw.get("draft_tokens_accepted", 0))
    out = {
        "target_calls": target,
        "proposed": proposed,
        "accepted": accepted,
        "acceptance_rate": accepted / proposed if proposed else 0.0,
        "tokens_per_target_call": (n - 1) / max(target, 1),
        "genai": {k: v for k, v in raw.items() if isinstance(v, (int, float, bool))},
    }
    if raw.get("draft_forward_passes"):
        out["draft_calls"] = int(raw["draft_forward_passes"])
    return out
