"""Bad input raises megakernel.MkError (a RuntimeError) carrying mk's message, never crashes."""

from __future__ import annotations

import numpy as np
import pytest

import megakernel
from megakernel import MkError

from conftest import TOKENIZER_FIXTURES


@pytest.fixture(scope="module")
def tiny() -> megakernel.Model:
    return megakernel.Model.preset("tiny")


def test_mk_error_is_a_runtime_error():
    assert issubclass(MkError, RuntimeError)


@pytest.mark.parametrize(
    ("tokens", "message"),
    [
        (np.zeros(5, np.int32), r"model 'tiny' takes token ids of shape \(batch, seq_len\), got shape \(5\)"),
        (np.zeros((1, 2, 3), np.int32), r"takes token ids of shape \(batch, seq_len\), got shape \(1, 2, 3\)"),
        (np.zeros((0, 4), np.int32), r"batch \(0\) and sequence length \(4\) must be positive"),
        (np.zeros((1, 4), np.float32), r"token ids must be int32 or int64, got float32"),
        (np.array([[1, 2, 384]]), r"token id 384 at position 2 is outside the vocabulary \[0, 384\)"),
        (np.array([[-1, 2]], np.int32), r"token id -1 at position 0 is outside the vocabulary \[0, 384\)"),
        (np.array([[7, 2**32 + 5]]), r"token id 4294967301 at position 1 is outside the vocabulary"),
        (np.zeros((1, 1025), np.int32), r"sequence length 1025 exceeds the model's max_position_embeddings 1024"),
    ],
)
def test_bad_tokens(tiny, tokens, message):
    for engine in ("reference", "cpu-vm"):
        with pytest.raises(MkError, match=message):
            tiny.forward(tokens, engine=engine)


@pytest.mark.parametrize("tokens", [None, "1 2", [[1, 2], [3]], {"ids": [1]}])
def test_tokens_that_are_no_array_raise_mk_error_naming_the_argument(tiny, tokens, tmp_path):
    # None and a dict raised nanobind's TypeError with a dump of the binding's overloads, a ragged list numpy's
    # ValueError; none named the argument.
    for call in (lambda: tiny.forward(tokens, engine="reference"), lambda: tiny.forward(tokens),
                 lambda: tiny.trace(tokens, tmp_path / "t.json", engine="cpu-vm")):
        with pytest.raises(MkError, match=r"tokens must be token ids \(batch, seq_len\), int32 or int64, got "):
            call()


def test_hidden_states_that_are_no_array_name_what_the_model_takes():
    model = megakernel.Model.preset("seed", layers=1, d_model=256)
    with pytest.raises(MkError, match=r"tokens must be hidden states \(batch, seq_len, 256\), float32, got None"):
        model.forward(None, engine="reference")


def test_hidden_states_of_the_wrong_width():
    model = megakernel.Model.preset("seed", layers=1, d_model=256)
    message = r"it takes hidden states of shape \(batch, seq_len, 256\), got shape \(1, 4, 8\)"
    with pytest.raises(MkError, match=message):
        model.forward(np.zeros((1, 4, 8), np.float32), engine="reference")


def test_unknown_engine_and_preset(tiny):
    with pytest.raises(MkError, match=r"unknown engine 'fast' \(available: auto, gpu, cpu-vm, reference\)"):
        tiny.forward(np.zeros((1, 4), np.int32), engine="fast")
    with pytest.raises(MkError, match=r"unknown preset 'huge' \(known: seed, tiny"):
        megakernel.Model.preset("huge")
    with pytest.raises(MkError, match=r"n_heads"):
        megakernel.Model.preset("tiny", heads=3)
    with pytest.raises(MkError, match=r"d_model 100 is not a multiple of the head_dim 64 of preset 'tiny'"):
        megakernel.Model.preset("tiny", d_model=100)


def test_preset_integers_beyond_the_cores_types_raise_mk_error():
    # They raised nanobind's TypeError with a dump of the binding's overloads, naming no argument.
    with pytest.raises(MkError, match=r"seed must be in \[0, 2\^64\), got -1"):
        megakernel.Model.preset("tiny", seed=-1)
    with pytest.raises(MkError, match=r"layers must be in \[-2\^63, 2\^63\), got 36893488147419103232"):
        megakernel.Model.preset("tiny", layers=2**65)


def test_missing_or_broken_model_directory(tmp_path):
    with pytest.raises(MkError, match=r"no such model directory"):
        megakernel.Model.from_pretrained(tmp_path / "nowhere")
    with pytest.raises(MkError, match=r"config.json"):
        megakernel.Model.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(MkError, match=r"config.json"):
        megakernel.Model.from_pretrained(tmp_path)


def test_messages_escape_what_would_steer_the_terminal(tmp_path):
    # The core's message names the directory, ESC and all: shown escaped, as mk's CLI shows it.
    hostile = tmp_path / "model\x1b[2J\x1b]0;title\x07"
    with pytest.raises(MkError) as raised:
        megakernel.Model.from_pretrained(hostile)
    message = str(raised.value)
    assert "no such model directory" in message
    assert "\x1b" not in message and "\x07" not in message
    assert r"model\x1b[2J\x1b]0;title\x07" in message


def test_gpu_engine_without_a_gpu_says_why(tiny):
    info = megakernel.gpu_info()
    if info["usable"]:
        pytest.skip("a usable GPU is here")
    with pytest.raises(MkError, match="gpu engine: " + info["reason"].split(" (")[0]):
        tiny.forward(np.zeros((1, 4), np.int32), engine="gpu")


def test_text_without_a_tokenizer(tiny):
    assert tiny.tokenizer is None
    with pytest.raises(MkError, match=r"model 'tiny' \(preset tiny\) has no tokenizer.json"):
        tiny.encode("hi")
    with pytest.raises(MkError, match=r"has no tokenizer.json"):
        tiny.generate("hi")


def test_trace_needs_a_schedule(tiny, tmp_path):
    with pytest.raises(MkError, match=r"the reference engine runs no schedule"):
        tiny.trace(np.zeros((1, 4), np.int32), tmp_path / "t.json", engine="reference")


def test_max_context_that_is_not_positive_is_refused(tiny):
    # Either was taken for "no max_context given" and generation ran with the default cache.
    for size in (0, -5):
        with pytest.raises(MkError, match=rf"max_context must be in \[1, 2\^63\), got {size}"):
            tiny.generate([1, 2], 2, engine="reference", max_context=size)


def test_info_sizes_beyond_the_cores_types_raise_mk_error(tiny):
    # They raised nanobind's TypeError with a dump of the binding's overloads, naming no argument.
    with pytest.raises(MkError, match=r"batch must be in \[-2\^63, 2\^63\), got 1180591620717411303424"):
        tiny.info(2**70, 1)
    with pytest.raises(MkError, match=r"seq_len must be a whole number, got 1.5"):
        tiny.info(1, 1.5)


def test_token_ids_that_are_not_whole_int32_are_refused_by_the_tokenizer():
    tokenizer = megakernel.Tokenizer.load(TOKENIZER_FIXTURES / "llama2")
    decoder = tokenizer.stream_decoder()
    # int() took 1.7 for id 1 and "5" for id 5; 2^40 raised nanobind's TypeError naming no argument.
    calls = [lambda: tokenizer.decode([1.7, 2]), lambda: tokenizer.decode(["5"]), lambda: decoder.push(3.9),
             lambda: list(tokenizer.stream([1.5])), lambda: tokenizer.is_special(2.0)]
    for call in calls:
        with pytest.raises(MkError, match=r"token id must be a whole number, got "):
            call()
    for call in (lambda: tokenizer.decode([2**40]), lambda: decoder.push(2**40), lambda: tokenizer.id_to_token(2**40)):
        with pytest.raises(MkError, match=r"token id must be in \[-2\^31, 2\^31\), got 1099511627776"):
            call()


@pytest.mark.parametrize(
    ("method", "argument", "message"),
    [
        ("decode", 5, r"ids must be a list of token ids, got 5"),
        ("decode", None, r"ids must be a list of token ids, got None"),
        ("encode", 5, r"text must be a str, got 5"),
        ("encode", None, r"text must be a str, got None"),
        ("encode", b"hi", r"text must be a str, got b'hi'"),
        ("stream", 5, r"ids must be an iterable of token ids, got 5"),
        ("stream", None, r"ids must be an iterable of token ids, got None"),
    ],
)
def test_tokenizer_arguments_of_the_wrong_form_raise_mk_error_naming_them(method, argument, message):
    # Each raised a TypeError naming no argument ("'int' object is not iterable", or nanobind's list of overloads),
    # stream's only once iterated; stream() must refuse at the call, not at the first next().
    tokenizer = megakernel.Tokenizer.load(TOKENIZER_FIXTURES / "llama2")
    with pytest.raises(MkError, match=message):
        getattr(tokenizer, method)(argument)


def test_trace_refuses_to_overwrite_the_models_files(run_mk, tmp_path):
    # The trace JSON was written over the weights (or config.json) the model was loaded from.
    directory = tmp_path / "m"
    run_mk("export", "--preset", "tiny", "--out", directory)
    model = megakernel.Model.from_pretrained(directory)
    for name in ("model.safetensors", "config.json"):
        before = (directory / name).read_bytes()
        with pytest.raises(MkError, match=rf"trace path .*{name} is the same file as model file {name}"):
            model.trace(np.zeros((1, 4), np.int32), directory / name, engine="cpu-vm")
        assert (directory / name).read_bytes() == before


ENGINE_MESSAGE = r'engine must be "auto", "gpu", "cpu-vm" or "reference", got '


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda m, tmp: m.forward(np.zeros((1, 4), np.int32), engine=5), ENGINE_MESSAGE + "5"),
        (lambda m, tmp: m(np.zeros((1, 4), np.int32), engine=None), ENGINE_MESSAGE + "None"),
        (lambda m, tmp: m.forward(np.zeros((1, 4), np.int32), engine="cpu\0vm"), r"engine must not contain a NUL"),
        (lambda m, tmp: m.trace(np.zeros((1, 4), np.int32), tmp / "t.json", engine=5), ENGINE_MESSAGE + "5"),
        (lambda m, tmp: m.trace(np.zeros((1, 4), np.int32), 5, engine="cpu-vm"),
         r"path must be a str or os.PathLike, got 5"),
        (lambda m, tmp: megakernel.Model.from_pretrained(5), r"directory must be a str or os.PathLike, got 5"),
        (lambda m, tmp: megakernel.Model.from_pretrained(None), r"directory must be a str or os.PathLike, got None"),
        (lambda m, tmp: megakernel.Model.from_pretrained(f"{tmp}\0x"), r"directory must not contain a NUL character"),
        (lambda m, tmp: megakernel.Model.preset(5), r"name must be a str, got 5"),
        (lambda m, tmp: megakernel.Model.preset("ti\0ny"), r"name must not contain a NUL character"),
        (lambda m, tmp: megakernel.Model("tiny"),
         r"Model\(\) takes no 'tiny': create one with Model.from_pretrained\(directory\) or Model.preset\(name\)"),
    ],
)
def test_model_arguments_of_the_wrong_type_raise_mk_error_naming_them(tiny, tmp_path, call, message):
    # Each raised a TypeError naming no argument (nanobind's list of the binding's overloads, os.fspath()'s, or
    # Model("tiny")'s "'str' object has no attribute"); a NUL cut the core's message short ("unknown preset 'ti").
    with pytest.raises(MkError, match=message):
        call(tiny, tmp_path)


def test_bools_are_not_taken_for_numbers(tiny):
    # Each was taken for the number 1 or 0.
    calls = [lambda: megakernel.Model.preset("tiny", seed=True), lambda: megakernel.Model.preset("tiny", layers=True),
             lambda: tiny.info(True, 4), lambda: tiny.info(1, np.bool_(False))]
    for call, name in zip(calls, ["seed", "layers", "batch", "seq_len"]):
        with pytest.raises(MkError, match=rf"{name} must be a whole number, got (np\.)?(True|False)"):
            call()


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda t: t.encode("hi", add_special_tokens=1), r"add_special_tokens must be True or False, got 1"),
        (lambda t: t.encode("hi", split_special_tokens=None), r"split_special_tokens must be True or False, got None"),
        (lambda t: t.decode([1], skip_special_tokens="yes"), r"skip_special_tokens must be True or False, got 'yes'"),
        (lambda t: t.stream([1], skip_special_tokens=0), r"skip_special_tokens must be True or False, got 0"),
        (lambda t: t.stream_decoder(skip_special_tokens=0), r"skip_special_tokens must be True or False, got 0"),
        (lambda t: t.token_to_id(5), r"token must be a str, got 5"),
        (lambda t: t.decode([True]), r"token id must be a whole number, got True"),  # was id 1
        (lambda t: t.is_special(False), r"token id must be a whole number, got False"),  # was id 0
        (lambda t: megakernel.Tokenizer.from_json(5), r"json_text must be a str, got 5"),
        (lambda t: megakernel.Tokenizer.load(None), r"path must be a str or os.PathLike, got None"),
        (lambda t: megakernel.Tokenizer(str(TOKENIZER_FIXTURES)), r"Tokenizer\(\) takes no '.*': create one with "
                                                                   r"Tokenizer.load\(path\) or Tokenizer.from_json"),
        (lambda t: megakernel.StreamDecoder(3), r"StreamDecoder\(\) takes no 3: create one with "
                                                r"Tokenizer.stream_decoder\(\)"),
    ],
)
def test_tokenizer_arguments_of_the_wrong_type_raise_mk_error_naming_them(call, message):
    # Each raised nanobind's TypeError naming no argument (the constructors a TypeError or AttributeError on first
    # use), or took a bool for an id; stream() must refuse at the call, not at the first next().
    tokenizer = megakernel.Tokenizer.load(TOKENIZER_FIXTURES / "llama2")
    with pytest.raises(MkError, match=message):
        call(tokenizer)


def test_flags_and_paths_of_the_forms_python_allows_are_taken():
    # The checks above refuse what is no bool, str or path; bytes paths pass, and numpy's bools, which nanobind
    # refused with its TypeError, are taken as Python's.
    tokenizer = megakernel.Tokenizer.load(bytes(TOKENIZER_FIXTURES / "llama2"))
    assert tokenizer.encode("hi", add_special_tokens=np.bool_(False)) == tokenizer.encode("hi", False)
    assert tokenizer.decode([1, 2], skip_special_tokens=np.True_) == tokenizer.decode([1, 2], True)
