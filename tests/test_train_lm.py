"""The shipped checkpoint (models/tiny-stdlib-llama) and the script that trains it (scripts/train_lm.py):
the folder loads with transformers and generates byte text; the script's data split, tokenizer and
determinism on a tiny budget."""

from __future__ import annotations

import hashlib
import importlib.util
import json

import pytest

from helpers import REPO

FOLDER = REPO / "models" / "tiny-stdlib-llama"


@pytest.fixture(scope="module")
def train_lm():
    spec = importlib.util.spec_from_file_location("train_lm", REPO / "scripts" / "train_lm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def fake_stdlib(tmp_path_factory):
    root = tmp_path_factory.mktemp("stdlib")
    files = {
        "os.py": "import sys\n",
        "json/decoder.py": "x = 1\n",
        "test/test_os.py": "bad\n",
        "site-packages/pkg/mod.py": "bad\n",
        "idlelib/idle_test/t.py": "bad\n",
        "notes.txt": "bad\n",
    }
    files.update(
        {
            name: f"# {name}\ndef f():\n    return 'é'\n"
            for name in ("bisect.py", "colorsys.py", "fractions.py", "heapq.py", "shlex.py", "textwrap.py")
        }
    )
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
    return root


def test_corpus_is_sorted_python_outside_tests_and_site_packages(train_lm, fake_stdlib):
    files = [p.relative_to(fake_stdlib).as_posix() for p in train_lm.corpus_files(fake_stdlib)]
    assert files == sorted(files)
    assert "os.py" in files and "json/decoder.py" in files
    assert not [f for f in files if "test" in f or "site-packages" in f or not f.endswith(".py")]


def test_held_out_files_are_the_named_ones_and_never_trained_on(train_lm, fake_stdlib):
    files = train_lm.corpus_files(fake_stdlib)
    train, held = train_lm.split_files(files, fake_stdlib)
    assert sorted(p.name for p in held) == sorted(train_lm.HELD_OUT)
    assert not set(train) & set(held) and len(train) + len(held) == len(files)
    with pytest.raises(SystemExit, match="lacks the held-out files"):
        train_lm.split_files([p for p in files if p.name != "heapq.py"], fake_stdlib)


def test_files_encode_as_bytes_between_bos_and_eos(train_lm, fake_stdlib):
    ids = train_lm.encode_files([fake_stdlib / "os.py"])
    assert ids == [train_lm.BOS, *b"import sys\n", train_lm.EOS]


def test_training_is_bit_reproducible_on_a_tiny_budget(train_lm, fake_stdlib, monkeypatch):
    """Two runs of two steps from the same seed give the same weights, bit for bit."""
    import torch

    monkeypatch.setattr(train_lm, "CONTEXT", 16)
    monkeypatch.setattr(train_lm, "BATCH", 2)
    monkeypatch.setattr(
        train_lm, "SHAPE", {**train_lm.SHAPE, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1}
    )
    ids = train_lm.encode_files(train_lm.corpus_files(fake_stdlib))
    threads = torch.get_num_threads()
    torch.set_num_threads(train_lm.THREADS)
    try:
        with torch.random.fork_rng():
            runs = [train_lm.train(ids, 2, lambda line: None)[0].state_dict() for _ in range(2)]
    finally:
        torch.set_num_threads(threads)
    assert runs[0].keys() == runs[1].keys()
    assert all(torch.equal(runs[0][k], runs[1][k]) for k in runs[0])


def test_shipped_checkpoint_is_small_gqa_and_matches_its_record():
    config = json.loads((FOLDER / "config.json").read_text())
    assert config["model_type"] == "llama" and config["num_key_value_heads"] < config["num_attention_heads"]
    assert config["vocab_size"] == 259
    size = sum(f.stat().st_size for f in FOLDER.iterdir())
    assert size < 10e6, f"{FOLDER} is {size / 1e6:.1f} MB"
    record = json.loads((FOLDER / "training.json").read_text())
    digest = hashlib.sha256((FOLDER / "model.safetensors").read_bytes()).hexdigest()
    assert record["safetensors_sha256"] == digest
    assert digest in (FOLDER / "README.md").read_text()


def test_shipped_checkpoint_loads_with_transformers_and_generates_text():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer

    model = transformers.AutoModelForCausalLM.from_pretrained(FOLDER, dtype=torch.float32).eval()
    tok = Tokenizer.from_file(str(FOLDER / "tokenizer.json"))
    prompt = "def "
    ids = torch.tensor([[256, *tok.encode(prompt, add_special_tokens=False).ids]])
    with torch.inference_mode():
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False, pad_token_id=258
        )
    new = out[0, ids.shape[1] :].tolist()
    assert len(new) == 24 and all(0 <= t < 259 for t in new)
    text = tok.decode(new)
    printable = sum(c.isprintable() or c in "\n\t" for c in text)
    assert printable >= 0.9 * len(text), text  # bytes of source text, not noise


def test_a_repeating_window_goes_back_and_repeats_its_own_text(train_lm, monkeypatch):
    """--repeats: the window's text up to k, then its own text again from an earlier point u, CONTEXT + 1 long."""
    import torch

    monkeypatch.setattr(train_lm, "CONTEXT", 64)
    data = torch.arange(1000)
    gen = torch.Generator().manual_seed(0)
    assert torch.equal(train_lm.window(data, 10, False, gen), data[10:75])
    for _ in range(20):
        x = train_lm.window(data, 100, True, gen)
        assert len(x) == 65
        k = int((x[1:] <= x[:-1]).nonzero()[0]) + 1  # where it goes back
        u = int(x[k]) - 100
        assert 16 <= k < 48 and 0 <= u <= k - 16
        assert torch.equal(x[:k], data[100 : 100 + k]) and torch.equal(x[k:], data[100 + u : 100 + u + 65 - k])


def test_shipped_checkpoint_continues_text_it_was_just_shown(train_lm):
    """Issue 54's prompt: two functions, then the first again and `def sub(`: a model that copies answers the `sub`
    it was shown (what prompt lookup's candidates need); the first checkpoint answered `self, code=None)` (its prior),
    the one retrained on repeating windows `self, other):`, the one with an induction head `a, b):\n    return a =
    b` (the shape, not the bytes); the one shipped since writes `a - b`."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")

    model = transformers.AutoModelForCausalLM.from_pretrained(FOLDER, dtype=torch.float32).eval()
    ids = torch.tensor([[train_lm.BOS, *train_lm.COPY_PROMPT.encode()]])
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=26, do_sample=False)
    assert bytes(out[0, ids.shape[1] :].tolist()).startswith(b"a, b):\n    return a - b\n"), out
    record = json.loads((FOLDER / "training.json").read_text())
    assert record["copy_rate"] >= train_lm.COPIES and record["context"] > 256


def test_shape_flags_train_another_shape_of_the_same_tokenizer(train_lm, tmp_path, monkeypatch):
    """--hidden/--layers/--heads/--kv-heads/--intermediate (a draft's shape): the folder's config says it, its
    tokenizer is the shipped one's, its README says what it is and names the flags; a shape that cannot split into
    heads is refused."""
    import torch

    for name in ("CONTEXT", "BATCH", "REPEATS", "LR", "SHAPE", "THREADS"):  # main() sets them: restored after
        monkeypatch.setattr(train_lm, name, getattr(train_lm, name))
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    try:
        _train_a_draft_shape(train_lm, tmp_path)
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)


def _train_a_draft_shape(train_lm, tmp_path):
    out = tmp_path / "tiny-draft"
    flags = ["--hidden", "32", "--layers", "1", "--heads", "2", "--kv-heads", "1", "--intermediate", "48"]
    assert train_lm.main(["--steps", "2", "--context", "16", "--batch", "2", *flags, "-o", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"]) == (32, 1, 2)
    assert (config["num_key_value_heads"], config["intermediate_size"]) == (1, 48)
    assert (out / "tokenizer.json").read_text() == (FOLDER / "tokenizer.json").read_text()
    readme = (out / "README.md").read_text()
    assert "a draft for speculative decoding" in readme and " ".join(flags) in readme
    assert "hidden 32, 1 layers, 2 heads of 16" in readme
    with pytest.raises(SystemExit):
        train_lm.main(["--hidden", "30", "--heads", "4", "-o", str(tmp_path / "bad")])


def test_a_synthetic_window_is_a_random_printable_span_repeated(train_lm, monkeypatch):
    """--synthetic: random printable bytes no prior predicts, shown, then again and again (CONTEXT + 1 long)."""
    import torch

    monkeypatch.setattr(train_lm, "CONTEXT", 64)
    gen = torch.Generator().manual_seed(0)
    spans = set()
    for _ in range(20):
        x = train_lm.synthetic_window(gen).tolist()
        assert len(x) == 65 and set(x) <= set(train_lm.PRINTABLE)
        m = next(m for m in range(16, 17 + 64 // 4) if x[m:] == x[: 65 - m])  # the period
        spans.add(tuple(x[:m]))
    assert len(spans) == 20  # each window its own span


def test_alphabet_and_span_make_synthetic_windows_whose_bytes_recur(train_lm, monkeypatch, tmp_path):
    """--alphabet N --span S: a window's span of 16 to S bytes drawn from N printable ones (a byte recurs, so where
    to copy from takes the bytes before it); out-of-range values are refused before anything trains."""
    import torch

    monkeypatch.setattr(train_lm, "CONTEXT", 64)
    monkeypatch.setattr(train_lm, "ALPHABET", 4)
    monkeypatch.setattr(train_lm, "SPAN", 40)
    gen = torch.Generator().manual_seed(0)
    periods = set()
    for _ in range(30):
        x = train_lm.synthetic_window(gen).tolist()
        assert len(x) == 65 and set(x) <= set(train_lm.PRINTABLE) and len(set(x)) <= 4
        periods.add(next(m for m in range(16, 41) if x[m:] == x[: 65 - m]))
    assert max(periods) > 64 // 4  # longer than the default span's quarter of the context
    for bad in (["--alphabet", "1"], ["--alphabet", "98"], ["--span", "8"], ["--span", "300", "--context", "256"]):
        with pytest.raises(SystemExit):
            train_lm.main([*bad, "-o", str(tmp_path / "bad")])


def test_copy_run_counts_the_rewritten_bytes_before_the_first_wrong_one(train_lm):
    """copy_run: the input is a span then its first `cue` bytes again; what the model writes after it counts up to
    its first byte that is not the span's next (an early end counts as wrong from there)."""
    torch = pytest.importorskip("torch")

    class Rewrites:
        """Writes `right` of the span's next bytes, then a wrong one (or, `right` None, stops after 3)."""

        def __init__(self, right):
            self.right = right

        def eval(self):
            return self

        def generate(self, x, max_new_tokens, **_):
            span = x[0, :-4]
            nxt = span[4 : 4 + max_new_tokens]
            out = nxt[:3] if self.right is None else torch.cat([nxt[: self.right], (nxt[self.right :] + 1) % 256])
            return torch.cat([x[0], out])[None]

    ids = list(range(200))
    assert train_lm.copy_run(Rewrites(5), ids, span=40, cue=4, new=10, count=3) == 0.5
    assert train_lm.copy_run(Rewrites(10), ids, span=40, cue=4, new=10, count=3) == 1.0
    assert train_lm.copy_run(Rewrites(None), ids, span=40, cue=4, new=10, count=3) == 0.3
