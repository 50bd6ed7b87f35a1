"""Forward passes from Python on the CPU engines: bit-identical to `mk run`, numpy and torch-CPU inputs, cpu-vm equal
to the reference, info() equal to `mk info --json`, traces."""

from __future__ import annotations

import json

import numpy as np
import pytest

import megakernel

TINY_VOCAB = 384


@pytest.fixture(scope="module")
def tiny() -> megakernel.Model:
    return megakernel.Model.preset("tiny")


def random_tokens(batch: int, seq_len: int, dtype=np.int32, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, TINY_VOCAB, (batch, seq_len)).astype(dtype)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_reference_equals_mk_run_bit_for_bit(tiny, mk_forward, dtype):
    tokens = random_tokens(2, 40, dtype)
    logits = tiny.forward(tokens, engine="reference")
    assert isinstance(logits, np.ndarray)
    assert logits.dtype == np.float32 and logits.shape == (2, 40, TINY_VOCAB)
    np.testing.assert_array_equal(logits, mk_forward(["--preset", "tiny"], tokens))


def test_cpu_vm_equals_reference_bit_for_bit(tiny):
    tokens = random_tokens(3, 72, seed=1)
    np.testing.assert_array_equal(tiny.forward(tokens, engine="cpu-vm"), tiny.forward(tokens, engine="reference"))


def test_repeated_calls_reuse_the_engine_and_agree(tiny):
    tokens = random_tokens(1, 33, seed=2)
    first = tiny.forward(tokens, engine="cpu-vm")
    np.testing.assert_array_equal(tiny(tokens, engine="cpu-vm"), first)
    tiny.forward(random_tokens(2, 16, seed=3), engine="cpu-vm")  # a second cached engine, of another shape
    np.testing.assert_array_equal(tiny.forward(tokens, engine="cpu-vm"), first)
    tiny.clear_engines()
    np.testing.assert_array_equal(tiny.forward(tokens, engine="cpu-vm"), first)


def test_nested_lists_are_taken(tiny):
    tokens = random_tokens(1, 8, seed=4)
    np.testing.assert_array_equal(tiny.forward(tokens.tolist(), engine="reference"), tiny.forward(tokens, "reference"))


def test_auto_runs_the_reference_without_a_gpu(tiny):
    if megakernel.gpu_info()["usable"]:
        pytest.skip("a usable GPU: auto picks the gpu engine (tests/test_gpu.py)")
    tokens = random_tokens(1, 12, seed=5)
    np.testing.assert_array_equal(tiny.forward(tokens), tiny.forward(tokens, engine="reference"))


def test_shape_overrides_are_mks(mk_forward):
    model = megakernel.Model.preset("tiny", seed=7, layers=1, d_ff=256)
    assert model.config["n_layers"] == 1 and model.config["d_ff"] == 256
    tokens = random_tokens(1, 24, seed=6)
    mk_args = ["--preset", "tiny", "--seed", "7", "--layers", "1", "--d-ff", "256"]
    np.testing.assert_array_equal(model.forward(tokens, engine="reference"), mk_forward(mk_args, tokens))


def test_hidden_states_in_and_out_for_the_seed_model(mk_forward):
    model = megakernel.Model.preset("seed", layers=1, d_model=256)
    assert not model.has_embedding and not model.has_lm_head
    hidden = np.random.default_rng(8).standard_normal((1, 48, 256)).astype(np.float32)
    out = model.forward(hidden, engine="reference")
    assert out.shape == (1, 48, 256)
    np.testing.assert_array_equal(out, mk_forward(["--preset", "seed", "--layers", "1", "--d-model", "256"], hidden))
    # float64 hidden states are rounded as float32 ones are (to bf16, as `mk run --input` reads them)
    np.testing.assert_array_equal(model.forward(hidden.astype(np.float64), engine="cpu-vm"), out)


def test_info_is_mk_info_json(tiny, run_mk):
    assert tiny.info() == json.loads(run_mk("info", "--preset", "tiny", "--json"))
    assert tiny.info(4, 64) == json.loads(run_mk("info", "--preset", "tiny", "--batch", 4, "--seq", 64, "--json"))
    assert tiny.config == tiny.info()["config"]
    assert tiny.name == "tiny" and tiny.has_embedding and tiny.has_lm_head
    assert [p["name"] for p in megakernel.presets()][:2] == ["seed", "tiny"]


def test_trace_writes_perfetto_json(tiny, tmp_path):
    summary = tiny.trace(random_tokens(2, 40, seed=9), tmp_path / "trace.json", engine="cpu-vm")
    assert "trace (cpu-vm)" in summary and "attention" in summary
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    assert any(event.get("ph") == "X" for event in events)


class TestTorchCpu:
    @pytest.fixture(autouse=True)
    def torch(self):
        return pytest.importorskip("torch")

    @pytest.mark.parametrize("engine", ["reference", "cpu-vm"])
    def test_torch_in_torch_out_equal_to_numpy(self, tiny, torch, engine):
        tokens = random_tokens(2, 40, np.int64, seed=10)
        logits = tiny.forward(torch.from_numpy(tokens), engine=engine)
        assert isinstance(logits, torch.Tensor)
        assert logits.device.type == "cpu" and logits.dtype == torch.float32
        np.testing.assert_array_equal(logits.numpy(), tiny.forward(tokens, engine="reference"))

    def test_int32_and_noncontiguous_tensors(self, tiny, torch):
        tokens = torch.from_numpy(random_tokens(40, 2, seed=11)).t()  # (2, 40), not contiguous
        expected = tiny.forward(np.ascontiguousarray(tokens.numpy()), engine="reference")
        np.testing.assert_array_equal(tiny.forward(tokens, engine="reference").numpy(), expected)

    def test_bfloat16_hidden_states(self, torch):
        model = megakernel.Model.preset("seed", layers=1, d_model=256)
        hidden = torch.randn(1, 32, 256, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
        out = model.forward(hidden, engine="reference")
        np.testing.assert_array_equal(out.numpy(), model.forward(hidden.float().numpy(), engine="reference"))
