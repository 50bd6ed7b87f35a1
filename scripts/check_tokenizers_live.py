#!/usr/bin/env python3
"""Compares mk's tokenizer with Hugging Face `tokenizers` live: the committed fixtures and variants made here, on the
committed strings and fresh ones. Exits 77 (ctest: skipped) where `tokenizers` is not installed.

Usage: python3 scripts/check_tokenizers_live.py --tool build/tests/tokenizer_batch [--seed N] [--count N]
"""
import argparse
import copy
import json
import pathlib
import random
import subprocess
import sys
import tempfile
import unicodedata

HERE = pathlib.Path(__file__).resolve().parent
FIXTURES = HERE.parent / "tests/data/tokenizers"
SKIPPED = 77


def variants(fixtures, corpus):
    """(name, tokenizer.json dict): the committed fixtures and variants that cover options they leave out."""
    import make_tokenizer_fixtures as make
    base = {name: json.loads((fixtures / name / "tokenizer.json").read_text(encoding="utf-8"))
            for name in ("llama3", "llama2", "metaspace")}
    out = list(base.items())

    def variant(name, source, edit):
        data = copy.deepcopy(base[source] if isinstance(source, str) else source)
        edit(data)
        out.append((name, data))

    variant("llama3-merges-not-ignored", "llama3", lambda d: d["model"].update(ignore_merges=False))
    for behavior in ("Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"):
        variant(f"llama3-split-{behavior}", "llama3",
                lambda d, b=behavior: d["pre_tokenizer"]["pretokenizers"][0].update(behavior=b))
    variant("llama3-split-inverted", "llama3", lambda d: d["pre_tokenizer"]["pretokenizers"][0].update(invert=True))
    variant("llama3-split-word-class", "llama3", lambda d: d["pre_tokenizer"]["pretokenizers"][0].update(
        pattern={"Regex": r"\w+|[^\w\s]+|\s+"}))
    variant("metaspace-unk-decoder", "metaspace", lambda d: (
        d["model"].update(byte_fallback=False, fuse_unk=True),
        d.update(decoder={"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False})))
    variant("metaspace-unk-unfused", "metaspace", lambda d: d["model"].update(byte_fallback=False, fuse_unk=False))
    variant("metaspace-always-split", "metaspace",
            lambda d: d["pre_tokenizer"].update(prepend_scheme="always", split=True))
    variant("llama2-regex-replace", "llama2", lambda d: d["normalizer"]["normalizers"].insert(
        0, {"type": "Replace", "pattern": {"Regex": r"\s+"}, "content": " "}))
    gpt2 = make.train_gpt2(corpus)
    out.append(("gpt2", gpt2))
    variant("gpt2-no-prefix-space", gpt2, lambda d: d["pre_tokenizer"].update(add_prefix_space=False))
    return out


def id_lists(tok, encodings, rng, count):
    """Id sequences for decoding: encodings, slices of them (cut inside characters) and random ids."""
    size = tok.get_vocab_size(with_added_tokens=True)
    lists = list(encodings)
    nonempty = [ids for ids in encodings if ids]
    for i in range(count):
        if i % 2:
            lists.append([rng.randrange(size) for _ in range(rng.randrange(1, 12))])
        else:
            source = rng.choice(nonempty)
            start = rng.randrange(len(source))
            lists.append(source[start:start + rng.randrange(1, 10)])
    return [[i for i in ids if tok.id_to_token(i) is not None] for ids in lists]


def compare(name, data, strings, tool, rng, workdir):
    """Mismatch descriptions for one tokenizer (empty when mk agrees with `tokenizers` everywhere)."""
    from tokenizers import Tokenizer
    path = workdir / f"{name}.json"
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    tok = Tokenizer.from_file(str(path))
    expected = {"encoded": [e.ids for e in tok.encode_batch(strings, add_special_tokens=True)],
                "plain": [e.ids for e in tok.encode_batch(strings, add_special_tokens=False)]}
    tok.encode_special_tokens = True
    expected["split_special"] = [e.ids for e in tok.encode_batch(strings, add_special_tokens=False)]
    tok.encode_special_tokens = False
    lists = id_lists(tok, expected["plain"], rng, 1000)
    expected["decoded"] = tok.decode_batch(lists, skip_special_tokens=False)
    expected["decoded_skip"] = tok.decode_batch(lists, skip_special_tokens=True)

    request, response = workdir / "in.json", workdir / "out.json"
    request.write_text(json.dumps({"texts": strings, "id_lists": lists}, ensure_ascii=False), encoding="utf-8")
    run = subprocess.run([str(tool), str(path), str(request), str(response)], capture_output=True, text=True)
    if run.returncode != 0:
        return [f"{name}: tokenizer_batch failed: {run.stderr.strip()}"]
    got = json.loads(response.read_text(encoding="utf-8"))
    problems = []
    for key, inputs in [("encoded", strings), ("plain", strings), ("split_special", strings), ("decoded", lists),
                        ("decoded_skip", lists)]:
        for item, want, have in zip(inputs, expected[key], got[key]):
            if want != have:
                problems.append(f"{name} {key}: {item!r}: tokenizers {want!r}, mk {have!r}")
    for ids, whole, streamed in zip(lists, got["decoded"], got["streamed"]):
        if "\ufffd" not in whole and streamed != whole:
            problems.append(f"{name} stream: {ids}: decode {whole!r}, streamed {streamed!r}")
    checks = 3 * len(strings) + 3 * len(lists)
    print(f"{name}: {len(strings)} strings, {len(lists)} id lists, {checks} checks, {len(problems)} mismatches")
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tool", required=True, help="the tokenizer_batch test helper")
    parser.add_argument("--seed", type=int, default=2, help="seed of the fresh strings")
    parser.add_argument("--count", type=int, default=1500, help="fresh strings besides the committed ones")
    args = parser.parse_args()
    try:
        import tokenizers
    except ImportError:
        print("SKIPPED: the Python package `tokenizers` is not installed (pip install tokenizers)")
        return SKIPPED
    sys.path.insert(0, str(HERE))
    import tokenizer_strings
    print(f"tokenizers {tokenizers.__version__}")
    # Characters that one Unicode version assigns and the other does not would differ for that reason alone.
    regex_unicode = subprocess.run([args.tool, "--unicode-version"], capture_output=True, text=True).stdout.strip()
    same_unicode = regex_unicode == unicodedata.unidata_version
    if not same_unicode:
        print(f"no random code points: mk's regexes have Unicode {regex_unicode}, Python {unicodedata.unidata_version}")
    rng = random.Random(args.seed)
    committed = json.loads((FIXTURES / "strings.json").read_text(encoding="utf-8"))["strings"]
    strings = committed + tokenizer_strings.random_strings(rng, args.count, any_code_point=same_unicode)
    problems = []
    with tempfile.TemporaryDirectory() as workdir:
        for name, data in variants(FIXTURES, tokenizer_strings.training_corpus(lines=5000)):
            problems += compare(name, data, strings, pathlib.Path(args.tool), rng, pathlib.Path(workdir))
    for problem in problems[:20]:
        print(problem)
    print(f"{len(problems)} mismatches in all")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
