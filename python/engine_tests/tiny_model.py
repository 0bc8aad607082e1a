"""Writes a small random-weight Llama (config.json and sharded safetensors) for the
real-engine tests: nothing is downloaded. Usage: python tiny_model.py DIR"""

from __future__ import annotations

import sys


def write(path: str, seed: int = 0, max_positions: int = 512) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    # Two shards and an index, as a Hub snapshot has.
    model.save_pretrained(path, safe_serialization=True, max_shard_size="300KB")


if __name__ == "__main__":
    write(sys.argv[1])
