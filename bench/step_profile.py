"""One decode step under ONNX Runtime's profiler, attnzoo's whole model or onnxruntime-genai's, each in its own
process: `PYTHON step_profile.py JOB_JSON` (scripts/profile_step.py starts them and writes the report).

Like bench/generate_peers.py this file imports only the standard library at the top: it runs under
onnxruntime-genai's python too, which brings its own onnxruntime. attnzoo's path imports runtime inside its
functions (the parent sets PYTHONPATH for it).

A job (JSON): {"path": "attnzoo"|"onnxruntime-genai", "model": the built model (ONNX file, genai folder),
"prompt": [ids], "new": N, "threads": T, "repeats": R, "vocab": V, "layers": L, "trace_dir": DIR}.

Each worker does two things with the same prompt and N:
- unprofiled: a warm-up, then R rounds of generate(1) and generate(N), the best of each (the bench's timing:
  bench/generate_peers.py); step ms = (best N - best 1) / (N - 1). attnzoo's worker also times its session's
  run calls (run_with_iobinding) inside those rounds: the step's host time without the profiler is the step
  less the run.
- profiled: a second session with enable_profiling (attnzoo: SessionOptions through RuntimeSession's
  profile=True; genai: "enable_profiling" in genai_config.json's session_options, a copy of the folder),
  a warm-up generate(N), then one generate(N) whose decode runs are read back from the trace (summarize).
The one result line on stdout starts with RESULT_MARK.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import time

try:  # attnzoo's error root where attnzoo is importable (the bench's own process, the tests)
    from zoo.errors import AttnzooError

    _ROOTS: tuple[type, ...] = (AttnzooError, ValueError)
except ImportError:  # onnxruntime-genai's environment: there the worker turns any exception into the row's error
    _ROOTS = (ValueError,)


class ProfileError(*_ROOTS):
    """A profile this worker cannot read (no trace written, no decode runs in it); the message says which."""


RESULT_MARK = "ATTNZOO-STEP-PROFILE-RESULT "


def _best_step(generate, new: int, repeats: int) -> dict:
    generate(1)
    generate(new)
    one = every = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        generate(1)
        one = min(one, time.perf_counter() - t0)
        t0 = time.perf_counter()
        generate(new)
        every = min(every, time.perf_counter() - t0)
    return {"end_to_end_s": every, "prefill_s": one, "step_ms": (every - one) / (new - 1) * 1e3}


# ---- attnzoo ----
def _attnzoo_session(job: dict, profile: bool):
    from runtime.session import OnnxSession

    return OnnxSession(job["model"], provider="cpu", threads=job["threads"], verbose=False, profile=profile)


def attnzoo(job: dict) -> dict:
    import numpy as np

    ids = np.asarray([job["prompt"]], dtype=np.int64)
    sess = _attnzoo_session(job, profile=False)
    marks: list[tuple[float, float]] = []
    run = sess.run_with_iobinding

    def timed(binding, options=None):  # each run's start and end, read from Python
        t0 = time.perf_counter()
        run(binding, options)
        marks.append((t0, time.perf_counter()))

    sess.run_with_iobinding = timed
    out = _best_step(lambda n: sess.generate(ids, max_new_tokens=n), job["new"], job["repeats"])
    # R more calls of N, their decode runs read one by one: the median wall (a run's start to the next's),
    # run and host time (wall less run: the loop's Python and the binding's call) a step
    walls, runs, hosts = [], [], []
    for _ in range(job["repeats"]):
        marks.clear()
        sess.generate(ids, max_new_tokens=job["new"])
        steps = marks[len(marks) - (job["new"] - 1) :]
        for (a0, a1), (b0, _) in zip(steps, steps[1:]):
            walls.append(b0 - a0)
            runs.append(a1 - a0)
            hosts.append(b0 - a1)
    out.update({k: statistics.median(v) * 1e6 for k, v in (("wall_us", walls), ("run_us", runs), ("host_us", hosts))})
    sess = None
    prof = _attnzoo_session(job, profile=True)
    prof.generate(ids, max_new_tokens=job["new"])  # the warm-up
    prof.generate(ids, max_new_tokens=job["new"])
    trace = prof.end_profiling()
    out["trace"] = _keep(trace, job, "attnzoo")
    return out


# ---- onnxruntime-genai ----
def _genai_generate(model, prompt: list[int]):
    import onnxruntime_genai as og

    def generate(n: int) -> list[int]:
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(prompt) + n, min_length=len(prompt) + n, do_sample=False)
        generator = og.Generator(model, params)
        generator.append_tokens(prompt)
        out = []
        while not generator.is_done():
            generator.generate_next_token()
            out.append(int(generator.get_next_tokens()[0]))
        return out

    return generate


def genai(job: dict) -> dict:
    import onnxruntime_genai as og

    model = og.Model(job["model"])
    out = _best_step(_genai_generate(model, job["prompt"]), job["new"], job["repeats"])
    del model
    folder = os.path.join(job["trace_dir"], "genai-profiled")
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(job["model"], folder, ignore=shutil.ignore_patterns("*.json"))
    with open(os.path.join(job["model"], "genai_config.json")) as f:
        config = json.load(f)
    prefix = os.path.join(job["trace_dir"], "genai-trace")
    config["model"]["decoder"].setdefault("session_options", {})["enable_profiling"] = prefix
    config["model"]["decoder"]["session_options"]["intra_op_num_threads"] = job["threads"]
    for name in os.listdir(job["model"]):
        if name.endswith(".json") and name != "genai_config.json":
            shutil.copy(os.path.join(job["model"], name), folder)
    with open(os.path.join(folder, "genai_config.json"), "w") as f:
        json.dump(config, f, indent=2)
    before = set(os.listdir(job["trace_dir"]))
    model = og.Model(folder)
    generate = _genai_generate(model, job["prompt"])
    generate(job["new"])  # the warm-up
    generate(job["new"])
    del generate, model  # the session ends: ONNX Runtime writes its trace
    written = [n for n in set(os.listdir(job["trace_dir"])) - before if n.startswith("genai-trace")]
    if len(written) != 1:
        raise ProfileError(f"expected one profile from onnxruntime-genai in {job['trace_dir']}, found {written}")
    out["trace"] = _keep(os.path.join(job["trace_dir"], written[0]), job, "onnxruntime-genai")
    shutil.rmtree(folder, ignore_errors=True)
    return out


def _keep(trace: str, job: dict, path: str) -> str:
    target = os.path.join(job["trace_dir"], f"{path}-trace.json")
    shutil.move(trace, target)
    return target


# ---- the trace, read back (no onnxruntime needed) ----
def _is_decode(nodes: list[dict], vocab: int) -> bool | None:
    """A run's token count from its embedding Gather (a float (vocab, d) table, then the ids): True at one
    token a row, None where no such Gather ran."""
    for e in nodes:
        args = e.get("args", {})
        shapes = args.get("input_type_shape") or []
        if args.get("op_name") != "Gather" or len(shapes) < 2:
            continue
        table = next(iter(shapes[0].values()), [])
        ids = next(iter(shapes[1].values()), [])
        if len(table) == 2 and table[0] == vocab and ids:
            return ids[-1] == 1
    return None


def summarize(events: list[dict], vocab: int, layers: int, last: int) -> dict:
    """Per decode step, over the `last` decode runs of a trace (the profiled generate(N)): the median wall
    (one run's start to the next's), the run (model_run), the host time between runs, the sum of node time,
    and per op type its node time and count a step (means)."""
    runs = sorted((e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"), key=_ts)
    nodes = sorted((e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")), key=_ts)
    per_run: list[list[dict]] = [[] for _ in runs]
    r = 0
    for e in nodes:
        while r < len(runs) and _ts(e) > _ts(runs[r]) + runs[r]["dur"]:
            r += 1
        if r < len(runs) and _ts(e) >= _ts(runs[r]):
            per_run[r].append(e)
    decode = [i for i, ns in enumerate(per_run) if _is_decode(ns, vocab)]
    if len(decode) < 2:
        raise ProfileError(f"the trace holds {len(decode)} decode runs (one token a row): nothing to summarize")
    chosen = decode[-last:] if last else decode
    followed = [i for i in chosen if i + 1 < len(runs)]  # a step's wall: to the next run's start
    walls = [_ts(runs[i + 1]) - _ts(runs[i]) for i in followed]
    hosts = [_ts(runs[i + 1]) - _ts(runs[i]) - runs[i]["dur"] for i in followed]
    ops: dict[str, dict] = {}
    for i in chosen:
        for e in per_run[i]:
            op = e["args"].get("op_name", "?")
            row = ops.setdefault(op, {"us": 0.0, "count": 0})
            row["us"] += e["dur"]
            row["count"] += 1
    n = len(chosen)
    table = {op: {"us": v["us"] / n, "count": v["count"] / n} for op, v in ops.items()}
    matmuls = table.get("MatMul", {}).get("count", 0) + table.get("MatMulNBits", {}).get("count", 0)
    return {
        "steps": n,
        "wall_us": statistics.median(walls) if walls else None,
        "run_us": statistics.median(runs[i]["dur"] for i in chosen),
        "host_us": statistics.median(hosts) if hosts else None,
        "nodes_us": statistics.median(sum(e["dur"] for e in per_run[i]) for i in chosen),
        "nodes": statistics.median(len(per_run[i]) for i in chosen),
        "matmuls_per_layer": (matmuls - 1) / layers,  # less the head's
        "ops": dict(sorted(table.items(), key=lambda kv: -kv[1]["us"])),
    }


def _ts(e: dict) -> int:
    return int(e["ts"])


PATHS = {"attnzoo": attnzoo, "onnxruntime-genai": genai}


def main(argv: list[str]) -> int:
    job = json.loads(argv[1])
    load = os.getloadavg()[0]
    try:
        result = {"ok": True, **PATHS[job["path"]](job)}
        with open(result["trace"]) as f:
            events = json.load(f)
        result["profile"] = summarize(events, job["vocab"], job["layers"], job["new"] - 1)
        import onnxruntime

        result["onnxruntime"] = onnxruntime.__version__
    except Exception as e:  # noqa: BLE001 - any failure becomes the row's note, not a crash
        first = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
        result = {"ok": False, "error": f"{type(e).__name__}: {first}"}
    result["load_avg"] = [load, os.getloadavg()[0]]
    result["python"] = sys.executable
    print(RESULT_MARK + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        sys.path.pop(0)  # run as a file: bench/'s own modules must not shadow anything
    sys.exit(main(sys.argv))
