"""Tokenizers for `run --tokenizer` (HF `tokenizers`, the Python package transformers uses):

- models/tokenizers/bytes-256.json: byte-level, one token per byte (256 ids, no merges) — the
  README walkthrough's tokenizer for tiny-llama (vocabulary 256);
- tests/fixtures/tokenizer/bpe-200.json: a BPE with merges over the corpus's characters
  (whitespace pre-tokenizer, [UNK] for characters it never saw), 200 ids, trained on
  harness/README.md, and sample.txt with the ids Python encodes it to (sample.ids.json): the
  Rust side must produce the same ids.

Usage: .venv/bin/python harness/tokenizer_fixture.py
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402


def byte_level(vocab, texts):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[], show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    assert tok.get_vocab_size() == vocab, tok.get_vocab_size()
    return tok


def save(tok, path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    tok.save(tmp)
    os.replace(tmp, path)


def main():
    save(byte_level(256, [""]), os.path.join(common.REPO, "models/tokenizers/bytes-256.json"))
    with open(os.path.join(common.REPO, "harness/README.md")) as f:
        corpus = f.read()
    bpe = Tokenizer(models.BPE(unk_token="[UNK]"))
    bpe.pre_tokenizer = pre_tokenizers.Whitespace()
    bpe.train_from_iterator([corpus], trainer=trainers.BpeTrainer(vocab_size=200, special_tokens=["[UNK]"], limit_alphabet=70, show_progress=False))
    assert bpe.get_vocab_size() == 200, bpe.get_vocab_size()
    d = os.path.join(common.FIXTURES, "tokenizer")
    save(bpe, os.path.join(d, "bpe-200.json"))
    sample = corpus[:4000]
    with open(os.path.join(d, "sample.txt"), "w") as f:
        f.write(sample)
    common.write_json(os.path.join(d, "sample.ids.json"), {"ids": bpe.encode(sample).ids})
    print(f"tokenizers: bytes-256, bpe-200 ({len(bpe.encode(sample).ids)} ids for {len(sample)} chars of sample)")


if __name__ == "__main__":
    main()
