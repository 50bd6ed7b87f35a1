"""The gpu engine from Python (skipped without a usable Hopper GPU): logits for a CUDA torch tensor, computed on the
device's own tensors through DLPack, equal `mk run --engine gpu`'s for the same tokens and stay on the device."""

from __future__ import annotations

import numpy as np
import pytest

import megakernel
from megakernel import MkError

pytestmark = pytest.mark.gpu

if not megakernel.gpu_info()["usable"]:
    pytest.skip(f"gpu engine unavailable: {megakernel.gpu_info()['reason']}", allow_module_level=True)


@pytest.fixture(scope="module")
def tiny() -> megakernel.Model:
    return megakernel.Model.preset("tiny")


@pytest.fixture(scope="module")
def torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    return torch


def tokens(batch: int, seq_len: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 384, (batch, seq_len)).astype(np.int64)


def test_numpy_in_equals_mk_run(tiny, mk_forward):
    ids = tokens(2, 128)
    out = tiny.forward(ids, engine="gpu")
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, mk_forward(["--preset", "tiny"], ids, engine="gpu"))


def test_cuda_tensor_stays_on_the_device_and_equals_mk_run(tiny, torch, mk_forward):
    ids = tokens(2, 128, seed=1)
    cuda_ids = torch.from_numpy(ids).cuda()
    logits = tiny.forward(cuda_ids)  # auto: the gpu engine
    assert logits.device == cuda_ids.device and logits.dtype == torch.bfloat16
    assert logits.shape == (2, 128, 384)
    expected = mk_forward(["--preset", "tiny"], ids, engine="gpu")
    np.testing.assert_array_equal(logits.float().cpu().numpy(), expected)
    # again, int32, from the cached engine
    again = tiny.forward(cuda_ids.to(torch.int32), engine="gpu")
    assert torch.equal(again, logits)


def test_shapes_switch_and_match(tiny, torch, mk_forward):
    for batch, seq_len in [(1, 40), (3, 64), (1, 40)]:
        ids = tokens(batch, seq_len, seed=batch * seq_len)
        out = tiny.forward(torch.from_numpy(ids).cuda(), engine="gpu")
        np.testing.assert_array_equal(out.float().cpu().numpy(), mk_forward(["--preset", "tiny"], ids, engine="gpu"))


def test_hidden_states_on_the_device(torch, mk_forward):
    model = megakernel.Model.preset("seed", layers=2, d_model=512)
    hidden = torch.randn(2, 128, 512, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    out = model.forward(hidden.cuda(), engine="gpu")
    assert out.is_cuda and out.shape == (2, 128, 512)
    args = ["--preset", "seed", "--layers", "2", "--d-model", "512"]
    np.testing.assert_array_equal(out.float().cpu().numpy(), mk_forward(args, hidden.float().numpy(), engine="gpu"))


def test_cpu_engines_take_cuda_tensors(tiny, torch):
    ids = tokens(1, 40, seed=2)
    out = tiny.forward(torch.from_numpy(ids).cuda(), engine="reference")
    assert out.is_cuda and out.dtype == torch.float32
    np.testing.assert_array_equal(out.cpu().numpy(), tiny.forward(ids, engine="reference"))


def test_bad_ids_on_the_device(tiny, torch):
    ids = torch.zeros(1, 40, dtype=torch.int64, device="cuda")
    ids[0, 7] = 384
    with pytest.raises(MkError, match=r"token id 384 at position 7 is outside the vocabulary \[0, 384\)"):
        tiny.forward(ids, engine="gpu")
    with pytest.raises(MkError, match=r"device input must be int32 token ids, got float32"):
        tiny.forward(torch.zeros(1, 40, device="cuda"), engine="gpu")
    with pytest.raises(MkError, match=r"takes token ids of shape \(batch, seq_len\)"):
        tiny.forward(torch.zeros(40, dtype=torch.int32, device="cuda"), engine="gpu")


def test_trace_on_the_gpu(tiny, tmp_path):
    summary = tiny.trace(tokens(2, 128, seed=3), tmp_path / "trace.json", engine="gpu")
    assert "trace (gpu)" in summary and (tmp_path / "trace.json").stat().st_size > 0


def test_generate_on_the_gpu_equals_mk_generate(tiny, run_mk):
    """Generation on the megakernel from Python: the same greedy tokens as `mk generate --engine gpu` for a ragged
    batch, and the streaming iterator gives generate's tokens one step at a time."""
    prompts = [[1, 2, 3, 4, 5], [7, 8]]
    new_ids = tiny.generate(prompts, 12, engine="gpu")
    output = run_mk("generate", "--preset", "tiny", "--engine", "gpu", "--prompt-ids", "1,2,3,4,5;7,8",
                    "--max-new-tokens", "12")
    expected = [[int(t) for t in line.split()[1:]] for line in output.splitlines() if line.startswith("tokens: ")]
    assert [prompt + ids for prompt, ids in zip(prompts, new_ids)] == expected
    assert list(tiny.stream([7, 8], 12, engine="gpu")) == tiny.generate([7, 8], 12, engine="gpu")
