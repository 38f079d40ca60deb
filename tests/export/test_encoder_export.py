"""Sentence encoders exported whole: the graph's embeddings against SentenceTransformer.encode (fp32, other
batch sizes and lengths than the export's), the interface, `attnzoo export --whole` / `attnzoo embed`, and
int8 / int4 stated as cosine similarity to the fp32 embeddings."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("sentence_transformers", reason="sentence-transformers is in the test extras")

import encoder_cases as cases  # noqa: E402

from cli.main import main  # noqa: E402
from export.encoder_export import export_encoder  # noqa: E402
from peers.sentence import sentence_encoder, tokenizer_facts  # noqa: E402
from runtime.embedding import EmbeddingSession  # noqa: E402

ATOL = 1e-5
# int8 / int4 weights (MatMulNBits): the least cosine similarity to the fp32 embeddings allowed, per text
COSINE_FLOOR = {"int8": 0.999, "int4": 0.98}


class _Exports(dict):
    """family -> (its sentence-transformers folder, its export), each made the first time a test asks."""

    def __init__(self, root):
        super().__init__()
        self.root = root

    def __missing__(self, family):
        self[family] = _export_family(self.root, family)
        return self[family]


def _export_family(root, family):
    """BERT (token types, mean, Normalize) is exported by the CLI; the others by the API (ModernBERT: rotary,
    local windows, mean + cls, no Normalize); each folder with a query prompt."""
    prompts = {"query": "query "}
    if family == "bert":
        bert = cases.sentence_folder(root / "bert", "bert", "mean", prompts=prompts)
        assert main(["export", "--checkpoint", str(bert), "--whole", "-o", str(root / "bert.onnx")]) == 0
        return bert, root / "bert.onnx"
    mode, normalize = (("mean", "cls"), False) if family == "modernbert" else ("mean", True)
    folder = cases.sentence_folder(root / family, family, mode, normalize=normalize, prompts=prompts)
    _, pad, lower = tokenizer_facts(folder)
    export_encoder(sentence_encoder(folder), root / f"{family}.onnx", pad_id=pad, do_lower_case=lower)
    (root / f"{family}.tokenizer.json").write_bytes((folder / "tokenizer.json").read_bytes())
    return folder, root / f"{family}.onnx"


@pytest.fixture(scope="session")
def embed_models(tmp_path_factory):
    return _Exports(tmp_path_factory.mktemp("embed"))


@pytest.mark.parametrize("family", cases.FAMILIES)
@pytest.mark.parametrize("batch_size", [1, 3])
def test_exported_embeddings_equal_encode(embed_models, family, batch_size):
    folder, onnx_path = embed_models[family]
    sess = EmbeddingSession(onnx_path, "cpu", verbose=False)
    ref = cases.reference(folder)
    got = sess.encode(cases.TEXTS, batch_size=batch_size)
    assert got.shape == ref.shape == (len(cases.TEXTS), sess.dim)
    err = np.abs(got - ref).max() / np.abs(ref).max()
    assert err <= ATOL, f"{family}, batch {batch_size}: max error {err:.2e}"
    q = sess.encode(cases.TEXTS[:2], prompt_name="query")
    q_ref = cases.reference(folder, texts=cases.TEXTS[:2], prompt_name="query")
    assert np.abs(q - q_ref).max() <= ATOL * np.abs(q_ref).max()


def test_encode_takes_what_sentence_transformers_takes(embed_models):
    """A string -> one vector (d), a list or tuple -> (n d), [] -> the same empty array; as the real encode."""
    from sentence_transformers import SentenceTransformer

    folder, onnx_path = embed_models["bert"]
    sess = EmbeddingSession(onnx_path, "cpu", verbose=False)
    st = SentenceTransformer(str(folder), device="cpu")
    for texts in ("hello world", ["hello world"], ("hello world", "the cat"), np.array(["a", "big dog"])):
        got, ref = sess.encode(texts), st.encode(texts)
        assert got.shape == ref.shape, (texts, got.shape, ref.shape)
        assert np.abs(got - ref).max() <= ATOL, texts
    got, ref = sess.encode([]), st.encode([])
    assert (got.shape, got.dtype) == (ref.shape, ref.dtype) == ((0,), np.float64)


@pytest.mark.parametrize(
    ("texts", "words"),
    [
        (None, "texts=None (NoneType): give a string or a list of strings"),
        (3, "texts=3 (int): give a string"),
        (b"bytes", "texts=b'bytes' (bytes)"),
        ({"a": 1}, "(dict)"),
        (["a", None], "texts[1]=None (NoneType) is not a string"),
        ([["nested"]], "texts[0]=['nested'] (list) is not a string"),
    ],
)
def test_encode_refuses_what_is_not_text_naming_it(embed_models, texts, words):
    import zoo

    sess = EmbeddingSession(embed_models["bert"][1], "cpu", verbose=False)
    with pytest.raises(zoo.InputError) as e:
        sess.encode(texts)
    assert words in str(e.value)


def test_graph_interface(embed_models):
    import onnx

    bert = onnx.load(str(embed_models["bert"][1]), load_external_data=False)
    modern = onnx.load(str(embed_models["modernbert"][1]), load_external_data=False)

    def dims(v):
        return [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]

    assert [i.name for i in bert.graph.input] == ["input_ids", "attention_mask", "token_type_ids"]
    assert [i.name for i in modern.graph.input] == ["input_ids", "attention_mask"]  # no token types
    assert [(o.name, dims(o)) for o in bert.graph.output] == [("sentence_embedding", ["b", 32])]
    assert [(o.name, dims(o)) for o in modern.graph.output] == [("sentence_embedding", ["b", 64])]
    assert all(dims(i) == ["b", "t"] for i in bert.graph.input)
    meta = {p.key: p.value for p in bert.metadata_props}
    prompts = json.loads(meta["attnzoo.prompts"])
    assert (meta["attnzoo.kind"], meta["attnzoo.max_seq_length"], prompts["query"]) == (
        "sentence_encoder",
        "12",
        "query ",
    )


def test_embed_cli_folder_and_onnx_agree(embed_models, tmp_path, capsys):
    folder, onnx_path = embed_models["bert"]
    docs = []
    for source in (folder, onnx_path):
        out = tmp_path / f"{source.name}.json"
        argv = ["embed", str(source), "--text", cases.TEXTS[0], "--text", cases.TEXTS[2], "--json", str(out)]
        assert main([*argv, "--prompt-name", "query"]) == 0
        docs.append(json.loads(out.read_text()))
    eager, graph = (np.array(d["embeddings"]) for d in docs)
    assert docs[0]["ran"] == "eager torch" and docs[1]["ran"].startswith("ONNX Runtime")
    ref = cases.reference(folder, texts=[cases.TEXTS[0], cases.TEXTS[2]], prompt_name="query")
    assert np.abs(eager - ref).max() <= ATOL and np.abs(graph - ref).max() <= ATOL
    assert "2 texts -> 32-dim embeddings" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["embed", "{folder}"], "give the texts"),
        (["embed", "{tmp}/none.onnx", "--text", "a"], "give a model folder"),
        (
            ["embed", "{folder}", "--text", "a", "--prompt-name", "passage"],
            "not one of the model's prompts (document, query)",
        ),
        (["export", "--checkpoint", "{folder}", "--whole", "-o", "{tmp}/x.onnx", "--max-len", "8"], "--max-len"),
    ],
)
def test_embed_cli_errors_are_one_line(embed_models, tmp_path, capsys, argv, words):
    folder = embed_models["bert"][0]
    argv = [a.format(folder=folder, tmp=tmp_path) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1, err


def test_session_refuses_a_model_that_is_not_a_sentence_encoder(exports):
    from runtime.providers import SessionError

    with pytest.raises(SessionError, match="not a sentence encoder"):
        EmbeddingSession(exports["decomposed"], "cpu", verbose=False)


def test_families_lists_whole_encoders(capsys):
    from peers.encoder_rows import ENCODER_FAMILIES

    assert main(["families"]) == 0
    out = capsys.readouterr().out
    tail = out[out.index("Whole encoders") :]
    assert all(f"| {kind} |" in tail for kind in ENCODER_FAMILIES)


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["int8", "int4"])
def test_quantized_embeddings_cosine_to_fp32(embed_models, tmp_path, precision):
    folder, onnx_path = embed_models["bert"]
    fp32 = EmbeddingSession(onnx_path, "cpu", verbose=False).encode(cases.TEXTS)
    path = tmp_path / f"{precision}.onnx"
    _, pad, lower = tokenizer_facts(folder)
    export_encoder(sentence_encoder(folder), path, precision=precision, pad_id=pad, do_lower_case=lower)
    got = EmbeddingSession(path, "cpu", tokenizer=folder / "tokenizer.json", verbose=False).encode(cases.TEXTS)
    cos = (got * fp32).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(fp32, axis=1)
    assert cos.min() >= COSINE_FLOOR[precision], f"{precision}: cosine similarity {cos.min():.5f}"


def test_docs_families_table_is_the_commands():
    from cli.cmd_zoo import encoder_families_markdown
    from helpers import REPO

    assert encoder_families_markdown() in (REPO / "docs" / "embeddings.md").read_text()
