"""The text and bytes of the OpenAI server's logprob entries, for both tokenizer families: a byte-level BPE
(the repository's byte tokenizer, and a small one with merges built here) and a SentencePiece-style BPE with
byte fallback built here ("▁" spaces, "<0xNN>" pieces, a Strip decoder). No model: a `TextRun` is fed chosen
tokens one by one, as the continuous batcher feeds it, and its entries go through `Answer` to OpenAI's JSON.

The rules (docs/serving.md): each token is named by the text it adds to the answer in context (a token that
ends inside a character adds "", the one completing it carries the character); its `bytes` are the bytes it
adds to the answer's UTF-8 (its own bytes where it ends inside a character); so the texts join to the answer,
completions' text_offset indexes it and chat's bytes join to its UTF-8, streamed or not. After a stop string
the entries are the tokens whose text is in the answer, the last cut where it ends.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from helpers import REPO, sentencepiece_tokenizer
from runtime.sampling import Sampler, resolve
from runtime.stopping import Codec, RowText
from serve.openai.protocol import CHAT, COMPLETIONS, Answer, Ask
from serve.openai.serving import TextRun

EMOJI = "😀"  # four UTF-8 bytes: F0 9F 98 80


def _sentencepiece() -> Codec:
    return Codec(sentencepiece_tokenizer())


def _byte_level_merges() -> Codec:
    """A GPT-2-style byte-level BPE whose merges make tokens that end inside a character ("aÃ": "a" and the
    first byte of "é") and one that holds a character whole ("Ġé")."""
    chars = pre_tokenizers.ByteLevel.alphabet()
    vocab = {c: i for i, c in enumerate(sorted(chars))}
    merges = [("a", "Ã"), ("Ġ", "Ã"), ("ĠÃ", "©")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return Codec(tok)


def _repo_bytes() -> Codec:
    return Codec(str(REPO / "models" / "tiny-stdlib-llama" / "tokenizer.json"))


def _ids(codec: Codec, *pieces: str) -> list[int]:
    return [codec.tok.token_to_id(p) for p in pieces]


def _feed(codec: Codec, tokens: list[int], stop=(), eos=(), n: int = 3, max_tokens: int | None = None):
    """(run, [(piece, finish, the entries a stream may send)] per token): a greedy TextRun fed `tokens`, each the
    argmax of random logits; the entries a stream was told it may send are never changed after."""
    vocab = codec.tok.get_vocab_size()
    sampler = Sampler(resolve({}, {"pad_token_id": 0}), np.zeros((1, 1), np.int64), None, vocab)
    steps: list = []
    run = TextRun(sampler, tuple(eos), RowText(codec, tuple(stop)), max_tokens or len(tokens), None, n)
    run.emit = lambda piece, finish: steps.append((piece, finish, run.entries[: run.ready]))
    rng = np.random.default_rng(0)
    for t in tokens:
        logits = rng.standard_normal((1, vocab)).astype(np.float32)
        logits[0, t] = 9.0
        if run.add(run.choose(logits, np.array([t]))):
            break
    assert all(run.entries[: len(sendable)] == sendable for _, _, sendable in steps)
    return run, steps


def _answers(run: TextRun, steps) -> tuple[dict, dict, list[dict], list[dict]]:
    """OpenAI's JSON logprobs of the run: completions and chat, whole, and the stream's chunks of each."""
    out = []
    for route in (COMPLETIONS, CHAT):
        ask = Ask(route, 8, logprobs=run.logprobs)
        whole = json.loads(Answer(ask, "m", "fp", None).whole(run.row.text, run.finish, {}, run.entries))
        streamed, sent, answer = [], 0, Answer(ask, "m", "fp", None)
        for piece, finish, sendable in steps:  # as OpenAIFront's stream sends them
            if piece or finish:
                chunk = json.loads(answer.chunk(piece or None, finish, entries=sendable[sent:])[6:])
                streamed.append(chunk["choices"][0]["logprobs"])
                sent = len(sendable)
        out += [whole["choices"][0]["logprobs"], streamed]
    return out[0], out[2], out[1], out[3]


def _check(run: TextRun, steps, text: str) -> tuple[dict, dict]:
    """The answer is `text`; the entries' texts join to it, text_offset indexes it, bytes join to its UTF-8,
    whole and streamed alike; returns the whole completions and chat logprobs."""
    completions, chat, completions_chunks, chat_chunks = _answers(run, steps)
    assert run.row.text == text
    tokens = completions["tokens"]
    assert "".join(tokens) == text, tokens
    assert completions["text_offset"] == [len("".join(tokens[:i])) for i in range(len(tokens))]
    assert all(text[o : o + len(t)] == t for o, t in zip(completions["text_offset"], tokens))
    assert [e["token"] for e in chat["content"]] == tokens
    assert b"".join(bytes(e["bytes"]) for e in chat["content"]) == text.encode()
    streamed = [t for c in completions_chunks for t in c["tokens"]]
    offsets = [o for c in completions_chunks for o in c["text_offset"]]
    assert streamed == tokens and offsets == completions["text_offset"]  # the stream's answer is the same
    assert [e for c in chat_chunks for e in c["content"]] == chat["content"]
    return completions, chat


CASES = {  # tokenizer, its pieces for the answer, the answer
    "sentencepiece": (
        _sentencepiece,
        ["▁Hello", "▁world", "▁caf", "é", "!", "<0xF0>", "<0x9F>", "<0x98>", "<0x80>", "▁x", "<0xC3>", "<0xA9>"],
        f"Hello world café!{EMOJI} xé",
    ),
    "byte-level": (_byte_level_merges, ["a", "aÃ", "©", "ĠÃ©", "Ġ", "ð", "Ł", "ĺ", "Ģ"], f"aaé é {EMOJI}"),
    "repo-bytes": (_repo_bytes, ["h", "Ã", "©", "Ġ", "ð", "Ł", "ĺ", "Ģ", "!"], f"hé {EMOJI}!"),
}


@pytest.mark.parametrize("family", sorted(CASES))
def test_logprob_texts_join_to_the_answer_and_bytes_to_its_utf8(family):
    make, pieces, text = CASES[family]
    codec = make()
    tokens = _ids(codec, *pieces)
    assert None not in tokens and codec.decode(tokens) == text
    run, steps = _feed(codec, tokens)
    completions, chat = _check(run, steps, text)
    assert run.finish == "length" and len(completions["tokens"]) == len(tokens)  # every token made is listed
    begun = [(e, t) for e, t in zip(chat["content"], tokens) if not e["token"]]
    assert begun  # a character split over tokens: those ending inside it add no text yet, and their own bytes
    assert all(bytes(e["bytes"]) == codec.token_bytes(t) and codec.decode([t]).endswith("\ufffd") for e, t in begun)
    texts = completions["tokens"]
    assert EMOJI in texts or f" {EMOJI}" in texts  # the token completing the emoji carries it whole
    if family == "sentencepiece":  # "▁world" mid-answer keeps its space (decoded alone it reads "world")
        assert texts[:3] == ["Hello", " world", " caf"] and codec.decode([tokens[1]]) == "world"


def test_the_alternatives_are_named_in_the_same_context():
    """Each alternative's text is what it would add at that step, and its bytes what it would add to the UTF-8:
    "▁world" reads "world" first (the decoder strips the answer's leading space) and " world" later; after a
    byte that begins "é", another byte that completes a character reads "è" with its one byte; a byte that
    begins one reads "" with its own. Completions' top_logprobs is keyed by text and holds the chosen token."""
    codec = _sentencepiece()
    hello, world, c3, a9, a8 = _ids(codec, "▁Hello", "▁world", "<0xC3>", "<0xA9>", "<0xA8>")
    vocab = codec.tok.get_vocab_size()
    sampler = Sampler(resolve({}, {"pad_token_id": 0}), np.zeros((1, 1), np.int64), None, vocab)
    run = TextRun(sampler, (), RowText(codec), 8, lambda piece, finish: None, 2)
    for chosen, second in ((hello, world), (c3, world), (a9, a8), (world, c3)):
        logits = np.full((1, vocab), -5.0, np.float32)
        logits[0, [chosen, second]] = [3.0, 2.0]
        run.add(run.choose(logits, np.array([chosen])))
    assert run.row.text == "Helloé world"
    named = [[(e.token, e.raw)] + [(t, raw) for t, _, raw in e.top] for e in run.entries]
    assert named == [
        [("Hello", b"Hello"), ("Hello", b"Hello"), ("world", b"world")],
        [("", b"\xc3"), ("", b"\xc3"), (" world", b" world")],
        [("é", b"\xa9"), ("é", b"\xa9"), ("è", b"\xa8")],
        [(" world", b" world"), (" world", b" world"), ("", b"\xc3")],
    ]
    top = _answers(run, [])[0]["top_logprobs"]
    assert [sorted(d) for d in top] == [["Hello", "world"], ["", " world"], ["è", "é"], ["", " world"]]


@pytest.mark.parametrize("family", ["byte-level", "sentencepiece"])  # tokens of several characters
def test_after_a_stop_string_the_entries_are_the_tokens_of_the_answer(family):
    """A stop string that begins inside a token: the answer ends before it; the entries are the tokens whose
    text is in it, the last cut where it ends (its bytes too: byte-level's "aÃ" keeps only its "a"); the stop
    string's own tokens are left out."""
    make, pieces, text = CASES[family]
    codec = make()
    tokens = _ids(codec, *pieces)
    whole, _ = _feed(codec, tokens)
    texts = [e.token for e in whole.entries]
    k = next(i for i, t in enumerate(texts) if len(t) >= 2 and i > 0)  # a token of two characters or more
    at = len("".join(texts[:k]))
    stop = text[at + 1 : at + 3] if len(text) > at + 2 else text[at + 1 :]
    assert text.find(stop) == at + 1, (text, stop)  # the stop string begins inside token k
    run, steps = _feed(codec, tokens, stop=[stop])
    completions, _ = _check(run, steps, text[: at + 1])
    assert run.finish == "stop" and len(completions["tokens"]) == k + 1
    assert completions["tokens"][-1] == texts[k][:1] and run.made > k  # cut; the rest of the stop: not listed
    if family == "byte-level":
        assert [(e.token, e.raw) for e in run.entries] == [("a", b"a"), ("", b"a"), ("a", b"")]


def test_an_answer_cut_inside_a_character_ends_in_a_replacement_character():
    """max_tokens ends the answer inside the emoji: the answer ends in U+FFFD (as the text route's), carried by
    the last token, whose bytes stay its own; an eos that ends it is not listed. Bytes that are not UTF-8 read
    as U+FFFD in the text, and each token keeps its own bytes."""
    codec = _repo_bytes()
    tokens = _ids(codec, "h", "ð", "Ł")
    run, steps = _feed(codec, tokens)
    assert run.row.text == "h\ufffd" and [e.token for e in run.entries] == ["h", "", "\ufffd"]
    assert [e.raw for e in run.entries] == [b"h", b"\xf0", b"\x9f"]
    assert "".join(t for c in _answers(run, steps)[2] for t in c["tokens"]) == "h\ufffd"
    ended, _ = _feed(codec, [*tokens[:2], 257], eos=(257,), max_tokens=8)
    assert ended.finish == "stop" and [e.token for e in ended.entries] == ["h", "\ufffd"]
    broken, _ = _feed(codec, _ids(codec, "Ã", "a", "b"))  # bytes C3 61: not UTF-8; the text reads "\ufffda"
    assert [(e.token, e.raw) for e in broken.entries] == [("", b"\xc3"), ("\ufffda", b"a"), ("b", b"b")]


def test_a_tokens_own_bytes_come_from_the_vocabulary():
    sp, bl, repo = _sentencepiece(), _byte_level_merges(), _repo_bytes()
    assert sp.token_bytes(_ids(sp, "<0xF0>")[0]) == b"\xf0" and sp.token_bytes(_ids(sp, "▁caf")[0]) == b" caf"
    assert bl.token_bytes(_ids(bl, "aÃ")[0]) == b"a\xc3" and bl.token_bytes(_ids(bl, "ĠÃ©")[0]) == " é".encode()
    assert [repo.token_bytes(i) for i in range(256)] == [bytes([b]) for b in range(256)]

    class Plain:  # an encode/decode pair with no vocabulary behind it
        encode = decode = staticmethod(lambda x, **_: x)

    assert Codec(Plain()).token_bytes(5) is None
