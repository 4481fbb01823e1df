"""
GPT-2 byte-level BPE, exact and offline.

The ranks of GPT-2's BPE are its vocabulary ids (merge i creates token 256 + i), so a snapshot's
vocab.json (or tokenizer.json) is all tiktoken needs to encode exactly like GPT-2. The repo ships
the ranks as mini/gpt2.tiktoken (from the openai-whisper sdist on PyPI) so that tests and models
made from scratch need no network.
"""
import base64
import functools
import json
import os

import tiktoken

GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
EOS = "<|endoftext|>"
SHIPPED_RANKS = os.path.join(os.path.dirname(__file__), "gpt2.tiktoken")


def bytes_to_unicode():
    """GPT-2's reversible map from the 256 byte values to printable unicode characters."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def _bpe_split(token, ranks):
    """Merge the bytes of `token` using only ranks lower than its own; GPT-2 leaves exactly two parts."""
    max_rank = ranks[token]
    parts = [bytes([b]) for b in token]
    while True:
        best = None
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and rank < max_rank and (best is None or rank < best[0]):
                best = (rank, i)
        if best is None:
            return parts
        i = best[1]
        parts[i:i + 2] = [parts[i] + parts[i + 1]]


class Tokenizer:
    def __init__(self, ranks, merges=None):
        self.ranks = ranks  # dict[bytes, int], without EOS
        self.merges = merges  # merges.txt's lines as read (from_dir), else worked out from the ranks on first save
        self.eos_token_id = len(ranks)
        self.enc = tiktoken.Encoding("gpt2-mini", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                                     special_tokens={EOS: self.eos_token_id})

    @property
    def vocab_size(self):
        return self.eos_token_id + 1

    def encode(self, text):
        return self.enc.encode_ordinary(text)  # no special tokens, "<|endoftext|>" is plain text here

    def decode(self, ids):
        ids = list(ids)
        outside = [i for i in ids if not 0 <= i < self.vocab_size]  # else tiktoken's KeyError or OverflowError
        if outside:
            raise ValueError(f"token id {outside[0]} is outside this tokenizer's {self.vocab_size} ids; decode ids of "
                             "the model this tokenizer came with")
        return self.enc.decode(ids)

    @classmethod
    @functools.cache  # one a process: it is never changed, so the merges its first save works out serve every save
    def gpt2(cls):
        with open(SHIPPED_RANKS, "rb") as f:
            ranks = {base64.b64decode(tok): int(rank) for tok, rank in (line.split() for line in f if line.strip())}
        return cls(ranks)

    @classmethod
    def from_dir(cls, path):
        """Build from a snapshot directory holding vocab.json (+ merges.txt) or tokenizer.json."""
        vocab_file, tok_file = os.path.join(path, "vocab.json"), os.path.join(path, "tokenizer.json")
        source = vocab_file if os.path.exists(vocab_file) else tok_file
        if not os.path.exists(source):
            raise FileNotFoundError(f"{path} has no vocab.json or tokenizer.json; copy the GPT-2 tokenizer files there "
                                    "or save the snapshot with mini.loader.save_model")
        byte_of = {c: b for b, c in bytes_to_unicode().items()}
        try:  # a damaged file is a ValueError naming it, whatever python met in it
            with open(source, encoding="utf-8-sig") as f:  # an editor's byte-order mark is not damage
                vocab = json.load(f)
            vocab = vocab if source == vocab_file else vocab["model"]["vocab"]
            ranks = {bytes(byte_of[c] for c in tok): i for tok, i in vocab.items() if tok != EOS}
            if not all(type(i) is int for i in vocab.values()) or sorted(ranks.values()) != list(range(len(ranks))):
                raise ValueError
            if not all(bytes([b]) in ranks for b in range(256)):  # else tiktoken panics encoding a byte it lacks
                raise ValueError
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError):  # UnicodeDecodeError: a ValueError
            raise ValueError(f"{source} is damaged: not a GPT-2 vocabulary (a JSON object of byte-level tokens, "
                             "the 256 single bytes among them, and the ids 0, 1, 2, ...)") from None
        if vocab.get(EOS, len(ranks)) != len(ranks):  # else its id would silently move to the one after the tokens
            raise ValueError(f"{source} is damaged: {EOS} has id {vocab[EOS]}, not {len(ranks)}, the id after its "
                             f"{len(ranks)} tokens, the only place a GPT-2 vocabulary has it")
        merges_file = os.path.join(path, "merges.txt")
        if os.path.exists(merges_file):  # ids-as-ranks is exact only if merge i made token 256 + i
            try:
                with open(merges_file, encoding="utf-8-sig") as f:
                    merges = [line.split() for line in f if line.strip() and not line.startswith("#version")]
            except ValueError:  # not UTF-8
                raise ValueError(f"{merges_file} is damaged (not UTF-8 text)") from None
            for i, merge in enumerate(merges):
                if len(merge) != 2 or vocab.get("".join(merge)) != 256 + i:  # a merge joins two tokens
                    raise ValueError(f"{merges_file}: merge {i} ({' '.join(merge)[:40]}) does not create token "
                                     f"{256 + i}; the file is damaged, or not of a GPT-2-style vocabulary (ids in "
                                     "merge order), the only kind supported")
            if len(merges) == len(ranks) - 256:  # every token past the bytes made by its merge: keep them to save
                return cls(ranks, [" ".join(merge) for merge in merges])
        return cls(ranks)

    def save(self, out_dir):
        """Write vocab.json and merges.txt, the files GPT-2 tokenizers read."""
        to_unicode = bytes_to_unicode()
        show = lambda b: "".join(to_unicode[x] for x in b)
        vocab = {show(tok): i for tok, i in self.ranks.items()}
        vocab[EOS] = self.eos_token_id
        if self.merges is None:  # 2-5 s of python for GPT-2's 50,000 merges: once, not at every checkpoint
            self.merges = [" ".join(show(p) for p in _bpe_split(tok, self.ranks))
                           for tok, _ in sorted(self.ranks.items(), key=lambda kv: kv[1]) if len(tok) > 1]
        with open(os.path.join(out_dir, "vocab.json"), "w", encoding="utf-8") as f:
            json.dump(vocab, f, ensure_ascii=False)
        with open(os.path.join(out_dir, "merges.txt"), "w", encoding="utf-8") as f:
            f.write("#version: 0.2\n" + "\n".join(self.merges) + "\n")
