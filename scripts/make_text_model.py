"""Saves a small random-weight Llama with the llama3 tokenizer fixture as a Hugging Face model directory: text in,
text out with `mk generate --prompt` on any machine, without downloading a checkpoint (the text is noise)."""

import argparse
import shutil
from pathlib import Path

import torch
import transformers

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "data" / "tokenizers" / "llama3"
VOCAB = 2560  # the fixture's 2500 ids plus its added tokens (2500..2559)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="the model directory to write (replaced)")
    parser.add_argument("--vocab", type=int, default=VOCAB,
                        help=f"vocabulary size (default {VOCAB}, the fixture's); another size writes no tokenizer, "
                        "for prompts given as ids (a 100k vocabulary takes sampling through several passes)")
    args = parser.parse_args()
    if args.vocab <= 0 or args.vocab % 8 != 0:
        parser.error(f"--vocab must be a positive multiple of 8 (the gpu engine's logits rows), got {args.vocab}")
    # llama3 RoPE; shapes the gpu engine serves.
    config = transformers.LlamaConfig(
        vocab_size=args.vocab, hidden_size=512, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8,
        num_key_value_heads=2, head_dim=64, max_position_embeddings=2048, rms_norm_eps=1e-5, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 1024},
        tie_word_embeddings=True, bos_token_id=2500, eos_token_id=[2501, 2504])
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    shutil.rmtree(args.out, ignore_errors=True)
    model.save_pretrained(args.out)
    if args.vocab == VOCAB:
        for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
            shutil.copy(FIXTURE / name, args.out / name)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
