"""The tokenizer against tiktoken's GPT-2 ranks and the `tokenizers` library on real RookWorld text.

    python mini/test_tokenizer.py
"""
import json

import pytest
from tiktoken.load import load_tiktoken_bpe
import tiktoken

from mini.tokenizer import GPT2_PATTERN, SHIPPED_RANKS, Tokenizer

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


if __name__ == "__main__":
    import sys
    sys.exit(pytest.main([__file__, "-q"]))
