"""Model.from_pretrained on directories `mk export` writes: config.json (Hugging Face) or mk_config.json (the seed's),
with a tokenizer.json beside the weights or without."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

import megakernel

from conftest import TOKENIZER_FIXTURES, read_safetensors


@pytest.fixture(scope="module")
def exported_tiny(tmp_path_factory, run_mk) -> tuple[Path, np.ndarray]:
    """A tiny model written by `mk export` with its random input, and the llama2 fixture tokenizer beside it."""
    directory = tmp_path_factory.mktemp("tiny")
    run_mk("export", "--preset", "tiny", "--seed", 3, "--out", directory, "--input", directory / "in.safetensors")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TOKENIZER_FIXTURES / "llama2" / name, directory / name)
    return directory, read_safetensors(directory / "in.safetensors")["tokens"]


def test_forward_equals_mk_run_on_the_directory(exported_tiny, mk_forward):
    directory, tokens = exported_tiny
    model = megakernel.Model.from_pretrained(directory)
    assert (directory / "config.json").exists() and model.config["vocab_size"] == 384
    expected = mk_forward(["--model", directory], tokens)
    for engine in ("reference", "cpu-vm"):
        np.testing.assert_array_equal(model.forward(tokens, engine=engine), expected)
    # the preset with the same seed is the same model
    np.testing.assert_array_equal(megakernel.Model.preset("tiny", seed=3).forward(tokens, "reference"), expected)
    assert model.info()["batch"] == 1 and model.info()["seq_len"] == 128  # `mk info --model`'s default shape


def test_tokenizer_beside_the_weights(exported_tiny):
    model = megakernel.Model.from_pretrained(exported_tiny[0])
    assert model.tokenizer is not None and model.tokenizer.bos_id == 1
    assert model.encode("the kernel") == [1, 485, 1007]
    assert model.decode([1, 485, 1007], skip_special_tokens=True) == "the kernel"


def test_the_tokenizers_eos_is_the_default_when_the_config_names_none(exported_tiny, run_mk):
    # The exported config.json has no eos_token_id; llama2's </s> lies in the tiny model's vocabulary. mk generate of
    # ids, which reads no text, had no EOS where the Model took the tokenizer's.
    model = megakernel.Model.from_pretrained(exported_tiny[0])
    assert model.eos_ids and model.eos_ids == megakernel.Tokenizer.load(exported_tiny[0]).eos_ids
    output = run_mk("generate", "--model", exported_tiny[0], "--prompt-ids", "1,2", "--max-new-tokens", 1)
    assert f"; EOS {' '.join(map(str, model.eos_ids))}\n" in output


def test_a_tokenizer_eos_outside_the_models_vocabulary_is_refused(tmp_path, run_mk):
    # llama3's <|eot_id|> lies past the tiny model's 384 ids: it was taken, and generation ran on to the budget as if
    # there were no EOS.
    run_mk("export", "--preset", "tiny", "--out", tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TOKENIZER_FIXTURES / "llama3" / name, tmp_path / name)
    (eos,) = megakernel.Tokenizer.load(tmp_path).eos_ids
    assert eos >= 384
    source = re.escape(str(tmp_path / "tokenizer_config.json"))
    message = rf"{source}: eos_token \"<\|eot_id\|>\" names no id in the model's vocabulary \[0, 384\), got {eos}"
    with pytest.raises(megakernel.MkError, match=message):
        megakernel.Model.from_pretrained(tmp_path)


def test_seed_model_with_mk_config_json(tmp_path, run_mk, mk_forward):
    run_mk("export", "--preset", "seed", "--layers", 1, "--d-model", 256, "--out", tmp_path)
    assert (tmp_path / "mk_config.json").exists()
    model = megakernel.Model.from_pretrained(tmp_path)
    assert not model.has_embedding and model.tokenizer is None
    hidden = np.random.default_rng(0).standard_normal((2, 16, 256)).astype(np.float32)
    np.testing.assert_array_equal(model.forward(hidden, "reference"), mk_forward(["--model", tmp_path], hidden))


def test_weights_the_config_leaves_unused_load_with_a_warning(tmp_path, run_mk):
    run_mk("export", "--preset", "tiny", "--out", tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["num_hidden_layers"] = 1
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.warns(UserWarning, match=r"holds 9 tensor\(s\) the model's config leaves unused"):
        model = megakernel.Model.from_pretrained(tmp_path)
    assert model.config["n_layers"] == 1
