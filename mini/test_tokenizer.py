"""The tokenizer against tiktoken's GPT-2 ranks and the `tokenizers` library on real RookWorld text.

    python mini/test_tokenizer.py
"""
import json

import numpy as np
import pytest
from tiktoken.load import load_tiktoken_bpe
import tiktoken

from mini.tokenizer import GPT2_PATTERN, SHIPPED_RANKS, Tokenizer, bytes_to_unicode

LINES = [
    "P: 8/5k2/r2p1bp1/P6p/2p5/PR4P1/3B1K1P/8 w - - 0 44                                          M: b3b7 b3b5 b3f3 b3b4 b3b1      E: -1.13 -0.8 -2.33 -2.11 -2.42            B: b3b5",
    "P: 2b3k1/Q4rqn/p2p4/4p3/p6p/2PP3P/BP3PP1/R5K1 b - - 0 34                                    M: a4a3 c8f5 h7f6 h7g5 h7f8      E: -3.06 -2.82 -3.21 -3.16 -2.3            B: h7f6",
    "A: r1bk3r/2p2ppp/2P1p2N/ppb1P3/8/B2B1N2/PPP2PPP/3RK2R w K - 1 18+a3c5+b7b5 a1d1 g8h6 e4d6 e8e7 d6f5 e7d8 f5h6 f8c5 a3c5+r1bk3r/2p2ppp/2P1p2N/ppB1P3/8/3B1N2/PPP2PPP/3RK2R b K - 0 18+0.001+0+0",
    "A: 8/8/6N1/3B4/7Q/4B2P/Pp3K1P/5R2 b - - 0 48+b2b1n+f7f8 b5b4 f8f7 h5h4 g3f2 b4b3 f7e7 b3b2 e7h4 b2b1n+8/8/6N1/3B4/7Q/4B2P/P4K1P/1n3R2 w - - 0 49+0.001+0+0",
]
TEXTS = LINES + [
    "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq e3 0 1", "e2e4 e7e5 g1f3 b8c6 e7e8q a7a8n",
    "Hello world", " the", "It's a test: 3.14, don't   panic!\n\tTabs\nand\r\nnewlines  ", "~!@#$%^&*()_+{}|:\"<>?`-=[]\\;',./",
    "", "   ", "<|endoftext|> is plain text here",
    "We're sure you'll see: they've, I'm, he'd, it's, don't. WE'RE", "café €5 naïve 日本 🙂 ÿ\u00ac",
    "soft\u00adhyphen \u00a0non-breaking \x7f\x00",
]


@pytest.fixture(scope="module")
def reference():
    return tiktoken.Encoding("gpt2-ref", pat_str=GPT2_PATTERN, mergeable_ranks=load_tiktoken_bpe(SHIPPED_RANKS),
                             special_tokens={"<|endoftext|>": 50256})


@pytest.fixture(scope="module")
def from_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    Tokenizer.gpt2().save(str(d))
    return Tokenizer.from_dir(str(d)), str(d)


def test_known_ids():
    tok = Tokenizer.gpt2()
    assert tok.encode("Hello world") == [15496, 995] and tok.encode(" the") == [262]
    assert tok.eos_token_id == 50256 and tok.vocab_size == 50257
    assert tok.encode(" " * 3) == [220, 220, 220]  # GPT-2 has no multi-space tokens
    contractions = {"you'll": [5832, 1183], "we're": [732, 821], "they've": [9930, 1053], "I'm": [40, 1101],
                    "he'd": [258, 1549], "it's": [270, 338], "don't": [9099, 470]}  # the pattern splits 'll 're 've ...
    assert {text: tok.encode(text) for text in contractions} == contractions
    assert tok.decode(tok.encode("🙂")[:1]) == "\ufffd"  # a cut character: U+FFFD, as GPT-2's decode (errors="replace")


@pytest.mark.parametrize("token_id", [50257, -1, 10**20])
def test_decoding_an_id_outside_the_vocabulary_is_one_sentence(token_id):
    """tiktoken raised KeyError past the vocabulary and OverflowError below zero or past 64 bits; the end-of-text
    id, the last, still decodes."""
    tok = Tokenizer.gpt2()
    assert tok.decode([15496, 50256]) == "Hello<|endoftext|>"
    with pytest.raises(ValueError, match=f"^token id {token_id} is outside this tokenizer's 50257 ids; decode ids of "
                                         "the model this tokenizer came with$"):
        tok.decode([15496, token_id])


@pytest.mark.parametrize("text", TEXTS)
def test_equals_tiktoken_and_round_trips(text, reference, from_files):
    tok, _ = from_files  # built from the vocab.json/merges.txt we write, checked against the raw ranks
    ids = tok.encode(text)
    assert ids == reference.encode_ordinary(text)
    assert tok.decode(ids) == text


def test_written_files_work_in_tokenizers_library(from_files):
    """An independent implementation (its own pre-tokenizer regex and byte map) reads the files we write and
    encodes every text as we do, non-ASCII and contractions included; <|endoftext|> is in vocab.json at 50256."""
    tokenizers = pytest.importorskip("tokenizers")
    _, d = from_files
    ht = tokenizers.Tokenizer(tokenizers.models.BPE.from_file(f"{d}/vocab.json", f"{d}/merges.txt"))
    ht.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok = Tokenizer.gpt2()
    for text in TEXTS:
        assert ht.encode(text).ids == tok.encode(text), text
    assert ht.token_to_id("<|endoftext|>") == 50256


def test_a_snapshot_with_only_tokenizer_json(from_files, tmp_path):
    """Hub snapshots may ship tokenizer.json (the `tokenizers` format, vocabulary under model.vocab) alone."""
    tok, d = from_files
    with open(f"{d}/vocab.json", encoding="utf-8") as f:
        vocab = json.load(f)
    (tmp_path / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": vocab}}))
    got = Tokenizer.from_dir(str(tmp_path))
    assert got.eos_token_id == 50256 and all(got.encode(text) == tok.encode(text) for text in LINES)


def test_rejects_merges_out_of_id_order_and_reads_them_without_a_version_line(from_files, tmp_path):
    _, d = from_files
    merges = open(f"{d}/merges.txt").read().splitlines()
    merges[1], merges[2] = merges[2], merges[1]
    (tmp_path / "merges.txt").write_text("\n".join(merges))
    (tmp_path / "vocab.json").write_text(open(f"{d}/vocab.json").read())
    with pytest.raises(ValueError, match="merge order"):
        Tokenizer.from_dir(str(tmp_path))
    merges[1], merges[2] = merges[2], merges[1]
    (tmp_path / "merges.txt").write_text("\n".join(merges[1:]))  # without its "#version" line: still merge 0 first
    assert Tokenizer.from_dir(str(tmp_path)).encode(LINES[0]) == Tokenizer.gpt2().encode(LINES[0])


def test_a_loaded_tokenizer_saves_the_files_it_was_read_from(from_files, tmp_path, monkeypatch):
    """Every checkpoint saves the tokenizer: one read from a snapshot writes the merges it read instead of working
    them out again (seconds of python), byte for byte what Tokenizer.gpt2() writes. A merges.txt that stops short
    of the vocabulary is not copied: the ranks make every token, so the saved file must too."""
    tok, d = from_files
    monkeypatch.setattr("mini.tokenizer._bpe_split", None)  # working them out would fail
    tok.save(str(tmp_path))
    (tmp_path / "gpt2").mkdir()
    Tokenizer.gpt2().save(str(tmp_path / "gpt2"))  # built once a process, its merges with it
    for f in ("vocab.json", "merges.txt"):
        assert (tmp_path / f).read_bytes() == open(f"{d}/{f}", "rb").read(), f
    monkeypatch.undo()
    short = tmp_path / "short"
    short.mkdir()
    (short / "vocab.json").write_text(open(f"{d}/vocab.json").read())
    (short / "merges.txt").write_text("\n".join(open(f"{d}/merges.txt").read().splitlines()[:1000]))
    Tokenizer.from_dir(str(short)).save(str(short))
    assert (short / "merges.txt").read_bytes() == open(f"{d}/merges.txt", "rb").read()


@pytest.mark.parametrize("ids", [0, 10, 255])
def test_a_vocabulary_without_every_byte_is_damaged(from_files, tmp_path, ids):
    """A vocab.json of fewer tokens than the 256 bytes (empty, cut short) is refused in one sentence, where an empty one
    said "max() arg is an empty sequence" and one of 10 tokens loaded and then panicked in tiktoken's Rust (a
    BaseException, past every handler) at the first character it lacked."""
    _, d = from_files
    with open(f"{d}/vocab.json", encoding="utf-8") as f:
        vocab = {t: i for t, i in json.load(f).items() if i < ids}
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    with pytest.raises(ValueError, match="vocab.json is damaged: not a GPT-2 vocabulary .* the 256 single bytes"):
        Tokenizer.from_dir(str(tmp_path))


def test_byte_map_by_hand():
    """GPT-2's map: printable Latin-1 bytes are themselves, the rest (0-32, 127-160 and the soft hyphen 173) take
    U+0100 onwards in byte order; one character a byte."""
    m = bytes_to_unicode()
    assert (m[0x21], m[0x7E], m[0xA1], m[0xAC], m[0xAE], m[0xFF]) == ("!", "~", "¡", "¬", "®", "ÿ")
    assert (m[0x00], m[0x0A], m[0x20], m[0x7F], m[0xA0], m[0xAD]) == ("Ā", "Ċ", "Ġ", "ġ", "ł", "Ń")
    assert sorted(m) == list(range(256)) and len(set(m.values())) == 256


def _vocab(d):
    """The vocab.json of folder d, as a dict."""
    with open(f"{d}/vocab.json", encoding="utf-8") as f:
        return json.load(f)


@pytest.mark.parametrize("eos_id", [50257, 60000])
def test_an_end_of_text_id_past_the_tokens_is_damaged_not_moved(from_files, tmp_path, eos_id):
    """<|endoftext|> at an id other than the one after the tokens loaded with its id silently moved to 50256: a model
    trained to stop on another id would never stop. One sentence naming the file and both ids."""
    _, d = from_files
    (tmp_path / "vocab.json").write_text(json.dumps({**_vocab(d), "<|endoftext|>": eos_id}))
    with pytest.raises(ValueError, match=f"vocab.json is damaged: <.endoftext.> has id {eos_id}, not 50256"):
        Tokenizer.from_dir(str(tmp_path))
    (tmp_path / "vocab.json").write_text(json.dumps({t: i for t, i in _vocab(d).items() if t != "<|endoftext|>"}))
    tok = Tokenizer.from_dir(str(tmp_path))  # none: the id after the tokens, as GPT-2's
    assert (tok.eos_token_id, tok.vocab_size, tok.decode([50256])) == (50256, 50257, "<|endoftext|>")


@pytest.mark.parametrize("value", ["false", "0.0"])
def test_an_id_that_is_not_an_integer_is_damaged(from_files, tmp_path, value):
    """false and 0.0 compare equal to 0, so the ids' order alone would take them for it."""
    _, d = from_files
    text = json.dumps(_vocab(d))
    (tmp_path / "vocab.json").write_text(text.replace('{"!": 0,', f'{{"!": {value},'))
    assert text != (tmp_path / "vocab.json").read_text()
    with pytest.raises(ValueError, match="vocab.json is damaged: not a GPT-2 vocabulary"):
        Tokenizer.from_dir(str(tmp_path))


def test_a_directory_without_a_vocabulary_says_which_files_it_needs(tmp_path):
    (tmp_path / "merges.txt").write_text("#version: 0.2\n")
    with pytest.raises(FileNotFoundError, match=f"^{tmp_path} has no vocab.json or tokenizer.json; copy"):
        Tokenizer.from_dir(str(tmp_path))


@pytest.mark.parametrize("line", ["Ġt", "Ġ t h", "Ġ  t"], ids=["one part", "three parts", "two spaces"])
def test_a_merge_line_of_other_than_two_tokens_is_damaged(from_files, tmp_path, line):
    """"Ġt" and "Ġ t h" join to a token of the vocabulary, but a merge is of two: such a file, copied at the next
    save, is one the `tokenizers` library cannot read. Two spaces between the parts are still two parts."""
    _, d = from_files
    merges = open(f"{d}/merges.txt", encoding="utf-8").read().splitlines()
    assert merges[1] == "Ġ t"
    (tmp_path / "vocab.json").write_text(open(f"{d}/vocab.json", encoding="utf-8").read(), encoding="utf-8")
    vocab = _vocab(d)
    if line == "Ġ t h":  # "Ġth" is a token of its own: make it merge 0's token for the test
        vocab["Ġth"], vocab["Ġt"] = vocab["Ġt"], vocab["Ġth"]
        (tmp_path / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (tmp_path / "merges.txt").write_text("\n".join([merges[0], line] + merges[2:3]), encoding="utf-8")
    if line == "Ġ  t":
        assert Tokenizer.from_dir(str(tmp_path)).encode(" t") == [256]
        return
    with pytest.raises(ValueError, match=r"merges.txt: merge 0 \(" + line + r"\) does not create token 256"):
        Tokenizer.from_dir(str(tmp_path))


def test_blank_lines_in_merges_are_skipped(from_files, tmp_path):
    """An editor's blank lines (between merges, at the end, CRLF ones) are no merge: the file reads as it was."""
    tok, d = from_files
    merges = open(f"{d}/merges.txt", encoding="utf-8").read().splitlines()
    (tmp_path / "vocab.json").write_text(open(f"{d}/vocab.json", encoding="utf-8").read(), encoding="utf-8")
    (tmp_path / "merges.txt").write_bytes(("\r\n".join(merges[:3] + ["", "  "] + merges[3:]) + "\r\n\r\n").encode())
    got = Tokenizer.from_dir(str(tmp_path))
    assert got.merges == tok.merges and got.encode(LINES[1]) == tok.encode(LINES[1])


def test_a_vocabulary_in_any_key_order_saves_merges_in_id_order_and_loads_back(from_files, tmp_path):
    """A tokenizer.json lists its tokens in any order: the merges worked out at save are written in id order (merge i
    makes token 256 + i), so that the saved files load back, to the same ids (GPT-2's first 1000 tokens here)."""
    tok, d = from_files
    vocab = {t: i for t, i in _vocab(d).items() if i < 1000}
    (tmp_path / "tokenizer.json").write_text(json.dumps({"model": {"vocab": dict(reversed(vocab.items()))}}))
    got = Tokenizer.from_dir(str(tmp_path))
    assert got.merges is None and list(got.ranks.values())[0] == 999 and got.eos_token_id == 1000
    (tmp_path / "saved").mkdir()
    got.save(str(tmp_path / "saved"))
    back = Tokenizer.from_dir(str(tmp_path / "saved"))
    assert back.merges == tok.merges[:1000 - 256] and back.ranks == got.ranks and back.eos_token_id == 1000
    assert _vocab(tmp_path / "saved") == {**vocab, "<|endoftext|>": 1000}
    assert all(back.encode(text) == got.encode(text) for text in TEXTS) and got.encode(" the") == [262]


def test_decode_takes_any_iterable_of_ids():
    """Callers hand over lists, tuples, generators and numpy arrays of ids."""
    tok = Tokenizer.gpt2()
    ids = tok.encode("Hello world")
    assert tok.decode(tuple(ids)) == tok.decode(i for i in ids) == tok.decode(np.array(ids)) == "Hello world"
    assert tok.decode([]) == "" and tok.decode([tok.eos_token_id]) == "<|endoftext|>"


if __name__ == "__main__":
    import sys
    sys.exit(pytest.main([__file__, "-q"]))
