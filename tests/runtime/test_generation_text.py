"""Generation as people use it (runtime/generation.py's Generation, runtime/stopping.py): the checkpoint's
generation_config applies (several eos ids) unless the call overrides it, sampling rows are reproducible
and independent of their batch-mates, stop strings end each row on its own (tokens keep the stop string,
text ends before it), max_time, streaming text that never splits a character, and the text paths in a
process where importing torch fails. A small random LLaMA over the shipped byte-level tokenizer."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
import transformers

import zoo
from export import OnnxSession, export_onnx
from helpers import REPO, sentencepiece_tokenizer
from runtime.stopping import Codec, RowText, row_texts

TOKENIZER = REPO / "models" / "tiny-stdlib-llama" / "tokenizer.json"
VOCAB = 259  # the byte-level tokenizer's: 256 bytes, <s> </s> <pad>
PROMPT = "def main("
NEW = 24


@pytest.fixture(scope="module")
def text_lm(tmp_path_factory):
    """(session, path) of a random LLaMA over the byte tokenizer; the export records a generation_config."""
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2,
    )  # fmt: skip
    torch.manual_seed(0)
    lm = zoo.lm_from_hf(transformers.LlamaForCausalLM(cfg).eval())
    folder = tmp_path_factory.mktemp("text-lm")
    path = export_onnx(lm, folder / "lm.onnx", generation_config={"eos_token_id": [257], "pad_token_id": 258}).path
    (folder / "lm.tokenizer.json").write_bytes(TOKENIZER.read_bytes())
    template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{{ eos_token }}{% endfor %}<assistant>"
    (folder / "lm.tokenizer_config.json").write_text(json.dumps({"chat_template": template, "eos_token": "</s>"}))
    return OnnxSession(path, provider="cpu"), path


def _ids(text=PROMPT):
    return np.array([Codec(str(TOKENIZER)).encode(text)], np.int64)


def test_the_checkpoints_eos_ids_stop_a_row_unless_the_call_overrides_them(text_lm):
    sess, _ = text_lm
    free = sess.generate(_ids(), NEW, eos_token_id=[])  # no eos: every new token
    made = free[0, _ids().shape[1] :].tolist()
    assert len(made) == NEW
    target = made[5]
    unmade = next(i for i in range(256) if i not in made)  # an id of the vocabulary the row never makes
    stopped = sess.generate(_ids(), NEW, eos_token_id=[unmade, target])  # several ids, one of them made
    assert stopped[0, _ids().shape[1] :].tolist() == made[: made.index(target) + 1]
    recorded = sess.generate(_ids(), NEW, generation_config={"eos_token_id": target})
    assert recorded.tolist() == stopped.tolist()


def test_greedy_is_the_default_and_temperature_zero_is_greedy(text_lm):
    sess, _ = text_lm
    greedy = sess.generate(_ids(), NEW, eos_token_id=[])
    assert (sess.generate(_ids(), NEW, eos_token_id=[], temperature=0, top_k=3) == greedy).all()
    assert (sess.generate(_ids(), NEW, eos_token_id=[], repetition_penalty=1.0) == greedy).all()


def test_seeded_sampling_reproduces_and_rows_do_not_depend_on_batch_mates(text_lm):
    sess, _ = text_lm
    ids = np.concatenate([_ids("import os"), _ids("x = [1, 2]")[:, :9]])
    kw = {"eos_token_id": [], "temperature": 1.5, "top_k": 0}
    a = sess.generate(ids, NEW, seed=5, **kw)
    assert (a == sess.generate(ids, NEW, seed=5, **kw)).all()
    assert (a != sess.generate(ids, NEW, seed=6, **kw)).any()
    other = ids.copy()
    other[0] = _ids("while 1:)")[0, :9]  # a different batch-mate: row 1 draws the same tokens
    assert (sess.generate(other, NEW, seed=5, **kw)[1] == a[1]).all()
    alone = sess.generate(ids[1:], NEW, seed=9, **kw)  # one seed per row: row r as its call alone
    assert (sess.generate(ids, NEW, seed=[3, 9], **kw)[1] == alone[0]).all()


def test_a_stop_string_ends_its_row_tokens_keep_it_and_text_ends_before_it(text_lm):
    sess, _ = text_lm
    codec = Codec(str(TOKENIZER))
    free = sess.generate(_ids(), NEW, eos_token_id=[])[0, _ids().shape[1] :].tolist()
    text = codec.decode(free)
    stop = text[6:8]  # two characters: the match spans a token boundary
    at = text.index(stop)
    tokens = sess.generate(_ids(), NEW, eos_token_id=[], stop=stop, tokenizer=str(TOKENIZER))
    new = tokens[0, _ids().shape[1] :].tolist()
    assert codec.decode(new).endswith(stop) and codec.decode(new[:-1]).find(stop) < 0 and new == free[: len(new)]
    assert (
        "".join(sess.stream(PROMPT, NEW, eos_token_id=[], stop=[stop, "never"], tokenizer=str(TOKENIZER)))
        == (text[:at])
    )
    # in a batch each row stops on its own; the stopped row is padded with the checkpoint's pad id
    batch = np.concatenate([_ids(), _ids("import os")[:, -_ids().shape[1] :]])
    both = sess.generate(batch, NEW, eos_token_id=[], stop=stop, tokenizer=str(TOKENIZER), pad_token_id=258)
    assert both[0, _ids().shape[1] + len(new) :].tolist() == [258] * (both.shape[1] - _ids().shape[1] - len(new))


def _transformers_stop_step(prompt: list[int], new: list[int], stops) -> int | None:
    """The new token after which transformers' own StopStringCriteria stops (1-based), or None."""
    from transformers.generation.stopping_criteria import StopStringCriteria

    criteria = StopStringCriteria(transformers.PreTrainedTokenizerFast(tokenizer_file=str(TOKENIZER)), list(stops))
    hits = (k for k in range(1, len(new) + 1) if criteria(torch.tensor([prompt + new[:k]]), None).item())
    return next(hits, None)


def _row_stop_step(prompt: list[int], new: list[int], stops, in_prompt: bool) -> int | None:
    row = RowText(Codec(str(TOKENIZER)), tuple(stops), context=prompt, in_prompt=in_prompt)
    for k, token in enumerate(new, 1):
        row.add(token)
        if row.stopped:
            return k
    return None


STOP_CASES = [  # (stop strings, the step transformers stops at after the prompt "hello" and "n world lonely")
    (["lon"], 1),  # begun in the prompt, ended by the first new token
    (["llon"], 1),
    (["on", "nope"], 1),
    (["ell"], None),  # wholly in the prompt: never
    (["hello"], None),
    (["y", "lo"], 10),  # "lo" ends the prompt: only the new text's counts
    (["n w"], 3),  # in the new text alone
    (["wor"], 5),
    (["onel"], 13),
]


@pytest.mark.parametrize(("stops", "step"), STOP_CASES)
def test_a_stop_string_may_begin_in_the_prompt_as_transformers_stop_strings(stops, step):
    """Generation's rows (in_prompt) stop where transformers' StopStringCriteria stops over the same tokens;
    OpenAI's rows (the server's) look at the completion alone."""
    codec = Codec(str(TOKENIZER))
    prompt, new = codec.encode("hello"), codec.encode("n world lonely")
    assert _transformers_stop_step(prompt, new, stops) == step  # the table is transformers' answer
    assert _row_stop_step(prompt, new, stops, in_prompt=True) == step
    in_completion = [k for k in range(1, len(new) + 1) if any(s in codec.decode(new[:k]) for s in stops)]
    assert _row_stop_step(prompt, new, stops, in_prompt=False) == next(iter(in_completion), None)


def test_generate_stops_where_transformers_stops_a_stop_string_begun_in_the_prompt(text_lm):
    """generate(stop=...) and stream: a stop string made of the prompt's last character and the first new one
    ends the row after one token, as transformers' stop_strings does; the text ends where it begins: ""."""
    sess, _ = text_lm
    free = sess.generate(_ids(), NEW, eos_token_id=[])[0, _ids().shape[1] :].tolist()
    j = next(j for j in range(NEW - 1) if all(32 <= t < 127 for t in free[j : j + 2]))  # two printable bytes
    prompt = [*_ids()[0].tolist(), *free[: j + 1]]
    stop = bytes(free[j : j + 2]).decode()
    assert _transformers_stop_step(prompt, free[j + 1 :], [stop]) == 1
    tokens = sess.generate(np.array([prompt]), NEW, eos_token_id=[], stop=stop, tokenizer=str(TOKENIZER))
    assert tokens[0, len(prompt) :].tolist() == free[j + 1 : j + 2]
    kw = {"eos_token_id": [], "stop": stop, "tokenizer": str(TOKENIZER)}
    assert "".join(row for (row,) in sess.stream(np.array([prompt]), NEW, **kw)) == ""  # one row's pieces


def test_max_time_ends_the_call_with_finish_reason_length(text_lm):
    from runtime.generation import Generation

    sess, _ = text_lm
    run = Generation(sess, _ids(), NEW, eos_token_id=[], max_time=1e-9)
    run.run()
    assert run.made == 1 and run.finish_reason == ["length"]


def test_streamed_text_never_splits_a_character_and_joins_to_the_decoded_text(text_lm):
    codec = Codec(str(TOKENIZER))
    text = "héllo ✓ 日本語 🙂 done"
    row = RowText(codec)
    pieces = [row.add(t) for t in codec.encode(text)] + [row.finish()]
    assert "".join(pieces) == text and not any("\ufffd" in p for p in pieces)
    assert max(len(p.encode()) for p in pieces) == 4  # the emoji's four byte-tokens come out as one piece
    held = RowText(codec, ("END",))
    out = [held.add(t) for t in codec.encode("abcEN")]
    assert "".join(out) == "abc"  # "EN" could begin the stop string: held back
    assert "".join(held.add(t) for t in codec.encode("Dxyz")) == "" and held.stopped and held.text == "abc"
    sess, _ = text_lm
    streamed = list(sess.stream(PROMPT, NEW, eos_token_id=[], tokenizer=str(TOKENIZER)))
    full = sess.generate(_ids(), NEW, eos_token_id=[])[0, _ids().shape[1] :].tolist()
    assert "".join(streamed) == codec.decode(full)
    steps = list(sess.stream(_ids(), 3, eos_token_id=[]))
    assert [int(s[0]) for s in steps] == full[:3]


def test_bad_generation_options_are_one_line_errors(text_lm):
    sess, _ = text_lm
    for kw, match in [
        ({"stop": "x"}, "tokenizer"),
        ({"max_time": 0}, "max_time"),
        ({"eos_token_id": -1}, "eos_token_id"),
        ({"stop": "", "tokenizer": str(TOKENIZER)}, "stop"),
        ({"top_p": 2.0}, "top_p"),
        ({"seed": [1, 2]}, "one per row"),
    ]:
        with pytest.raises(zoo.AttnzooError, match=match):  # the input rule's InputError or an option's ArgumentError
            sess.generate(_ids(), 2, **kw)


def test_text_paths_run_in_a_process_that_cannot_import_torch(text_lm):
    """prompt, stream, stop strings and chat on onnxruntime, numpy, tokenizers and jinja2 alone."""
    sess, path = text_lm
    code = f"""
import json, sys
sys.modules['torch'] = None  # import torch now fails
from pathlib import Path
from export import OnnxSession
from runtime.chat import ChatTemplate
tok = {str(path.with_name("lm.tokenizer.json"))!r}
sess = OnnxSession({str(path)!r}, provider='cpu', verbose=False)
pieces = list(sess.stream({PROMPT!r}, {NEW}, eos_token_id=[], tokenizer=tok))
stopped = ''.join(sess.stream({PROMPT!r}, {NEW}, eos_token_id=[], tokenizer=tok, stop=pieces[-1][-1:] or 'x'))
chat = ChatTemplate.from_folder(Path(tok).parent, 'lm.').render([dict(role='user', content='hi')])
sampled = sess.generate([[1, 2, 3]], 5, temperature=0.9, seed=1).tolist()
print(json.dumps([pieces, stopped, chat, sampled]))
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert p.returncode == 0, p.stderr[-2000:]
    pieces, stopped, chat, sampled = json.loads(p.stdout.splitlines()[-1])
    tok = str(path.with_name("lm.tokenizer.json"))
    assert pieces == list(sess.stream(PROMPT, NEW, eos_token_id=[], tokenizer=tok))
    assert len(stopped) < len("".join(pieces)) and "".join(pieces).startswith(stopped)
    assert chat == "<user>hi</s><assistant>"
    assert sampled == sess.generate([[1, 2, 3]], 5, temperature=0.9, seed=1).tolist()


def test_cli_generate_samples_stops_chats_and_says_how_many_tokens_an_interrupt_left(text_lm, tmp_path, capsys):
    from cli.main import main
    from runtime.generation import Generation

    _, path = text_lm
    out = tmp_path / "out.json"
    argv = ["generate", str(path), "--chat", "--prompt", "hi", "--max-new-tokens", "12", "--temperature", "0.9"]
    assert main([*argv, "--seed", "4", "--stop", "a", "--json", str(out), "--stream"]) == 0
    doc = json.loads(out.read_text())
    shown = capsys.readouterr().out
    assert doc["seed"] == 4 and "sampled, seed 4" in shown and doc["finish_reason"][0] in ("stop", "length")
    assert "a" not in doc["text"][0]
    assert doc["tokens"][0][:9] == [*b"<user>hi", 257]  # the chat template's prompt, its eos_token encoded as one
    steps = iter(Generation.__iter__(Generation(*text_lm[:1], [[1, 2]], 3)))

    def interrupted(self):
        yield next(steps)
        self.made = 1
        raise KeyboardInterrupt

    import unittest.mock

    with unittest.mock.patch.object(Generation, "__iter__", interrupted):
        assert main(["generate", str(path), "--prompt-ids", "1,2", "--max-new-tokens", "5"]) == 130
    assert capsys.readouterr().err.strip().endswith("interrupted after 1 new tokens")


def test_a_rows_new_text_is_read_after_its_prompt_as_the_whole_texts_decode():
    """A SentencePiece "▁world" after the prompt "Hello" adds " world", as decoding prompt and answer together
    gives (decoded alone, its decoder strips that space); left padding is no context; a prompt that ends inside
    a character gives none (its rest would be read as new text)."""
    codec = Codec(sentencepiece_tokenizer())
    piece = codec.tok.token_to_id
    hello, world, pad = piece("▁Hello"), piece("▁world"), piece("<unk>")
    rows = row_texts(codec, (), np.array([[pad, hello], [hello, hello]]), np.array([[0, 1], [1, 1]]))
    assert [r.add(world) + r.finish() for r in rows] == [" world", " world"]
    assert codec.decode([hello, world])[len(codec.decode([hello])) :] == " world"
    (alone,) = row_texts(codec, (), np.array([[pad]]), np.array([[0]]))
    assert alone.add(world) + alone.finish() == "world"  # no prompt: the answer's first space is stripped
    (cut,) = row_texts(codec, (), np.array([[hello, piece("<0xC3>")]]))  # "é" begun in the prompt
    assert cut.add(world) + cut.finish() == "world"
