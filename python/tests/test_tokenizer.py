"""The tokenizer from Python on the committed fixtures (tests/data/tokenizers): ids as `tokenizers` gives them,
decode(encode(s)) as it does, streaming equal to the whole decode."""

from __future__ import annotations

import json

import numpy as np
import pytest

from megakernel import MkError, Tokenizer

from conftest import TOKENIZER_FIXTURES

FAMILIES = ["llama3", "llama2", "metaspace"]


def utf8_strings() -> list[tuple[int, str]]:
    """The fixture strings Python can hold as text (JSON escapes of lone surrogates cannot be encoded)."""
    strings = json.loads((TOKENIZER_FIXTURES / "strings.json").read_text(encoding="utf-8"))["strings"]
    out = []
    for i, text in enumerate(strings):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            continue
        out.append((i, text))
    return out


@pytest.fixture(scope="module", params=FAMILIES)
def family(request) -> tuple[Tokenizer, dict]:
    directory = TOKENIZER_FIXTURES / request.param
    return Tokenizer.load(directory), json.loads((directory / "expected.json").read_text(encoding="utf-8"))


def test_ids_equal_tokenizers(family):
    tokenizer, expected = family
    strings = utf8_strings()
    assert len(strings) >= 2000
    for i, text in strings:
        assert tokenizer.encode(text, add_special_tokens=False) == expected["ids"][i], f"string {i}: {text!r}"
        assert tokenizer.encode(text) == expected["special_prefix"] + expected["ids"][i]
        split = tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)
        assert split == expected.get("split_special", {}).get(str(i), expected["ids"][i])


def test_round_trip_and_decode_equal_tokenizers(family):
    tokenizer, expected = family
    for i, text in utf8_strings():
        back = tokenizer.decode(tokenizer.encode(text, add_special_tokens=False))
        assert back == expected.get("roundtrip", {}).get(str(i), text), f"string {i}: {text!r}"
    for case in expected["decode"]:
        assert tokenizer.decode(case["ids"]) == case["text"]
        assert tokenizer.decode(np.array(case["ids"], np.int64), skip_special_tokens=True) == case["skip_special"]


def test_stream_equals_whole_decode(family):
    tokenizer, _ = family
    for _, text in utf8_strings()[:500]:
        ids = tokenizer.encode(text)
        assert "".join(tokenizer.stream(ids)) == tokenizer.decode(ids)


def test_stream_holds_back_partial_characters():
    tokenizer = Tokenizer.load(TOKENIZER_FIXTURES / "llama3")
    text = "\U00013000"  # in no vocabulary: byte tokens
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) >= 2
    decoder = tokenizer.stream_decoder()
    assert [decoder.push(i) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert decoder.push(ids[-1]) == text and decoder.finish() == ""
    assert list(tokenizer.stream(ids)) == [text]


def test_special_tokens_bos_and_eos():
    llama3 = Tokenizer.load(TOKENIZER_FIXTURES / "llama3")
    assert llama3.bos_id == 2500 and llama3.eos_ids == [2501, 2504]
    assert llama3.special_tokens["<|begin_of_text|>"] == 2500
    assert llama3.token_to_id("<|begin_of_text|>") == 2500 and llama3.is_special(2500)
    assert llama3.id_to_token(2500) == "<|begin_of_text|>" and llama3.id_to_token(10**6) is None
    assert llama3.decode(llama3.encode("hi")) == "<|begin_of_text|>hi"
    llama2 = Tokenizer.load(TOKENIZER_FIXTURES / "llama2" / "tokenizer.json")
    assert llama2.decode(llama2.encode("hi"), skip_special_tokens=True) == "hi"
    assert llama2.vocab_size == 2257


def test_errors_carry_mks_message(tmp_path):
    tokenizer = Tokenizer.load(TOKENIZER_FIXTURES / "llama2")
    with pytest.raises(MkError, match=r"token id 1000000 is not in the vocabulary \(ids 0..2256\)"):
        tokenizer.decode([5, 10**6])
    with pytest.raises(MkError, match=r"no tokenizer.json at"):
        Tokenizer.load(tmp_path)
    with pytest.raises(MkError, match=r"not valid JSON|JSON"):
        Tokenizer.from_json("{")

def test_from_json_text():
    text = (TOKENIZER_FIXTURES / "llama2" / "tokenizer.json").read_text(encoding="utf-8")
    loaded = Tokenizer.load(TOKENIZER_FIXTURES / "llama2")
    assert Tokenizer.from_json(text).encode("the kernel", add_special_tokens=False) == loaded.encode(
        "the kernel", add_special_tokens=False
    )
