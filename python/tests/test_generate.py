"""Generation from Python: the same tokens as `mk generate`, batches, sampling, streaming, text prompts."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import megakernel
from megakernel import MkError

from conftest import TOKENIZER_FIXTURES


@pytest.fixture(scope="module")
def tiny() -> megakernel.Model:
    return megakernel.Model.preset("tiny")


def mk_generate_tokens(run_mk, *args) -> list[list[int]]:
    """The `tokens:` lines of `mk generate` (prompt, then the new ids), one per sequence."""
    lines = re.findall(r"^tokens: (.*)$", run_mk("generate", *args), re.MULTILINE)
    return [[int(i) for i in line.split()] for line in lines]


@pytest.mark.parametrize("engine", ["cpu-vm", "reference"])
def test_greedy_equals_mk_generate(tiny, run_mk, engine):
    new = tiny.generate([1, 2, 3], max_new_tokens=8, engine=engine)
    assert len(new) == 8
    (expected,) = mk_generate_tokens(run_mk, "--preset", "tiny", "--prompt-ids", "1,2,3", "--max-new-tokens", 8,
                                     "--engine", engine)
    assert [1, 2, 3] + new == expected


def test_sampled_batch_equals_mk_generate(tiny, run_mk):
    prompts = [[5, 6, 7, 8], [9]]
    new = tiny.generate(prompts, 6, temperature=0.8, top_k=40, top_p=0.9, seed=11, eos_ids=[])
    expected = mk_generate_tokens(run_mk, "--preset", "tiny", "--prompt-ids", "5,6,7,8;9", "--max-new-tokens", 6,
                                  "--temperature", 0.8, "--top-k", 40, "--top-p", 0.9, "--seed", 11)
    assert [p + n for p, n in zip(prompts, new)] == expected


def test_eos_stops_and_is_kept(tiny):
    free = tiny.generate([1, 2, 3], 8)
    stopped = tiny.generate([1, 2, 3], 8, eos_ids=[free[2]])
    assert stopped == free[: free.index(free[2]) + 1]


def test_stream_yields_what_generate_returns(tiny):
    assert list(tiny.stream([1, 2, 3], 8)) == tiny.generate([1, 2, 3], 8)
    stream = tiny.stream([4, 5], 50)
    assert next(stream) == tiny.generate([4, 5], 1)[0]
    stream.close()  # ends the generation at its next step
    with pytest.raises(MkError, match=r"stream\(\) takes one prompt"):
        tiny.stream([[1], [2]])


def test_text_prompts(tmp_path, run_mk):
    run_mk("export", "--preset", "tiny", "--out", tmp_path)
    # Llama 3's fixture without its BOS (2500, past the tiny model's 384 ids): byte-level ids of short ASCII fit.
    tokenizer = json.loads((TOKENIZER_FIXTURES / "llama3" / "tokenizer.json").read_text(encoding="utf-8"))
    tokenizer["post_processor"] = None
    (tmp_path / "tokenizer.json").write_text(json.dumps(tokenizer), encoding="utf-8")
    model = megakernel.Model.from_pretrained(tmp_path)
    prompt = "hi"
    ids = model.encode(prompt)
    assert ids == [71, 72]
    (expected,) = mk_generate_tokens(run_mk, "--model", tmp_path, "--prompt", prompt, "--max-new-tokens", 6)
    new_ids = model.generate(ids, 6)
    assert ids + new_ids == expected
    text = model.generate(prompt, 6)
    assert text == model.decode(new_ids, skip_special_tokens=True)
    assert "".join(model.stream(prompt, 6)) == text
    assert model.generate([prompt, prompt], 6) == [text, text]


def test_errors(tiny):
    if not megakernel.gpu_info()["usable"]:
        with pytest.raises(MkError, match="gpu engine: "):
            tiny.generate([1], 2, engine="gpu")
    with pytest.raises(MkError, match=r"prompt 0: token id 999 at position 1 is outside the vocabulary \[0, 384\)"):
        tiny.generate([1, 999], 2)
    with pytest.raises(MkError, match=r"prompt 0 is empty"):
        tiny.generate([], 2)
    with pytest.raises(MkError, match=r"top_p must be in \(0, 1\], got 2"):
        tiny.generate([1], 2, temperature=1.0, top_p=2.0)
    with pytest.raises(MkError, match=r"cannot generate: it has no embedding"):
        megakernel.Model.preset("seed", layers=1, d_model=256).generate([1], 2)
    with pytest.raises(MkError, match=r"stream\(\) takes one prompt|outside"):
        list(tiny.stream([1, 500], 2))


def test_eos_ids_outside_the_vocabulary_are_refused(tiny):
    # They were accepted, and generation ran on as if there were no EOS.
    for eos in ([7, 384], [-1]):
        with pytest.raises(MkError, match=rf"EOS id {eos[-1]} \(from eos_ids\) is outside the vocabulary \[0, 384\)"):
            tiny.generate([1, 2], 2, engine="reference", eos_ids=eos)


def test_float_ids_are_refused_not_truncated(tiny):
    # int() made 1.9 the id 1, and a float array's ids pass through tolist() as floats.
    for arguments in (dict(prompt=[1, 2.9]), dict(prompt=np.array([[1.0, 2.0]])), dict(eos_ids=[3.5])):
        arguments = {"prompt": [1, 2], **arguments}
        with pytest.raises(MkError, match=r"token id must be a whole number, got"):
            tiny.generate(max_new_tokens=2, engine="reference", **arguments)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (dict(eos_ids=5), r"eos_ids must be a list of token ids, got 5"),
        (dict(eos_ids=np.int64(5)), rf"eos_ids must be a list of token ids, got {re.escape(repr(np.int64(5)))}"),
        (dict(prompt=[1, [2]]), r"prompt must be one prompt's token ids or a list of prompts, not a mix: "
                                r"item 0 is 1, item 1 is \[2\]"),
        (dict(prompt=[[1], 2, 3]), r"not a mix: item 0 is \[1\], item 1 is 2"),
        (dict(prompt=[[1, [2, 3]]]), r"prompt 0's token id must be a whole number, got \[2, 3\]"),  # was a ValueError
        (dict(prompt=5), r"prompt must be text, token ids or a list of prompts, got 5"),
        (dict(prompt=None), r"prompt must be text, token ids or a list of prompts, got None"),
        (dict(temperature=None), r"temperature must be a number, got None"),  # was float()'s TypeError
        (dict(temperature="0.5"), r"temperature must be a number, got '0.5'"),  # was taken for 0.5
        (dict(top_p="hot"), r"top_p must be a number, got 'hot'"),  # was float()'s ValueError
        # nanobind's TypeError naming no argument; skip_special_tokens reached it only with a text prompt, and was
        # ignored with ids:
        (dict(engine=5), r'engine must be "auto", "gpu", "cpu-vm" or "reference", got 5'),
        (dict(engine=None), r'engine must be "auto", "gpu", "cpu-vm" or "reference", got None'),
        (dict(engine="cpu-vm\0"), r"engine must not contain a NUL character"),  # was "unknown engine 'cpu-vm"
        (dict(skip_special_tokens=1), r"skip_special_tokens must be True or False, got 1"),
        (dict(skip_special_tokens=None), r"skip_special_tokens must be True or False, got None"),
        # A bool was taken for the number 1 or 0:
        (dict(max_new_tokens=True), r"max_new_tokens must be a whole number, got True"),
        (dict(prompt=[True, 2]), r"prompt's token id must be a whole number, got True"),
        (dict(prompt=np.array([False, True])), r"prompt's token id must be a whole number, got False"),
        (dict(eos_ids=[False]), r"eos_ids's token id must be a whole number, got False"),
        (dict(temperature=True), r"temperature must be a number, got True"),
        (dict(temperature=1.0, top_p=np.bool_(True)), r"top_p must be a number, got (np\.)?True_?"),
        (dict(temperature=1.0, top_k=True), r"top_k must be a whole number, got True"),
        (dict(temperature=1.0, seed=False), r"seed must be a whole number, got False"),
        (dict(max_context=True), r"max_context must be a whole number, got True"),
    ],
)
def test_arguments_of_the_wrong_form_raise_mk_error_naming_them(tiny, arguments, message):
    # Each raised a plain TypeError ("'int' object is not iterable") naming no argument, or numpy's ValueError.
    arguments = {"prompt": [1, 2], "max_new_tokens": 2, "engine": "reference", **arguments}
    with pytest.raises(MkError, match=message):
        tiny.generate(**arguments)
    with pytest.raises(MkError, match=message):
        list(tiny.stream(**arguments))


@pytest.mark.parametrize(
    "arguments",
    [
        dict(eos_ids=5),
        dict(eos_ids=[3.5]),
        dict(eos_ids=[384]),
        dict(temperature=1.0, top_p=2.0),
        dict(temperature=-1.0),
        dict(top_k=2**40),
        dict(seed=-1),
        dict(max_new_tokens=-5),
        dict(max_context=0),
        dict(prompt=[1, 2, 3], max_context=2),
        dict(prompt=[1, 999]),
        dict(engine="nope"),
    ],
)
def test_stream_checks_its_arguments_when_called_as_generate_does(tiny, arguments):
    # Only the prompt's form was checked at the call; the rest reached the core in the worker thread, so a bad
    # eos_ids or top_p was raised by the first next(), away from the call that gave it.
    arguments = {"prompt": [1, 2], "max_new_tokens": 2, "engine": "reference", **arguments}
    with pytest.raises(MkError) as from_generate:
        tiny.generate(**arguments)
    with pytest.raises(MkError) as from_stream:
        tiny.stream(**arguments)  # not iterated
    assert str(from_stream.value) == str(from_generate.value)


def test_a_cache_past_the_models_positions_is_named_as_such(tiny):
    # The memory was reckoned first: the cache was refused as needing 1907 GiB, not as past the model's positions.
    positions = tiny.config["max_position_embeddings"]
    with pytest.raises(MkError, match=rf"max context {10**9} exceeds the model's max_position_embeddings {positions}"):
        tiny.generate([1, 2], 2, engine="reference", max_context=10**9)


def test_messages_name_the_arguments_not_mk_generates_flags(tiny, run_mk, tmp_path):
    # They said "(--max-context)" and "lower --max-context or --batch, or raise --memory-budget": flags of mk generate,
    # two of which Python has no counterpart of.
    too_long = r"prompt 0 has 3 tokens, more than the KV cache's 2 positions \(max_context\)$"
    for generation in (tiny.generate, tiny.stream):
        with pytest.raises(MkError, match=too_long):
            generation([1, 2, 3], 2, engine="reference", max_context=2)
    # A cache of 2^29 positions a sequence, allowed by the config, needs 8 TiB: more than this machine's memory.
    run_mk("export", "--preset", "tiny", "--layers", 16, "--out", tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["max_position_embeddings"] = 2**29
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = megakernel.Model.from_pretrained(tmp_path)
    for engine in ("cpu-vm", "reference"):
        with pytest.raises(MkError, match=r"the KV cache of batch 1 x max context 536870912 needs 8192.00 GiB .* more "
                                          r"than the memory budget of .*: lower max_context or the number of prompts$"):
            model.stream([1, 2], 2, engine=engine, max_context=2**29)  # checked, not run


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (dict(temperature=1.0, top_p=2.0), r"^top_p must be in \(0, 1\], got 2$"),
        (dict(temperature=1.0, top_p=0.0), r"^top_p must be in \(0, 1\], got 0$"),
        (dict(temperature=-1.0), r"^temperature must be 0 \(greedy\) or positive, got -1$"),
        (dict(temperature=float("nan")), r"^temperature must be 0 \(greedy\) or positive, got nan$"),
    ],
)
def test_sampling_messages_name_the_arguments_not_mk_generates_flags(tiny, arguments, message):
    # top_p's said "top-p": mk generate's flag, without its dashes.
    arguments = {"prompt": [1, 2], "max_new_tokens": 2, "engine": "reference", **arguments}
    for generation in (tiny.generate, tiny.stream):
        with pytest.raises(MkError, match=message):
            generation(**arguments)


def test_the_cores_top_k_check_names_the_argument(tiny):
    # Model.generate refuses a negative top_k before the core (its range as a C++ int32); the core's own check, which a
    # caller of the binding reaches, said "top-k".
    sampling = megakernel._core.SamplingParams()
    sampling.temperature = 1.0
    sampling.top_k = -1
    with pytest.raises(MkError, match=r"^top_k must be 0 \(no limit\) or positive, got -1$"):
        tiny._core.check_generate("reference", [[1, 2]], 2, sampling, None, 0)
    with pytest.raises(MkError, match=r"^top_k must be in \[0, 2\^31\), got -1$"):
        tiny.generate([1, 2], 2, engine="reference", temperature=1.0, top_k=-1)


def test_negative_new_tokens_are_named_not_blamed_on_the_cache(tiny):
    # With a prompt longer than -max_new_tokens, the default cache came to 1 position and the prompt was blamed.
    for generation in (lambda: tiny.generate([1, 2, 3], -5), lambda: list(tiny.stream([1, 2, 3], -5))):
        with pytest.raises(MkError, match=r"max new tokens must not be negative, got -5"):
            generation()


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (dict(prompt=[1, 2**31]), r"prompt 0: token id 2147483648 at position 1 is outside the vocabulary \[0, 384\)"),
        (dict(prompt=[[3], [1, -(2**40)]]), r"prompt 1: token id -1099511627776 at position 1 is outside the vocab"),
        (dict(eos_ids=[2**31]), r"EOS id 2147483648 \(from eos_ids\) is outside the vocabulary \[0, 384\)"),
        (dict(seed=-1), r"seed must be in \[0, 2\^64\), got -1"),
        (dict(seed=2**64), r"seed must be in \[0, 2\^64\), got 18446744073709551616"),
        (dict(top_k=2**40), r"top_k must be in \[0, 2\^31\), got 1099511627776"),
        (dict(max_new_tokens=2**70), r"max_new_tokens must be in \[-2\^63, 2\^63\), got 1180591620717411303424"),
    ],
)
def test_integers_beyond_the_cores_types_raise_mk_error(tiny, arguments, message):
    # They raised nanobind's TypeError with a dump of the binding's overloads, naming no argument.
    arguments = {"prompt": [1, 2], "max_new_tokens": 2, **arguments}
    with pytest.raises(MkError, match=message):
        tiny.generate(engine="reference", **arguments)
    if not isinstance(arguments["prompt"][0], list):  # stream() takes one prompt
        with pytest.raises(MkError, match=message):
            list(tiny.stream(engine="reference", **arguments))
