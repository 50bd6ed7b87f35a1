#!/usr/bin/env python3
"""Trains small Llama-3-, Llama-2- and GPT-2-style tokenizers with Hugging Face `tokenizers` and writes them, the
test strings and the ids `tokenizers` gives for each string, to tests/data/tokenizers/ (the C++ conformance fixtures).

Usage: pip install tokenizers && python3 scripts/make_tokenizer_fixtures.py [--out tests/data/tokenizers]
"""
import argparse
import json
import pathlib
import random
import sys

import tokenizers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import tokenizer_strings  # noqa: E402

# The pre-tokenizer regex of Meta's Llama 3 tokenizer.json.
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                  r"\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                  "<|python_tag|>"] + [f"<|reserved_special_token_{i}|>" for i in range(10)]


def progress(message):
    if sys.stderr.isatty():
        print(message, file=sys.stderr, flush=True)


def template(bos, bos_id):
    return processors.TemplateProcessing(single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
                                         special_tokens=[(bos, bos_id)])


def train_llama3(corpus):
    """Byte-level BPE as Llama 3: Split with its regex, then ByteLevel; specials after the vocabulary."""
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=2500, min_frequency=2, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in LLAMA3_SPECIAL])
    # Added-token options the real files rarely use, so that their handling is checked too.
    tok.add_special_tokens([AddedToken("<mask>", special=True, lstrip=True, normalized=False)])
    tok.add_tokens([AddedToken("@@user", single_word=True, normalized=False),
                    AddedToken("<sep>", rstrip=True, normalized=True)])
    bos = "<|begin_of_text|>"
    tok.post_processor = processors.Sequence([processors.ByteLevel(trim_offsets=False),
                                              template(bos, tok.token_to_id(bos))])
    return json.loads(tok.to_str())


def train_gpt2(corpus):  # used by the live check only
    """Byte-level BPE as GPT-2: ByteLevel's own regex with a prefix space, "a b" merges, no BOS."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=1200, min_frequency=2, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<|endoftext|>"]))
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    data = json.loads(tok.to_str())
    data["model"]["merges"] = [" ".join(pair) for pair in data["model"]["merges"]]
    return data


def train_sentencepiece_vocab(corpus):
    """A SentencePiece-like BPE vocabulary: <unk> <s> </s>, the 256 <0xNN> byte tokens, then pieces with ▁."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=2000, min_frequency=2, limit_alphabet=180, show_progress=False,
        special_tokens=["<unk>", "<s>", "</s>"]))
    trained = json.loads(tok.to_str())["model"]
    pieces = sorted((i, t) for t, i in trained["vocab"].items() if t not in ("<unk>", "<s>", "</s>"))
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    for _, piece in pieces:
        vocab.setdefault(piece, len(vocab))
    return vocab, trained["merges"]


def added(content, token_id, special=True, normalized=False):
    return {"id": token_id, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": normalized, "special": special}


def sentencepiece_tokenizer(vocab, merges, legacy=False, byte_fallback=True, metaspace_decoder=False):
    """Llama 2's layout (normalizer Prepend+Replace, "a b" merges) or, legacy=True, the layout of transformers'
    legacy=False conversions (Metaspace pre-tokenizer, prepend_scheme "first", [a, b] merges)."""
    model = {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": byte_fallback, "ignore_merges": False,
             "vocab": vocab, "merges": merges if legacy else [" ".join(pair) for pair in merges]}
    metaspace = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False}
    decoder = metaspace if metaspace_decoder else {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"},
        {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [added("<unk>", 0), added("<s>", 1), added("</s>", 2),
                         added("<<SYS>>", len(vocab), special=False, normalized=True)],
        "normalizer": None if legacy else {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
        "pre_tokenizer": metaspace if legacy else None,
        "post_processor": json.loads(template("<s>", 1).__getstate__()),
        "decoder": decoder,
        "model": model,
    }


def decode_cases(tok, encodings, rng, count=300):
    """Id sequences that stress the decoders: slices of real encodings (cut inside characters) and random ids."""
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    cases = []
    nonempty = [ids for ids in encodings if ids]
    for i in range(count):
        if i % 3 == 2:
            ids = [rng.randrange(vocab_size) for _ in range(rng.randrange(1, 10))]
        else:
            source = rng.choice(nonempty)
            start = rng.randrange(len(source))
            ids = source[start:start + rng.randrange(1, 12)]
        ids = [i for i in ids if tok.id_to_token(i) is not None]
        cases.append({"ids": ids, "text": tok.decode(ids, skip_special_tokens=False),
                      "skip_special": tok.decode(ids, skip_special_tokens=True)})
    return cases


def expectations(name, tok, strings, rng):
    """What `tokenizers` gives: ids without specials for every string, the post-processor's added ids (checked to be
    the same for every string), ids with special-token text split as plain text where they differ, round trips where
    they differ from the string, and decode cases."""
    ids = [e.ids for e in tok.encode_batch(strings, add_special_tokens=False)]
    with_special = [e.ids for e in tok.encode_batch(strings, add_special_tokens=True)]
    prefix = with_special[0][: len(with_special[0]) - len(ids[0])]
    for plain, full in zip(ids, with_special):
        assert full == prefix + plain, f"{name}: the post-processor does more than prepend {prefix}"
    tok.encode_special_tokens = True
    split = [e.ids for e in tok.encode_batch(strings, add_special_tokens=False)]
    tok.encode_special_tokens = False
    decoded = tok.decode_batch(ids, skip_special_tokens=False)
    return {
        "tokenizer": name, "tokenizers_version": tokenizers.__version__, "strings": len(strings),
        "special_prefix": prefix,
        "ids": ids,
        "split_special": {str(i): s for i, (s, p) in enumerate(zip(split, ids)) if s != p},
        "roundtrip": {str(i): d for i, (d, s) in enumerate(zip(decoded, strings)) if d != s},
        "decode": decode_cases(tok, ids, rng),
    }


def dump_compact(value, path):
    """JSON with one list entry or object member per line: small, and diffs stay readable."""
    def one(v):
        return json.dumps(v, ensure_ascii=False, separators=(",", ":"))

    def lines(v):
        if isinstance(v, list) and v and isinstance(v[0], (list, dict, str)):
            return "[\n" + ",\n".join(one(x) for x in v) + "\n]"
        if isinstance(v, dict):
            return "{\n" + ",\n".join(f"{one(k)}:{lines(x)}" for k, x in v.items()) + "\n}"
        return one(v)
    path.write_text(lines(value) + "\n", encoding="utf-8")


def write_fixture(out, name, data, strings, rng, extra_files=lambda tok: {}):
    """Writes tokenizer.json (checked to load in `tokenizers`), extra_files(tok) (config files) and expected.json."""
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, ensure_ascii=False, indent=1)
    tok = Tokenizer.from_str(text)
    (folder / "tokenizer.json").write_text(text + "\n", encoding="utf-8")
    for file_name, content in extra_files(tok).items():
        (folder / file_name).write_text(json.dumps(content, indent=2) + "\n", encoding="utf-8")
    dump_compact(expectations(name, tok, strings, rng), folder / "expected.json")
    progress(f"{name}: {len(strings)} strings, vocabulary {tok.get_vocab_size()}")


def llama3_configs(tok):
    """As Meta's Llama 3 instruct checkpoints: the chat EOS in tokenizer_config, both stop ids in generation_config."""
    return {
        "tokenizer_config.json": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
                                  "tokenizer_class": "PreTrainedTokenizerFast"},
        "generation_config.json": {"bos_token_id": tok.token_to_id("<|begin_of_text|>"),
                                   "eos_token_id": [tok.token_to_id("<|end_of_text|>"), tok.token_to_id("<|eot_id|>")]},
    }


def llama2_configs(_):
    return {"tokenizer_config.json": {"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>",
                                      "eos_token": "</s>", "tokenizer_class": "LlamaTokenizer"}}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(pathlib.Path(__file__).resolve().parent.parent / "tests/data/tokenizers"))
    out = pathlib.Path(parser.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    strings = tokenizer_strings.test_strings()
    dump_compact({"strings": strings}, out / "strings.json")
    progress(f"{len(strings)} test strings; training")
    corpus = tokenizer_strings.training_corpus()
    rng = random.Random(7)
    write_fixture(out, "llama3", train_llama3(corpus), strings, rng, llama3_configs)
    vocab, merges = train_sentencepiece_vocab(corpus)
    write_fixture(out, "llama2", sentencepiece_tokenizer(vocab, merges), strings, rng, llama2_configs)
    write_fixture(out, "metaspace", sentencepiece_tokenizer(vocab, merges, legacy=True), strings, rng)


if __name__ == "__main__":
    main()
