"""The serving benchmark (`attnzoo bench --serve`): attnzoo serve against llama.cpp's own server (llama-server), the
same model on both, each server in a process of its own, one client driving both (serve/loadtest/openai_bench.py).

    attnzoo bench --serve --llama-server /work/llama-server/build/bin/llama-server --precision fp32,int4 \\
        --concurrency 1,4,8,16 --rate 2,8 --requests 32 --threads 2 --slots 16 --json out.json --plot out.png

The model: the benchmark's random LLaMA (bench/checkpoints.py) with its eos id taken out of the generation config,
so that both servers make every request's max_tokens (llama-server is also sent `ignore_eos`); attnzoo serves its
whole-model ONNX export (`attnzoo export --checkpoint DIR --whole --precision P`: fp32, or int4 MatMulNBits), llama-
server its GGUF (bench/gguf_llama.py's F32 writer; Q4_0 by llama-quantize from the same build). Same threads (ONNX
Runtime's intra-op threads, llama-server's -t/-tb), same concurrent rows (attnzoo's --max-batch, llama-server's -np
slots, each slot `capacity` positions). Prompts are token ids, so no tokenizer stands between the two.
Memory: the largest resident set of the server's process tree while a level runs (attnzoo's includes its embedded
Ray: GCS, raylet, the replica), sampled every 0.2 s. scripts/build_llama_server.sh builds llama-server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from .jobs import BenchError

REPO = Path(__file__).resolve().parents[1]
LLAMA_QUANT = {"fp32": None, "int8": "Q8_0", "int4": "Q4_0"}


def tree_rss_mb(root: int) -> float | None:
    """The resident set (MB) of process `root` and all its descendants, from /proc; None once it is gone."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    total, todo, seen = 0, [root], set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            if pid == root:
                return None
        todo.extend(children.get(pid, []))
    return round(total / 1024, 1)


def _run(cmd: list[str], what: str, env: dict | None = None, timeout: float = 3600) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if done.returncode:
        raise BenchError(f"{what} failed ({done.returncode}): {(done.stderr or done.stdout)[-800:]}")


def prepare_models(work: Path, precisions: list[str], quantize: Path | None, gguf_py: Path | None) -> dict:
    """The checkpoint, then per precision the attnzoo export and the llama.cpp GGUF (each made in a process of its
    own): {(server, precision): path}."""
    folder = work / "checkpoint"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), str(gguf_py or "")) if p)}
    if not (folder / "config.json").is_file():
        code = (
            "import json, sys; from pathlib import Path; from bench.checkpoints import random_llama; "
            "f = random_llama(sys.argv[1]); g = Path(f) / 'generation_config.json'; d = json.loads(g.read_text()); "
            "d.pop('eos_token_id', None); g.write_text(json.dumps(d))"
        )
        _run([sys.executable, "-c", code, str(folder)], "writing the random LLaMA", env)
    models: dict = {}
    for p in precisions:
        onnx = work / f"attnzoo-{p}" / "model.onnx"
        if not onnx.is_file():
            cmd = [sys.executable, "-m", "cli", "export", "--checkpoint", str(folder), "--whole", "--precision", p]
            _run([*cmd, "-o", str(onnx)], f"exporting the {p} ONNX model", env)
        models[("attnzoo", p)] = onnx
        if gguf_py is None:
            continue
        f32 = work / "llama-f32.gguf"
        if not f32.is_file():
            code = "import sys; from bench.gguf_llama import write_llama_gguf as w; w(sys.argv[1], sys.argv[2])"
            _run([sys.executable, "-c", code, str(folder), str(f32)], "writing the F32 GGUF", env)
        quant = LLAMA_QUANT[p]
        if quant is None:
            models[("llama-server", p)] = f32
            continue
        out = work / f"llama-{quant}.gguf"
        if not out.is_file():
            if quantize is None:
                raise BenchError(f"{p} for llama-server needs llama-quantize beside llama-server")
            _run([str(quantize), str(f32), str(out), quant], f"llama-quantize {quant}")
        models[("llama-server", p)] = out
    return models


class Server:
    """A server process started for the benchmark, stopped (its process group) by `stop`."""

    def __init__(self, cmd: list[str], env: dict, url: str, log: Path) -> None:
        self.url, self.log = url, open(log, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait(self, path: str, timeout: float = 900) -> None:
        ends = time.monotonic() + timeout
        while time.monotonic() < ends:
            if self.proc.poll() is not None:
                raise BenchError(f"the server ended ({self.proc.returncode}); see {self.log.name}")
            try:
                with urllib.request.urlopen(self.url + path, timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise BenchError(f"{self.url}{path} did not answer within {timeout:.0f} s; see {self.log.name}")

    def rss(self) -> float | None:
        return tree_rss_mb(self.proc.pid)

    def stop(self) -> None:
        import signal

        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def start_server(kind: str, model: Path, port: int, threads: int, slots: int, capacity: int, work: Path, llama: Path):
    url = f"http://127.0.0.1:{port}/"
    if kind == "attnzoo":
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": str(threads)}
        cmd = [sys.executable, "-m", "cli", "serve", str(model), "--port", str(port), "--batching", "continuous"]
        cmd += ["--max-batch", str(slots), "--capacity", str(capacity), "--threads", str(threads)]
        cmd += ["--max-new-tokens", str(capacity), "--max-ongoing-requests", str(4 * slots)]
        server = Server(cmd, env, url, work / f"server-attnzoo-{model.parent.name}.log")
        server.wait("healthz")
        return server
    cmd = [str(llama), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-t", str(threads)]
    cmd += ["-tb", str(threads), "-np", str(slots), "-c", str(slots * capacity), "--no-webui"]
    server = Server(cmd, dict(os.environ), url, work / f"server-llama-{model.stem}.log")
    server.wait("health")
    return server


def served_model(url: str) -> str:
    with urllib.request.urlopen(url + "v1/models", timeout=30) as r:
        return json.loads(r.read())["data"][0]["id"]


def run(
    *,
    precisions: list[str],
    servers: list[str],
    concurrency: list[int],
    rates: list[float],
    threads: int,
    slots: int,
    capacity: int,
    seed: int,
    work: Path,
    llama: Path | None,
    asks: list,
    run_level,
    progress=None,
) -> dict[str, Any]:
    """Every (precision, server, level): the servers one at a time, each started fresh per precision. `asks` (the
    workload) and `run_level` (one level against a URL) are serve.loadtest.openai_bench's, passed in by the CLI
    (bench sits beside serve in the layers, not above it)."""
    from .machine import machine_info

    if "llama-server" in servers and (llama is None or not llama.is_file()):
        raise BenchError(f"--llama-server {llama}: no such file; build it with scripts/build_llama_server.sh")
    gguf_py = None
    if llama is not None:
        found = [p / "vendor/llama.cpp/gguf-py" for p in llama.resolve().parents if (p / "vendor/llama.cpp").is_dir()]
        gguf_py = found[0] if found else (llama.resolve().parents[2] / "src/vendor/llama.cpp/gguf-py")
    quantize = llama.with_name("llama-quantize") if llama is not None else None
    work.mkdir(parents=True, exist_ok=True)
    models = prepare_models(work, precisions, quantize, gguf_py if "llama-server" in servers else None)
    load_before = round(os.getloadavg()[0], 2)  # the host is shared: its 1-minute load, before and after
    levels = [("concurrency", c) for c in concurrency] + [("rate", r) for r in rates]
    rows = []
    port = 8700 + os.getpid() % 200
    for p in precisions:
        for kind in servers:
            port += 1  # a port of its own per server: the last one's may still be held a moment after it stops
            server = start_server(kind, models[(kind, p)], port, threads, slots, capacity, work, llama)
            try:
                model = served_model(server.url)
                extra = {"ignore_eos": True} if kind == "llama-server" else {}
                run_level(server.url, model, asks[:2], concurrency=1, extra=extra)  # warm-up, not reported
                idle = server.rss()  # warm, no request under way (attnzoo's: its Ray daemons too)
                for mode, value in levels:
                    kw = {"concurrency": value} if mode == "concurrency" else {"rate": value, "seed": seed}
                    row = run_level(server.url, model, asks, extra=extra, sampler=server.rss, **kw)
                    row.update({"server": kind, "precision": p, "idle_rss_mb": idle})
                    rows.append(row)
                    if progress:
                        progress(row)
            finally:
                server.stop()
    lengths = {"prompt": [len(a.prompt) for a in asks], "output": [a.max_tokens for a in asks]}
    machine = machine_info()
    flags = (
        Path("/proc/cpuinfo").read_text().split("flags", 1)[-1].split("\n", 1)[0]
        if Path("/proc/cpuinfo").exists()
        else ""
    )
    machine["avx512f"] = " avx512f" in flags
    machine["load_before_after"] = [load_before, round(os.getloadavg()[0], 2)]
    return {
        "machine": machine,
        "threads": threads,
        "slots": slots,
        "capacity": capacity,
        "requests": len(asks),
        "seed": seed,
        "lengths": lengths,
        "rows": rows,
    }


def markdown(report: dict, table: str) -> str:
    """The page beside the JSON: what ran, on what, the table and the command."""
    m = report["machine"]
    lengths = report["lengths"]
    mean = {k: round(sum(v) / len(v), 1) for k, v in lengths.items()}
    return (
        f"# attnzoo serve against llama.cpp's llama-server\n\n"
        f"CPU: {m.get('cpu')} ({m.get('usable_cpus')} usable cores, avx512f: {'yes' if m.get('avx512f') else 'no'}); "
        f"1-minute load before / after: {m['load_before_after'][0]} / {m['load_before_after'][1]} (a shared host).\n"
        f"{report['threads']} threads each, {report['slots']} concurrent rows (attnzoo --max-batch, llama-server -np), "
        f"{report['capacity']} positions per row; {report['requests']} requests per level, prompt / output tokens "
        f"mean {mean['prompt']} / {mean['output']} (seeded, ShareGPT-shaped).\n\n{table}\n\nCommand: "
        f"`{report['command']}`\n"
    )


def plot(report: dict, path: Path) -> None:
    """Output tokens/s and TTFT p99 against the load, a line per (server, precision)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for col, mode in enumerate(("concurrency", "rate")):
        for key in sorted({(r["server"], r["precision"]) for r in report["rows"]}):
            rows = [r for r in report["rows"] if (r["server"], r["precision"]) == key and r["mode"] == mode]
            if not rows:
                continue
            xs = [r["value"] for r in rows]
            axes[0][col].plot(xs, [r["output_tokens_per_s"] for r in rows], marker="o", label=" ".join(key))
            axes[1][col].plot(xs, [r["ttft_ms"]["p99"] for r in rows], marker="o", label=" ".join(key))
        axes[0][col].set_title(f"output tokens/s by {mode}")
        axes[1][col].set_title(f"TTFT p99 (ms) by {mode}")
        axes[1][col].set_xlabel("concurrent clients" if mode == "concurrency" else "Poisson arrivals, req/s")
        for ax in (axes[0][col], axes[1][col]):
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
