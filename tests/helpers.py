"""Shared test helpers: registry names, and every preset at a width cheap enough for every test.

A preset wider than BIG_PARAMETERS is tested at a shrunken width that keeps everything that
makes it what it is (its layout, biases, GQA/MQA structure, causal mask and every modifier, with
values scaled so they still bite: a window shorter than the test sequences, a softcap small
enough that tanh bends the scores). Its real width is exported only in tests marked `slow`.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import torch

import zoo

ALL_NAMES = zoo.names()
BIG_PARAMETERS = 3_000_000


def init_parameters(cls: type) -> set[str]:
    """The names `cls(...)` takes, looking through decorators that hide them behind (*args, **kwargs):
    transformers 5.25 wraps attention classes' __init__ (use_kernelized_func) without functools.wraps, so
    the signature of cls.__init__ alone no longer shows `layer_idx`."""
    fn, names = cls.__init__, set()
    for _ in range(8):  # a few layers of wrappers at most
        params = inspect.signature(fn).parameters
        names |= {n for n, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
        if not any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params.values()):
            break
        cells = [c.cell_contents for c in fn.__closure__ or ()]
        inner = getattr(fn, "__wrapped__", None) or next(
            (c for c in cells if inspect.isfunction(c) and c.__name__ == "__init__"), None
        )
        if inner is None:
            break
        fn = inner
    return names - {"self"}


def is_big(name: str) -> bool:
    return zoo.count_parameters(zoo.spec(name)) > BIG_PARAMETERS


BIG_NAMES = [n for n in ALL_NAMES if is_big(n)]


def small_overrides(name: str) -> dict[str, Any]:
    """Spec overrides that shrink `name` to d_model 64 (none for a preset that is small already)."""
    s = zoo.spec(name)
    if not is_big(name):
        return {}
    heads = min(s.heads, 4)
    kv = None if s.kv_heads_ == s.heads else (1 if s.kv_heads_ == 1 else heads // 2)
    out: dict[str, Any] = {"d_model": 64, "heads": heads, "kv_heads": kv, "d_k": 16, "d_v": None}
    if s.is_cross:
        out["d_context"] = 48
    if s.rope_dim is not None:  # partial rotary: 16 rotated dims (what GroupQueryAttention's rotary
        # accepts), in heads widened to keep the preset's rotated fraction
        out["rope_dim"] = 16
        out["d_k"] = max(32, -(-16 * s.d_k_ // s.rope_dim // 16) * 16)  # a multiple of 16 (fp16 GQA)
    if s.kv_lora_rank is not None:  # latent attention: ranks as small as the heads
        out["kv_lora_rank"] = 32
        out["q_lora_rank"] = None if s.q_lora_rank is None else 24
    if s.window is not None:
        out["window"] = 3
    if s.softcap is not None:
        out["softcap"] = 0.5
    if s.chunk is not None:  # chunks shorter than the test sequences
        out["chunk"] = 3
    if s.temperature_floor is not None:
        out["temperature_floor"] = 2
    if s.rope_scaling is not None:
        # llama3 / yarn: a pretraining length the positions pass, so every band turns; longrope keeps its
        # own (the tests' splits of a decode would cross its switch, where splits differ by design: its
        # own tests cover that) and 8 pairs of each list
        if s.rope_scaling != "longrope":
            out["rope_original_max"] = 4
        else:
            rd = out.get("rope_dim") or out["d_k"]
            out["rope_short_factor"] = s.rope_short_factor[: rd // 2]
            out["rope_long_factor"] = s.rope_long_factor[-(rd // 2) :]
    return out


def small_spec(name: str) -> zoo.AttentionSpec:
    return zoo.spec(name, **small_overrides(name))


def create(name: str, **kw: Any) -> zoo.MultiHeadAttention:
    """zoo.create(name) at a test-sized width (see small_overrides)."""
    return zoo.create(name, **{**small_overrides(name), **kw})


def make_inputs(spec: zoo.AttentionSpec, b: int = 2, t: int = 5, s: int = 7, dtype=torch.float32):
    """x (b t c), context (b s c_ctx) or None, and the key length."""
    x = torch.randn(b, t, spec.d_model, dtype=dtype)
    if spec.is_cross:
        return x, torch.randn(b, s, spec.d_context, dtype=dtype), s
    return x, None, t


# The lowerings torch's exporter traces (about 2 s of CPU each); ort-gqa's graph is built by hand
# in milliseconds, so it joins every matrix whole.
TRACED_LOWERINGS = ("decomposed", "onnx-attention", "ort-mha")


# Presets named after a model family whose structure the other presets, the transformers family
# tests (tests/peers/test_hf.py: the same classes, every lowering) and the fuzzers already cover: in the
# default run each keeps one traced lowering per matrix (rotating); the rest runs under -m slow.
FAMILY_PRESETS = frozenset(
    {
        "qwen2-7b",
        "deepseek-v3",
        "mixtral-8x7b",
        "phi-3-mini-4k",
        "gpt-j-6b",
        "opt-1.3b",
        "gemma-3-12b-local",
        "gemma-3-12b-global",
        "starcoder2-7b",
        "llama-3.1-8b",
        "phi-3.5-mini",
        "llama-4-scout",
        "gpt-oss-20b",
        "t5-base-encoder",
        "modernbert-base",
        "modernbert-base-local",
        "whisper-base-encoder",
        "whisper-base-cross",
    }
)


def matrix(names: list[str], *, rotate: int | None, lowerings=None, families: bool = True, share: int | None = None):
    """pytest params (name, lowering) for a parity matrix, the costly cells marked `slow`.

    rotate=None: every name x every lowering, none slow. rotate=k: each name keeps one traced
    lowering in the default run (the k-th after its own index, so the names share the three
    lowerings out evenly) plus ort-gqa; its other traced lowerings run under `-m slow`.
    share=k (of 3): matrices that split the names between them, so that each name is traced once
    in the default run across all three: a name keeps its traced cell here only when its index is
    k modulo 3 (the lowering then turns with the index's third, so each lowering still meets a third
    of this matrix's names); ort-gqa, built by hand in milliseconds, stays with every name.
    A FAMILY_PRESETS name keeps only its rotating traced lowering in the default run, and only in the
    matrix its share names (a third of them per matrix), none with families=False (its kind of block is
    another preset's, and its transformers family is proven under ONNX Runtime in tests/peers/test_hf.py).
    """
    import pytest

    from export.names import LOWERINGS

    params = []
    for i, name in enumerate(names):
        mine = share is None or i % 3 == share
        turn_index = i if share is None else i // 3
        for lw in lowerings or LOWERINGS:
            turn = lw == TRACED_LOWERINGS[(turn_index + (rotate or 0)) % 3]
            quick = rotate is None or lw not in TRACED_LOWERINGS or (turn and mine)
            if name in FAMILY_PRESETS:
                quick = lw == TRACED_LOWERINGS[(i + (rotate or 0)) % 3] and families and mine
            marks = () if quick else (pytest.mark.slow,)
            params.append(pytest.param(name, lw, marks=marks, id=f"{name}-{lw}"))
    return params


# -- serving -----------------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port nobody listens on right now (bound once, then released)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Piped:
    """A child process whose stdout and stderr are drained line by line from the start by two threads, so that no
    line is lost between a buffered reader and the raw pipe and a full pipe never blocks the child (a test that
    read the first lines through the file object, then called `communicate()` on the raw pipe, lost the lines
    already buffered and failed only under load). Reads: `wait_for(prefix)`, `communicate(timeout)`; the rest is
    the Popen's (`pid`, `poll`, `returncode`, `send_signal`)."""

    def __init__(self, cmd: list[str], env: dict[str, str], **popen: Any) -> None:
        import subprocess
        import threading

        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
        self.out: list[str] = []
        self.err: list[str] = []
        self._changed = threading.Condition()
        self._readers = [
            threading.Thread(target=self._drain, args=(pipe, lines), daemon=True)
            for pipe, lines in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))
        ]
        self._open = len(self._readers)
        for t in self._readers:
            t.start()

    def _drain(self, pipe, lines: list[str]) -> None:
        for line in pipe:
            with self._changed:
                lines.append(line)
                self._changed.notify_all()
        with self._changed:
            self._open -= 1
            self._changed.notify_all()

    def wait_for(self, prefix: str, timeout: float = 900) -> list[str]:
        """stdout's lines up to and including the first that starts with `prefix`; AssertionError, with everything
        the child printed, if it ends (or `timeout`, a ceiling against a hang, not a measure, runs out) first."""

        def seen() -> bool:
            return any(line.startswith(prefix) for line in self.out) or self._open == 0

        with self._changed:
            self._changed.wait_for(seen, timeout)
            lines = list(self.out)
        found = [i for i, line in enumerate(lines) if line.startswith(prefix)]
        assert found, f"no line starting {prefix!r}:\n" + "".join(lines) + "".join(self.err)
        return lines[: found[0] + 1]

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Wait for the child to end (subprocess.TimeoutExpired past `timeout`), then every line of both pipes."""
        self.proc.wait(timeout)
        for t in self._readers:
            t.join()
        return "".join(self.out), "".join(self.err)

    def __getattr__(self, name: str):
        return getattr(self.proc, name)


def served(cmd: list[str], env: dict[str, str], port: int):
    """Run `cmd` (an `attnzoo serve` command line) in a process group of its own, as a terminal runs it; yield
    (url, the Piped process, its stdout lines up to the readiness line, which comes once /healthz answers). Killed
    with its group at the end if still running. A generator, for a fixture to `yield from`."""
    import os
    import signal

    proc = Piped(cmd, env, start_new_session=True)
    lines = proc.wait_for("ready:")
    assert proc.poll() is None, "".join(proc.out) + "".join(proc.err)
    yield f"http://127.0.0.1:{port}/", proc, lines
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def local_ray(request) -> None:
    """Start a local 2-CPU Ray for a module's Serve tests; stop Serve and Ray when it ends."""
    import pytest

    ray = pytest.importorskip("ray")
    from ray import serve

    from serve import init_local_ray

    init_local_ray(num_cpus=2)  # on loopback only, as `attnzoo serve` starts it

    def stop():
        try:
            serve.shutdown()
        finally:
            ray.shutdown()

    request.addfinalizer(stop)


def descendants(root: int) -> set[int]:
    """The pids of every living process below `root` (from /proc; Linux)."""
    import os

    parent: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    parent[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    out: set[int] = set()
    todo = [root]
    while todo:
        p = todo.pop()
        for child, pp in parent.items():
            if pp == p and child not in out:
                out.add(child)
                todo.append(child)
    return out


def listening_sockets(pids) -> list[tuple[str, int, int]]:
    """(address, port, pid) of every listening TCP socket the processes `pids` hold (/proc/net)."""
    import os
    import socket

    inodes: dict[str, int] = {}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes[link[8:-1]] = pid
    rows = []
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        with open(table) as f:
            next(f)
            for line in f:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state != "0A" or inode not in inodes:  # 0A: LISTEN
                    continue
                hexip, hexport = local.split(":")
                raw = bytes.fromhex(hexip)  # host-order 32-bit words
                raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
                rows.append((socket.inet_ntop(family, raw), int(hexport, 16), inodes[inode]))
    return sorted(rows)


def is_loopback(address: str) -> bool:
    import ipaddress

    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def one_line_error(capsys, argv: list[str]) -> str:
    """Run the CLI in-process; it must exit 2 with exactly one line on stderr (no traceback)."""
    from cli.main import main

    try:
        rc = main(argv)
    except SystemExit as e:  # argparse's own usage errors exit from inside parse_args
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2, (argv, rc, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, (argv, err)
    return lines[0]


REPO = Path(__file__).resolve().parents[1]  # the repository root, whatever folder a test lives in


def sentencepiece_tokenizer():
    """Llama-2's tokenizer.json shape over a tiny vocabulary (a `tokenizers.Tokenizer`): BPE with byte fallback,
    "▁" for spaces, a decoder that strips the text's first space."""
    from tokenizers import Tokenizer, decoders, models, normalizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
    for piece in ("▁", "▁Hello", "▁world", "▁caf", "é", "!", "▁x", "y", "\n"):
        vocab[piece] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return tok


def submit_concurrently(batcher, items: list, gap_s: float) -> list:
    """Every item (serve.generate.protocol.GenItem) submitted to a continuous batcher from its own task, the i-th after
    i * gap_s, some while a run goes on: the answers, in the items' order."""
    import asyncio

    from serve.generate.protocol import GenItem

    async def main():
        async def one(i, it):
            await asyncio.sleep(gap_s * i)
            return await batcher.submit(GenItem(it.ids, it.max_new_tokens, it.mask, it.eos_token_id, it.squeeze))

        return await asyncio.gather(*(one(i, it) for i, it in enumerate(items)))

    return asyncio.run(main())
