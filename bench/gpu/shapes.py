"""The random-weight GPU stand-ins (bench/gpu/engine_core.py, two_trees.py): an 8B and a 27B dense target and
the 5-layer DFlash-style drafter of each. Only model configs here, so that any tree's engine can build them."""

from __future__ import annotations

from specpilot.fixtures.random_models import dflash_layer_ids
from specpilot.models.config import DenseConfig, DrafterConfig

MODELS = {
    "dense-8b": DenseConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32,
                            num_heads=32, num_kv_heads=8, head_dim=128, family="llama", rope_theta=500000.0,
                            max_position_embeddings=8192),
    "dense-27b": DenseConfig(vocab_size=151936, hidden_size=5120, intermediate_size=21504, num_layers=64,
                             num_heads=40, num_kv_heads=8, head_dim=128, family="qwen3", qk_norm=True,
                             rope_theta=1000000.0, max_position_embeddings=8192),
    # a CPU dry run of the scripts (bench/gpu/two_trees.py --device cpu)
    "tiny": DenseConfig(vocab_size=512, hidden_size=64, intermediate_size=160, num_layers=4, num_heads=4,
                        num_kv_heads=2, head_dim=16, family="llama", max_position_embeddings=2048),
}


def drafter_for(cfg: DenseConfig) -> DrafterConfig:
    layer = DenseConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
                        num_layers=5, num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                        family="qwen3", qk_norm=True, rope_theta=cfg.rope_theta,
                        max_position_embeddings=cfg.max_position_embeddings)
    return DrafterConfig(layer=layer, target_layer_ids=dflash_layer_ids(cfg.num_layers, 5), block_size=16,
                         mask_token_id=cfg.vocab_size - 1, num_target_layers=cfg.num_layers, selector_rank=256,
                         selector_top_k=16)
