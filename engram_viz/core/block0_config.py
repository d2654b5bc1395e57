"""Block 0 of DeepSeek-V4.1-Flash: its config fields and its checkpoint tensors (names, dtypes, shapes).

Block 0 is the only block before the first Engram layer (layer 1 reads its output). It is a pure
sliding-window block (``compress_ratios[0] == 0``): hyper-connection mixing around an attention and
an MoE FFN. Field names are the reference ``config.json`` keys; :data:`V41_FLASH_BLOCK0` holds the
released values. Tensor names follow the reference module tree (``layers.0.attn.wq_a.weight``, ...):

=========================================  =========  ==============================================
name (prefix ``layers.0.``)                dtype      shape
=========================================  =========  ==============================================
``hc_attn_fn``, ``hc_ffn_fn``              F32        [(2 + hc) * hc, hc * dim]
``hc_attn_base``, ``hc_ffn_base``          F32        [(2 + hc) * hc]
``hc_attn_scale``, ``hc_ffn_scale``        F32        [3]
``attn_norm.weight``, ``ffn_norm.weight``  BF16       [dim]
``attn.attn_sink``                         F32        [n_heads]
``attn.wq_a.weight`` / ``.scale``          F8 / E8M0  [q_lora_rank, dim] / 32 x 32 blocks
``attn.q_norm.weight``                     BF16       [q_lora_rank]
``attn.wq_b.weight`` / ``.scale``          F8 / E8M0  [n_heads * head_dim, q_lora_rank]
``attn.wkv.weight`` / ``.scale``           F8 / E8M0  [head_dim, dim]
``attn.kv_norm.weight``                    BF16       [head_dim]
``attn.wo_a.weight``                       BF16       [o_groups * o_lora_rank, n_heads * head_dim / o_groups]
``attn.wo_b.weight`` / ``.scale``          F8 / E8M0  [dim, o_groups * o_lora_rank]
``ffn.gate.weight``                        BF16       [n_routed_experts, dim]
``ffn.gate.bias``, ``ffn.gate.bias_vl``    F32        [n_routed_experts]
``ffn.experts.{e}.w1/w3.weight``           F4         [moe_inter_dim, dim] (two values a byte)
``ffn.experts.{e}.w2.weight``              F4         [dim, moe_inter_dim]
``ffn.experts.{e}.w{1,2,3}.scale``         E8M0       [out, in / 32]
``ffn.shared_experts.w{1,2,3}.weight``     F8 / E8M0  as ``w1: [inter, dim]``, 32 x 32 block scales
``embed.weight`` (no prefix)               BF16       [vocab_size, dim]
=========================================  =========  ==============================================
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from engram_viz.config import FP8_BLOCK_SIZE, ConfigError

PREFIX = "layers.0."
FP4_BLOCK = 32  # one e8m0 scale per 32 fp4 values along K


@dataclass(frozen=True)
class Block0Config:
    """The config fields block 0 needs (reference ``ModelArgs`` names)."""

    vocab_size: int = 129280
    dim: int = 5120
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    norm_eps: float = 1e-20
    n_heads: int = 64
    head_dim: int = 512
    rope_head_dim: int = 64
    rope_theta: float = 10000.0
    q_lora_rank: int = 1280
    o_groups: int = 8
    o_lora_rank: int = 1024
    window_size: int = 128
    n_routed_experts: int = 384
    n_activated_experts: int = 6
    moe_inter_dim: int = 2304
    route_scale: float = 1.5
    swiglu_limit: float = 10.0
    score_func: str = "sqrtsoftplus"
    norm_topk_prob: bool = True
    compress_ratio: int = 0  # compress_ratios[0]; block 0 of V4.1-Flash attends over its window only

    def __post_init__(self) -> None:
        if self.compress_ratio != 0:
            raise ConfigError(f"compress_ratios[0] is {self.compress_ratio}; block 0 must be sliding-window only (0)")
        self._check_widths()

    def _check_widths(self) -> None:
        if self.score_func != "sqrtsoftplus":
            raise ConfigError(f"score_func is {self.score_func!r}; block 0 is ported for 'sqrtsoftplus' only")
        for name in ("dim", "q_lora_rank", "head_dim", "moe_inter_dim"):
            if getattr(self, name) % FP8_BLOCK_SIZE:
                raise ConfigError(f"{name}={getattr(self, name)} must be a multiple of {FP8_BLOCK_SIZE}")
        if (self.n_heads * self.head_dim) % self.o_groups or self.rope_head_dim % 2:
            raise ConfigError(
                f"n_heads * head_dim = {self.n_heads * self.head_dim} must split into o_groups={self.o_groups}, "
                f"rope_head_dim={self.rope_head_dim} must be even"
            )

    @classmethod
    def from_dict(cls, raw: dict, name: str = "config") -> Block0Config:
        """The block-0 fields of a reference ``config.json`` (others ignored; absent ones keep the
        V4.1-Flash default). ``compress_ratios`` gives ``compress_ratio``."""
        if not isinstance(raw, dict):
            raise ConfigError(f"{name} must be a JSON object, got {type(raw).__name__}")
        known = {f.name for f in fields(cls)}
        kept = {k: v for k, v in raw.items() if k in known}
        if raw.get("compress_ratios"):
            kept["compress_ratio"] = int(raw["compress_ratios"][0])
        try:
            return cls(**kept)
        except TypeError as err:
            raise ConfigError(f"{name}: {err}") from None

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def mix_hc(self) -> int:
        """Rows of ``hc_*_fn``: hc pre weights + hc post weights + hc x hc comb."""
        return (2 + self.hc_mult) * self.hc_mult


V41_FLASH_BLOCK0 = Block0Config()


def _blocks(n: int, k: int) -> tuple[int, int]:
    return -(-n // FP8_BLOCK_SIZE), -(-k // FP8_BLOCK_SIZE)


def expert_names(e: int, prefix: str = PREFIX) -> dict[str, str]:
    """Checkpoint names of routed expert ``e``'s fp4 weights and scales, keyed ``w1``, ``w1.scale``, ..."""
    p = f"{prefix}ffn.experts.{e}."
    return {
        k: p + k + (".weight" if "." not in k else "") for k in ("w1", "w1.scale", "w2", "w2.scale", "w3", "w3.scale")
    }


def dense_tensors(cfg: Block0Config, prefix: str = PREFIX) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Every block-0 tensor but the routed experts: name -> (safetensors dtype, shape). Every block has
    these (``prefix`` ``layers.{n}.``); compressed-KV blocks add ``core.blocks_config.attention_extras``."""
    d, hc, p = cfg.dim, cfg.hc_mult, prefix
    hd = cfg.n_heads * cfg.head_dim
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for sub in ("attn", "ffn"):
        out[f"{p}hc_{sub}_fn"] = ("F32", (cfg.mix_hc, hc * d))
        out[f"{p}hc_{sub}_base"] = ("F32", (cfg.mix_hc,))
        out[f"{p}hc_{sub}_scale"] = ("F32", (3,))
        out[f"{p}{sub}_norm.weight"] = ("BF16", (d,))
    fp8 = {
        "attn.wq_a": (cfg.q_lora_rank, d),
        "attn.wq_b": (hd, cfg.q_lora_rank),
        "attn.wkv": (cfg.head_dim, d),
        "attn.wo_b": (d, cfg.o_groups * cfg.o_lora_rank),
        "ffn.shared_experts.w1": (cfg.moe_inter_dim, d),
        "ffn.shared_experts.w2": (d, cfg.moe_inter_dim),
        "ffn.shared_experts.w3": (cfg.moe_inter_dim, d),
    }
    for name, shape in fp8.items():
        out[f"{p}{name}.weight"] = ("F8_E4M3", shape)
        out[f"{p}{name}.scale"] = ("F8_E8M0", _blocks(*shape))
    out[f"{p}attn.attn_sink"] = ("F32", (cfg.n_heads,))
    out[f"{p}attn.q_norm.weight"] = ("BF16", (cfg.q_lora_rank,))
    out[f"{p}attn.kv_norm.weight"] = ("BF16", (cfg.head_dim,))
    out[f"{p}attn.wo_a.weight"] = ("BF16", (cfg.o_groups * cfg.o_lora_rank, hd // cfg.o_groups))
    out[f"{p}ffn.gate.weight"] = ("BF16", (cfg.n_routed_experts, d))
    out[f"{p}ffn.gate.bias"] = ("F32", (cfg.n_routed_experts,))
    out[f"{p}ffn.gate.bias_vl"] = ("F32", (cfg.n_routed_experts,))
    return out


def expert_tensors(cfg: Block0Config, e: int, prefix: str = PREFIX) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Routed expert ``e``'s tensors: fp4 weights (logical shape ``[out, in]``) and e8m0 scales ``[out, in / 32]``."""
    n = expert_names(e, prefix)
    shapes = {
        "w1": (cfg.moe_inter_dim, cfg.dim),
        "w2": (cfg.dim, cfg.moe_inter_dim),
        "w3": (cfg.moe_inter_dim, cfg.dim),
    }
    out = {}
    for w, (o, i) in shapes.items():
        out[n[w]] = ("F4", (o, i))
        out[n[w + ".scale"]] = ("F8_E8M0", (o, i // FP4_BLOCK))
    return out
