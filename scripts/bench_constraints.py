"""What a JSON-schema constraint (runtime/constraints.py, llguidance) costs per decode step, against the same
request unconstrained, each path in its own process, on two models: the shipped tiny-stdlib-llama (byte
tokenizer, vocabulary 259) and the benchmark's random LLaMA (scripts/profile_generate.py: hidden 512, 8 layers,
vocabulary 8000) over a BPE tokenizer of 8000 ids trained here on the Python standard library's sources.

    python scripts/bench_constraints.py [--prompt 128] [--new 128] [--repeats 3] [--threads 2] \\
        [--json docs/bench/constrained-decoding.json]

Each path runs OnnxSession.generate's Generation (B 1, a prompt of --prompt tokens) --repeats times after one
warm-up and reports its best decode ms per step (decode_s / steps), and, constrained, the ms per step spent in
the constraint (llguidance's mask and its application) and the tokens made. The schema asks for a long object
(a 24-character title, four tags, a year: about 80 bytes), which both models complete within --new tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "minLength": 24, "maxLength": 24},
        "tags": {
            "type": "array",
            "items": {"type": "string", "minLength": 4, "maxLength": 6},
            "minItems": 4,
            "maxItems": 4,
        },
        "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
    },
    "required": ["title", "tags", "year"],
    "additionalProperties": False,
}
SAMPLED = {"temperature": 0.8, "top_p": 0.95, "seed": 0}
PATHS = [(c, s) for c in (False, True) for s in (False, True)]


def _models(folder: Path) -> dict[str, tuple[Path, Path]]:
    """{name: (onnx, tokenizer.json)}, exported / trained once into `folder`."""
    from profile_generate import exported

    out = {}
    stdlib = folder / "tiny-stdlib-llama.onnx"
    if not stdlib.is_file():
        import zoo
        from export import export_onnx

        export_onnx(zoo.lm_from_checkpoint(ROOT / "models" / "tiny-stdlib-llama"), stdlib)
    out["tiny-stdlib-llama (vocab 259)"] = (stdlib, ROOT / "models" / "tiny-stdlib-llama" / "tokenizer.json")
    tok = folder / "bpe-8000.json"
    if not tok.is_file():
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        bpe = Tokenizer(models.BPE())
        bpe.pre_tokenizer, bpe.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=8000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        files = sorted(str(p) for p in Path(os.__file__).parent.glob("*.py"))
        bpe.train(files, trainer)
        bpe.save(str(tok))
    out["random LLaMA 512x8 (vocab 8000)"] = (exported("fp32", folder), tok)
    return out


def worker(args) -> dict:
    import numpy as np
    from tokenizers import Tokenizer

    from export import OnnxSession
    from runtime.constraints import GrammarConstraint
    from runtime.generation import Generation

    sess = OnnxSession(args.onnx, provider="cpu", threads=args.threads, verbose=False)
    tok = Tokenizer.from_file(args.tokenizer)
    text = (ROOT / "scripts" / "held_out_snippet.txt").read_text()
    ids = tok.encode(text * 20).ids[: args.prompt]
    knobs = {**(SAMPLED if args.sampled else {}), **({"json_schema": SCHEMA} if args.constrained else {})}
    spent = [0.0]
    original = GrammarConstraint.__call__

    def timed(self, input_ids, scores):
        t0 = time.perf_counter()
        try:
            return original(self, input_ids, scores)
        finally:
            spent[0] += time.perf_counter() - t0

    GrammarConstraint.__call__ = timed
    best = None
    for round_ in range(args.repeats + 1):  # the first is a warm-up
        spent[0] = 0.0
        run = Generation(sess, np.asarray([ids]), args.new, tokenizer=tok, eos_token_id=[], **knobs)
        run.run()
        steps = max(run.timings["steps"], 1)
        got = {
            "decode_ms_per_step": 1e3 * run.timings["decode_s"] / steps,
            "constraint_ms_per_step": 1e3 * spent[0] / (steps + 1),
            "tokens": run.made,
            "valid": None,
        }
        if args.constrained:
            try:
                json.loads(run.texts[0])
                got["valid"] = True
            except ValueError:
                got["valid"] = False
        if round_ and (best is None or got["decode_ms_per_step"] < best["decode_ms_per_step"]):
            best = got
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", help="write the results here, and the table beside it (.md)")
    ap.add_argument("--folder", default=str(Path(tempfile.gettempdir()) / "attnzoo-bench-constraints"))
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--onnx", help=argparse.SUPPRESS)
    ap.add_argument("--tokenizer", help=argparse.SUPPRESS)
    ap.add_argument("--constrained", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--sampled", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return
    folder = Path(args.folder)
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, (onnx, tok) in _models(folder).items():
        for constrained, sampled in PATHS:
            cmd = [sys.executable, __file__, "--worker", "--onnx", str(onnx), "--tokenizer", str(tok)]
            cmd += ["--prompt", str(args.prompt), "--new", str(args.new), "--repeats", str(args.repeats)]
            cmd += ["--threads", str(args.threads)] + ["--constrained"] * constrained + ["--sampled"] * sampled
            out = subprocess.run(
                cmd, capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)}
            )
            got = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append({"model": name, "constrained": constrained, "sampled": sampled, **got})
            print(rows[-1], flush=True)
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    avx512 = "avx512f" in open("/proc/cpuinfo").read()
    load = os.getloadavg()
    report = {
        "cpu": cpu,
        "avx512f": avx512,
        "cores": os.cpu_count(),
        "load": [round(x, 1) for x in load],
        "python": platform.python_version(),
        "prompt": args.prompt,
        "new": args.new,
        "threads": args.threads,
        "repeats": args.repeats,
        "schema": SCHEMA,
        "rows": rows,
    }
    table = _table(report, args)
    print(table)
    if args.json:
        from zoo.files import write_atomic

        write_atomic(args.json, lambda tmp: tmp.write_text(json.dumps(report, indent=1) + "\n"))
        write_atomic(Path(args.json).with_suffix(".md"), lambda tmp: tmp.write_text(table + "\n"))


def _table(report: dict, args) -> str:
    lines = [
        f"Constrained decoding: B 1, prompt {report['prompt']}, up to {report['new']} new tokens, {report['threads']} "
        f"threads, best of {report['repeats']} after 1 warm-up; {report['cpu']} "
        f"({'AVX-512' if report['avx512f'] else 'no AVX-512'}, {report['cores']} cores), load "
        + ", ".join(map(str, report["load"])),
        "",
        "| model | choice | constraint | decode ms/step | of which constraint ms | tokens | JSON parses |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    base = {}
    for r in report["rows"]:
        key = (r["model"], r["sampled"])
        if not r["constrained"]:
            base[key] = r["decode_ms_per_step"]
        extra = f" ({r['decode_ms_per_step'] / base[key]:.2f}x)" if r["constrained"] and key in base else ""
        lines.append(
            f"| {r['model']} | {'sampled' if r['sampled'] else 'greedy'} | "
            f"{'JSON schema' if r['constrained'] else 'none'} | {r['decode_ms_per_step']:.2f}{extra} | "
            f"{r['constraint_ms_per_step']:.3f} | {r['tokens']} | "
            f"{'' if r['valid'] is None else ('yes' if r['valid'] else 'no')} |"
        )
    command = f"python scripts/bench_constraints.py --prompt {args.prompt} --new {args.new} --repeats {args.repeats}"
    command += f" --threads {args.threads}" + (f" --json {args.json}" if args.json else "")
    lines += ["", f"Command: `{command}`"]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
