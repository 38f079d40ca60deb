"""`attnzoo serve` on a two-node Ray cluster made on this machine: replicas on both nodes, sized by Ray Serve's own
autoscaler (they grow under load and shrink after), answers equal to each request alone, and a node stopped
mid-load: no request that can be retried is lost (serve/failover.py, in the head's HTTP proxy), a stream already
under way ends with a clean error event.

On loopback alone Ray 2.60 cannot form two nodes (it rewrites 127.0.0.1), so the test makes two network
namespaces joined by a veth pair, with addresses of its own (10.231.X.1/30 and .2/30) that exist only inside them:
the head node (`ray start --head`), the driver (`attnzoo serve --address A:P`) and the test's HTTP clients
(threads that entered the head's namespace) run in one, the second node in the other; no traffic leaves them.
Everything started runs inside those namespaces and is stopped by process id (`ip netns pids`), and the
namespaces deleted, even on failure. Needs root and iproute2's `ip` (skipped, saying why, without them);
about two minutes on 2 cores, so under -m slow.
"""

from __future__ import annotations

import ctypes
import http.client
import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from helpers import REPO, Piped

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]
MODEL = "cluster"
PORT = 8000  # the proxy's port inside the head's namespace (nothing else listens there)
RAY_PORT = 6390
CLONE_NEWNET = 0x40000000


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)


def _pids(ns: str) -> list[int]:
    out = _ip("netns", "pids", ns, check=False).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _stop_all(ns: str, grace_s: float = 10.0) -> None:
    """Stop every process inside namespace `ns`, by id: SIGTERM, then SIGKILL to what is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in _pids(ns):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        ends = time.monotonic() + grace_s
        while _pids(ns) and time.monotonic() < ends:
            time.sleep(0.2)
        if not _pids(ns):
            return


def _replicas(ns: str) -> int:
    """Ray Serve replicas of our app running inside namespace `ns` (their process titles name them)."""
    return sum("ServeReplica:attnzoo" in _cmdline(p) for p in _pids(ns))


def _wait(what: str, ok, timeout: float, load=None):
    ends = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > ends:
            raise AssertionError(f"{what} did not happen within {timeout:.0f} s")
        if load is not None and load.failed:
            raise AssertionError(f"the load failed while waiting for {what}: {load.failed[0]}")
        time.sleep(0.5)


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    """A random LLaMA's whole-model export with tiny-stdlib-llama's byte tokenizer beside it, its session and codec
    (the reference: each request run alone)."""
    transformers = pytest.importorskip("transformers")
    from export.lm_export import export_lm
    from peers.lm import lm_from_hf
    from runtime.session import OnnxSession
    from runtime.stopping import Codec

    config = transformers.LlamaConfig(
        vocab_size=259, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False,
    )  # fmt: skip
    import torch

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("cluster")
    out = folder / f"{MODEL}.onnx"
    export_lm(lm_from_hf(transformers.LlamaForCausalLM(config)).eval(), out, generation_config={"pad_token_id": 258})
    shutil.copy(REPO / "models" / "tiny-stdlib-llama" / "tokenizer.json", folder / f"{MODEL}.tokenizer.json")
    sess = OnnxSession(out, provider="cpu", verbose=False)
    return out, sess, Codec(str(folder / f"{MODEL}.tokenizer.json"))


@pytest.fixture(scope="module")
def cluster(lm, tmp_path_factory):
    """Two namespaces, a Ray node in each, `attnzoo serve --address` autoscaled 1..2 in the head's; yields
    (url, head namespace, worker namespace). Everything is stopped and deleted at the end."""
    if os.geteuid() != 0:
        pytest.skip("the two-node test makes network namespaces: it needs root")
    if shutil.which("ip") is None:
        pytest.skip("the two-node test needs iproute2's `ip` (apt-get install iproute2)")
    pytest.importorskip("ray")
    tag = f"{os.getpid() % 100000}"
    head, work = f"azh{tag}", f"azw{tag}"
    net = f"10.231.{random.randrange(256)}"
    a, b = f"{net}.1", f"{net}.2"
    made = _ip("netns", "add", head, check=False)
    if made.returncode:
        pytest.skip(f"cannot make a network namespace here: {made.stderr.strip()}")
    temp = Path(f"/tmp/azr{tag}")  # Ray's socket paths must stay short
    tmp = tmp_path_factory.mktemp("cluster_logs")
    procs: list[Piped] = []
    try:
        _ip("netns", "add", work)
        _ip("link", "add", f"vh{tag}", "type", "veth", "peer", "name", f"vw{tag}")
        for ns, end, addr in ((head, f"vh{tag}", a), (work, f"vw{tag}", b)):
            _ip("link", "set", end, "netns", ns)
            _ip("-n", ns, "addr", "add", f"{addr}/30", "dev", end)
            _ip("-n", ns, "link", "set", end, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": secrets.token_hex(16),  # the test's own: ~/.ray/auth_token is left alone
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH": "serve.failover.proxy_middlewares",
            "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "60",
            "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": "60",
            "RAY_health_check_period_ms": "1000",  # a stopped node is declared dead in seconds
            "RAY_health_check_failure_threshold": "3",
        }
        ray = str(Path(sys.executable).with_name("ray"))
        common = ["--num-cpus=1", "--disable-usage-stats", f"--temp-dir={temp}"]
        start_head = [
            ray,
            "start",
            "--head",
            f"--node-ip-address={a}",
            f"--port={RAY_PORT}",
            "--include-dashboard=false",
        ]
        join = [ray, "start", f"--address={a}:{RAY_PORT}", f"--node-ip-address={b}"]
        for ns, cmd in ((head, start_head), (work, join)):  # its daemons keep what they inherit: a file, no pipe
            with open(tmp / f"ray-start-{ns}.log", "w") as log:
                done = subprocess.run(["ip", "netns", "exec", ns, *cmd, *common], env=env, timeout=300,
                                      stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
            assert done.returncode == 0, (tmp / f"ray-start-{ns}.log").read_text()[-3000:]
        path = lm[0]
        serve = [
            sys.executable, "-m", "cli", "serve", str(path), "--address", f"{a}:{RAY_PORT}", "--host", a, "--port",
            str(PORT), "--autoscale", "1:2", "--target-ongoing-requests", "1", "--upscale-delay", "0",
            "--downscale-delay", "2", "--autoscale-window", "2", "--cpus-per-replica", "1", "--threads", "1",
            "--max-ongoing-requests", "2",
            "--max-batch", "4", "--batching", "continuous", "--capacity", "256", "--max-new-tokens", "200",
        ]  # fmt: skip
        driver = Piped(["ip", "netns", "exec", head, *serve], env)
        procs.append(driver)
        lines = driver.wait_for("ready:", timeout=600)
        assert lines[-1].startswith("ready:") and "1..2 replicas (autoscaled)" in lines[-1], lines
        yield f"http://{a}:{PORT}/", head, work, lines
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
                try:
                    p.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    pass
        for ns in (work, head):
            _stop_all(ns)
            _ip("netns", "delete", ns, check=False)
        serve_logs = temp / "session_latest" / "logs" / "serve"
        if serve_logs.is_dir():  # kept for a failure's reading (the pytest temp folder), Ray's own removed
            shutil.copytree(serve_logs, tmp / "serve", dirs_exist_ok=True)
        shutil.rmtree(temp, ignore_errors=True)


def _enter(ns: str) -> None:
    """Move the calling thread into namespace `ns` (its sockets are made there)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/var/run/netns/{ns}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns failed")
    finally:
        os.close(fd)


def _post(url: str, route: str, doc: dict, stream: bool):
    """(status, headers, body or the stream's events) of one POST, read whole."""
    host, port = url.split("//")[1].rstrip("/").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=300)
    try:
        conn.request("POST", route, json.dumps(doc), {"Content-Type": "application/json"})
        reply = conn.getresponse()
        raw = reply.read()
        headers = {k.lower(): v for k, v in reply.getheaders()}
        if not stream or reply.status != 200:
            return reply.status, headers, raw
        events = [ln[len(b"data: ") :] for ln in raw.split(b"\n") if ln.startswith(b"data: ")]
        return reply.status, headers, events
    finally:
        conn.close()


class Load:
    """Threads in the head's namespace sending requests until stopped: /generate (greedy token ids, answers carry
    their replica) and streamed /v1/completions (temperature 0), every answer kept with what was asked."""

    def __init__(
        self, url: str, ns: str, prompts: list[list[int]], threads: int = 6, new: int = 48, stream_new: int = 48
    ) -> None:
        self.url, self.prompts, self.new, self.stream_new = url, prompts, new, stream_new
        self.results: list[tuple] = []
        self.failed: list[str] = []
        self.stop = threading.Event()
        self.pool = ThreadPoolExecutor(threads, initializer=_enter, initargs=(ns,))
        self.futures = [self.pool.submit(self._run, i) for i in range(threads)]

    def _run(self, worker: int) -> None:
        n = 0
        while not self.stop.is_set():
            ids = self.prompts[(worker + n) % len(self.prompts)]
            stream = (worker + n) % 2 == 1
            try:
                if stream:
                    doc = {
                        "model": MODEL,
                        "prompt": ids,
                        "max_tokens": self.stream_new,
                        "temperature": 0,
                        "stream": True,
                    }
                    got = _post(self.url, "/v1/completions", doc, True)
                else:
                    got = _post(self.url, "/generate", {"input_ids": ids, "max_new_tokens": self.new}, False)
                new = self.stream_new if stream else self.new
                self.results.append((stream, ids, new, time.monotonic(), *got))
            except Exception as e:  # noqa: BLE001 - a cut connection is what the test looks for
                self.failed.append(f"{'stream' if stream else 'generate'}: {type(e).__name__}: {e}")
            n += 1

    def end(self) -> None:
        self.stop.set()
        for f in self.futures:
            f.result(timeout=600)
        self.pool.shutdown()


def _alone(lm, ids: list[int], new: int) -> tuple[list[int], str]:
    from runtime.generation import Generation

    _, sess, codec = lm
    tokens = Generation(sess, [ids], new).run()[0, len(ids) :].tolist()
    run = Generation(sess, [ids], new, tokenizer=codec.tok)
    run.run()
    return tokens, run.texts[0]


def _check_answers(lm, results) -> dict:
    """Every answer equal to its request alone; a stream cut by a lost replica a prefix of it, ending with the clean
    error event. Returns counts (retried: answers that took more than one attempt; cut: streams cut)."""
    cache: dict[tuple, tuple] = {}
    counts = {"generate": 0, "stream": 0, "retried": 0, "cut": 0}
    for stream, ids, new, _, status, headers, body in results:
        assert status == 200, (status, body)
        want_tokens, want_text = cache.setdefault((new, *ids), _alone(lm, ids, new))
        counts["retried"] += int(headers.get("x-attnzoo-failover", "1")) > 1
        if not stream:
            assert json.loads(body)["tokens"] == ids + want_tokens
            counts["generate"] += 1
            continue
        assert body[-1] == b"[DONE]", body[-3:]
        docs = [json.loads(e) for e in body[:-1]]
        text = "".join(d["choices"][0]["text"] for d in docs if d.get("choices"))
        if "error" in docs[-1]:  # cut mid-answer: what was sent stands, a clean end
            assert docs[-1]["error"]["code"] == "replica_lost" and want_text.startswith(text)
            counts["cut"] += 1
        else:
            assert text == want_text
            counts["stream"] += 1
    return counts


def _prompts(lm) -> list[list[int]]:
    codec = lm[2]
    return [codec.encode(t) for t in ("def main(", "import os\n", "class A:\n    ", "for i in range(", "x = [")]


def test_replicas_spread_over_both_nodes_grow_under_load_and_shrink_after(cluster, lm):
    url, head, work, lines = cluster
    assert not any("does not retry" in ln for ln in lines), lines  # the head's proxy runs serve/failover.py
    _wait("one replica running", lambda: _replicas(head) + _replicas(work) == 1, 300)
    load = Load(url, head, _prompts(lm))
    try:
        _wait("a second replica", lambda: _replicas(head) == 1 and _replicas(work) == 1, 300, load)
        seen = len(load.results)
        # answers from both nodes: each /generate answer names its replica's process, whose namespace says the node
        _wait("answers from both replicas", lambda: len(_nodes_answering(load.results[seen:])) == 2, 300, load)
    finally:
        load.end()
    assert not load.failed, load.failed[:3]
    counts = _check_answers(lm, load.results)
    assert counts["generate"] and counts["stream"] and not counts["cut"], counts
    _wait("the second replica gone after the load", lambda: _replicas(head) + _replicas(work) == 1, 300)


def _nodes_answering(results) -> dict[str, int]:
    """{namespace: /generate answers} (each answer names its replica's process, whose namespace says the node)."""
    out: dict[str, int] = {}
    for stream, *_, status, headers, _body in list(results):
        if not stream and status == 200 and "x-attnzoo-replica" in headers:
            pid = headers["x-attnzoo-replica"].rsplit(":", 1)[1]
            ns = _ip("netns", "identify", pid, check=False).stdout.strip()
            if ns:
                out[ns] = out.get(ns, 0) + 1
    return out


def test_a_node_stopped_mid_load_loses_no_request_that_can_be_retried(cluster, lm):
    """The second node's every process killed while both replicas answer: every /generate request and every stream
    not yet started is answered whole (the head's proxy sent it again), a stream under way ends with OpenAI's error
    event (code replica_lost) after a prefix of its answer; the surviving replica answers after."""
    url, head, work, _ = cluster
    load = Load(url, head, _prompts(lm), threads=8, stream_new=160)  # long streams: some under way at the stop
    try:
        _wait("a replica on each node", lambda: _replicas(head) == 1 and _replicas(work) == 1, 300, load)
        # the second node's replica in its stride (a few answers), so that it holds requests when it stops
        _wait("answers from both replicas", lambda: min(_nodes_answering(load.results).values(), default=0) >= 4 and
              len(_nodes_answering(load.results)) == 2, 300, load)  # fmt: skip
        for pid in _pids(work):  # the node stops at once: no goodbye to its peers
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        killed = time.monotonic()
        _wait("ten answers after the node stopped", lambda: sum(r[3] > killed for r in load.results) >= 10, 300, load)
    finally:
        load.end()
    assert not load.failed, load.failed[:3]
    counts = _check_answers(lm, load.results)
    assert counts["retried"] + counts["cut"] >= 1, counts  # some request was on the lost node when it stopped
    assert _replicas(work) == 0 and _replicas(head) == 1
    print(f"node lost mid-load: {counts}")
