"""The blocks before the last Engram layer: their config fields and the tensors compressed-KV blocks add.

Every block has block 0's tensors (``core.block0_config.dense_tensors`` with prefix ``layers.{n}.``)
and its routed experts. A block with ``compress_ratios[n] > 0`` attends over its window plus compressed
KV; the layer that produces that KV (a ``kv_source_layers`` entry) owns a ``Compressor`` and the layers
that score it (``index_source_layers``) own an ``Indexer``. Extra tensors (prefix ``layers.{n}.attn.``):

====================================  =====  =============================================  =====================
name                                  dtype  shape                                          present on
====================================  =====  =============================================  =====================
``compressor.wkv.weight``             BF16   [head_dim, dim] (promoted to fp32 at ratio>1)  kv sources
``compressor.wgate.weight``           BF16   [head_dim, dim]                                kv sources, ratio > 1
``compressor.norm.weight``            BF16   [head_dim]                                     kv sources
``indexer.wq_b.weight`` / ``.scale``  F8     [index_n_heads * index_head_dim, q_lora_rank]  index sources
``indexer.weights_proj.weight``       BF16   [index_n_heads, dim]                           index sources
``indexer.wk.weight``                 BF16   [index_head_dim, head_dim]                     index and kv sources
``indexer.k_norm.weight``             BF16   [index_head_dim]                               index and kv sources
====================================  =====  =============================================  =====================

The compressor weights may also be stored F32 (the reference holds them in fp32 above ratio 1).
:data:`V41_FLASH_BLOCKS` holds the released values; nothing else in the code names a layer number.
"""

from __future__ import annotations

from dataclasses import dataclass

from engram_viz.config import FP8_BLOCK_SIZE, ConfigError
from engram_viz.core.block0_config import Block0Config

V41_COMPRESS_RATIOS = (0, 0) + (2,) * 18 + (1,) * 20 + (0, 0, 0)  # 40 backbone layers + 3 MTP
COMPRESSOR_DTYPES = "BF16|F32"  # either is accepted for compressor.wkv / wgate


@dataclass(frozen=True)
class BlocksConfig(Block0Config):
    """Block 0's fields plus the compressed-KV ones (reference ``ModelArgs`` names); ``engram_layer_ids``
    says which blocks run: ``0 .. max(engram_layer_ids) - 1`` (:attr:`n_blocks`)."""

    n_layers: int = 40
    compress_ratios: tuple[int, ...] = V41_COMPRESS_RATIOS
    kv_source_layers: tuple[int, ...] = (2, 8, 14, 20)
    index_source_layers: tuple[int, ...] = (2, 8, 14, 20, 24, 28, 32, 36)
    index_n_heads: int = 32
    index_head_dim: int = 128
    index_topk: int = 512
    compress_rope_theta: float = 160000.0
    original_seq_len: int = 65536  # > 0: YaRN on the compressed layers' RoPE
    rope_factor: float = 16.0
    beta_fast: int = 32
    beta_slow: int = 1
    candidate_source_layer: int = 20  # < 0: off; candidate pre-filtering is not ported (must start after the blocks)
    engram_layer_ids: tuple[int, ...] = (1, 14)

    def __post_init__(self) -> None:
        self._check_widths()
        n = self.n_blocks
        if len(self.compress_ratios) < n:
            raise ConfigError(f"compress_ratios has {len(self.compress_ratios)} entries; blocks 0..{n - 1} need {n}")
        for layer, ratio in enumerate(self.compress_ratios):
            if ratio < 0:
                raise ConfigError(
                    f"compress_ratios[{layer}] = {ratio}: expected 0 (window only) or a positive ratio r "
                    "(r tokens pooled into one compressed latent)"
                )
        if 0 <= self.candidate_source_layer < n:
            raise ConfigError(
                f"candidate_source_layer={self.candidate_source_layer} falls inside blocks 0..{n - 1}; "
                "candidate pre-filtering is not ported (V4.1-Flash starts it after the last Engram layer)"
            )
        if self.index_head_dim % FP8_BLOCK_SIZE or self.head_dim % 16 or self.rope_head_dim > self.index_head_dim:
            raise ConfigError(
                f"index_head_dim={self.index_head_dim} must be a multiple of 32 and >= rope_head_dim, "
                f"head_dim={self.head_dim} a multiple of 16 (fp4 groups)"
            )
        for layer in range(n):
            if self.compress_ratios[layer]:
                self.kv_source(layer)
                self.index_source(layer)

    @property
    def n_blocks(self) -> int:
        """Blocks run before the last Engram layer reads its streams."""
        return max(self.engram_layer_ids)

    def ratio(self, layer: int) -> int:
        return self.compress_ratios[layer]

    def _source(self, layer: int, sources: tuple[int, ...], what: str) -> int:
        ratio = self.compress_ratios[layer]
        before = [s for s in sources if s <= layer]
        if not before or self.compress_ratios[before[-1]] != ratio:
            raise ConfigError(
                f"layer {layer} (compress ratio {ratio}) has no {what} at or before it with the same ratio: "
                f"{what}s {list(sources)}"
            )
        src = before[-1]
        if any(self.compress_ratios[k] != ratio for k in range(src, layer + 1)):
            raise ConfigError(f"layers {src}..{layer} change compress ratio between {what} {src} and layer {layer}")
        return src

    def kv_source(self, layer: int) -> int:
        """The layer whose compressor made the compressed KV ``layer`` reads."""
        return self._source(layer, self.kv_source_layers, "kv_source_layer")

    def index_source(self, layer: int) -> int:
        """The layer whose indexer chose the compressed positions ``layer`` attends to."""
        src = self._source(layer, self.index_source_layers, "index_source_layer")
        kv = self.kv_source(layer)
        if kv not in self.index_source_layers:
            raise ConfigError(f"kv source {kv} must also be an index source (its indexer makes the index keys)")
        return src

    @classmethod
    def from_dict(cls, raw: dict, name: str = "config") -> BlocksConfig:
        """The block fields of a reference ``config.json`` (others ignored, absent ones V4.1-Flash's)."""
        if not isinstance(raw, dict):
            raise ConfigError(f"{name} must be a JSON object, got {type(raw).__name__}")
        tuples = ("compress_ratios", "kv_source_layers", "index_source_layers", "engram_layer_ids")
        fixed = {k: tuple(int(v) for v in raw[k]) if k in tuples and k in raw else raw[k] for k in raw}
        cfg = super().from_dict(fixed, name)
        assert isinstance(cfg, BlocksConfig)
        return cfg


V41_FLASH_BLOCKS = BlocksConfig()


def attention_extras(cfg: BlocksConfig, layer: int) -> dict[str, tuple[str, tuple[int, ...]]]:
    """The compressor / indexer tensors block ``layer`` adds (table in the module docstring)."""
    p = f"layers.{layer}.attn."
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    ratio = cfg.ratio(layer)
    if not ratio:
        return out
    d, hd, ihd = cfg.dim, cfg.head_dim, cfg.index_head_dim
    kv_src, idx_src = layer in cfg.kv_source_layers, layer in cfg.index_source_layers
    if kv_src:
        out[p + "compressor.wkv.weight"] = (COMPRESSOR_DTYPES if ratio > 1 else "BF16", (hd, d))
        if ratio > 1:
            out[p + "compressor.wgate.weight"] = (COMPRESSOR_DTYPES, (hd, d))
        out[p + "compressor.norm.weight"] = ("BF16", (hd,))
    if idx_src:
        n = cfg.index_n_heads * ihd
        out[p + "indexer.wq_b.weight"] = ("F8_E4M3", (n, cfg.q_lora_rank))
        out[p + "indexer.wq_b.scale"] = ("F8_E8M0", (-(-n // FP8_BLOCK_SIZE), -(-cfg.q_lora_rank // FP8_BLOCK_SIZE)))
        out[p + "indexer.weights_proj.weight"] = ("BF16", (cfg.index_n_heads, d))
    if idx_src and kv_src:
        out[p + "indexer.wk.weight"] = ("BF16", (ihd, hd))
        out[p + "indexer.k_norm.weight"] = ("BF16", (ihd,))
    return out
