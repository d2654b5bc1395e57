"""A tiny Engram language model: the suite's embedded default, trained here on the CPU.

Architecture (documented again in ``data/tiny-engram/MODEL_CARD.md``)::

    raw ids [B, T] --(id remap: raw id -> row of the small vocabulary, unknown -> 0)--> E [V, dim]
    h = E[ids] repeated into hc_mult streams                                  [B, T, hc, dim]
    for block i in 0..n_layers-1:
        if i is an Engram layer:  h = Engram_i(h, hash_ids[:, :, k], token_mask)  (the suite's module)
        u = mean of the streams                                               [B, T, dim]
        d = Block_i(u) - u        (pre-norm causal self-attention with RoPE + GELU MLP)
        h = h + d  (the same update added to every stream)
    logits = rmsnorm(mean of the streams) @ E.T (tied)                        [B, T, V]

The Engram modules are :class:`engram_viz.core.engram.Engram` unchanged; during training their table
is a :class:`TrainableTable` (float32 rows, same ``row_ids -> rows`` interface as the fp8 tables);
the exported checkpoint stores it as fp8 e4m3 + e8m0 scales under the real checkpoint's names.

The vocabulary is restricted to the 4,095 commonest raw ids of the training split, so the token
embedding stays small (``tiny.embed.raw_ids`` lists them; row 0 is the unknown token).

On disk (``save_tiny_model`` / ``load_tiny_model``): ``config.json`` (the Engram config plus a
``tiny_lm`` section), an HF-style index and two shards - the Engram tensors under the real
checkpoint's names and dtypes, the LM's own bf16 tensors under ``tiny.``. Such a folder also opens
as a suite ``Checkpoint`` (``checkpoint.open_checkpoint``; its token embedding is
:func:`compact_token_embedding`), and ``data/tiny-engram`` is ``checkpoint.default_checkpoint()``.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from engram_viz.config import DATA_DIR, EngramConfig, load_config
from engram_viz.core.engram import Engram
from engram_viz.core.hashing import hash_prompt

DEFAULT_DIR = DATA_DIR / "tiny-engram"
UNK_INDEX = 0  # row 0 of the small vocabulary: every raw id outside it


@dataclass(frozen=True)
class TinyLMConfig:
    """The language-model part of the tiny model (the Engram part is an :class:`EngramConfig`)."""

    vocab_rows: int  # rows of the small embedding, including the unknown row 0
    attn_heads: int = 4
    mlp_mult: int = 4
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6
    use_engram: bool = True

    def to_dict(self) -> dict:
        return asdict(self)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(seq_len: int, head_dim: int, theta: float, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin ``[T, head_dim / 2]`` for rotary position embeddings."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    ang = torch.arange(seq_len, device=device, dtype=torch.float32)[:, None] * inv[None, :]
    return ang.cos(), ang.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x ``[B, H, T, hd]`` rotated pairwise (first half, second half)."""
    a, b = x.chunk(2, dim=-1)
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


class Block(nn.Module):
    """A standard pre-norm transformer block on one stream ``[B, T, dim]``."""

    def __init__(self, dim: int, lm: TinyLMConfig):
        super().__init__()
        self.n_heads = lm.attn_heads
        self.attn_norm = RMSNorm(dim, lm.rms_eps)
        self.wqkv = nn.Linear(dim, 3 * dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.mlp_norm = RMSNorm(dim, lm.rms_eps)
        self.w1 = nn.Linear(dim, lm.mlp_mult * dim, bias=False)
        self.w2 = nn.Linear(lm.mlp_mult * dim, dim, bias=False)

    def forward(self, u: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, d = u.shape
        q, k, v = self.wqkv(self.attn_norm(u)).view(b, t, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        u = u + self.wo(att.transpose(1, 2).reshape(b, t, d))
        return u + self.w2(F.gelu(self.w1(self.mlp_norm(u))))


class TrainableTable(nn.Module):
    """A float32 Engram table ``[rows, head_dim]`` for training; ``row_ids [...] -> rows [..., head_dim]``.

    Same callable interface as the suite's fp8 tables; exported with ``fp8.quantize_rows``.
    """

    def __init__(self, num_rows: int, head_dim: int, init_std: float = 0.02):
        super().__init__()
        self.num_rows, self.head_dim = num_rows, head_dim
        self.weight = nn.Parameter(torch.randn(num_rows, head_dim) * init_std)

    def forward(self, row_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(row_ids, self.weight)


class TinyEngramLM(nn.Module):
    """The tiny model. ``forward(input_ids [B, T] raw ids) -> logits [B, T, vocab_rows]`` over the
    small vocabulary; ``raw_ids[j]`` is the raw V4 token id of logit column j (column 0: unknown)."""

    def __init__(
        self,
        config: EngramConfig | str,
        token_map: np.ndarray,
        raw_ids: torch.Tensor,
        lm: TinyLMConfig,
        engrams: dict[int, Engram] | None = None,
    ):
        super().__init__()
        self.config = load_config(config)
        self.lm = lm
        if len(raw_ids) != lm.vocab_rows:
            raise ValueError(f"raw_ids has {len(raw_ids)} entries, expected vocab_rows={lm.vocab_rows}")
        self.token_map = np.asarray(token_map)
        raw_ids = torch.as_tensor(raw_ids, dtype=torch.int64)
        self.register_buffer("raw_ids", raw_ids, persistent=False)
        remap = torch.full((self.config.vocab_size,), UNK_INDEX, dtype=torch.int64)
        remap[raw_ids[1:]] = torch.arange(1, len(raw_ids))
        self.register_buffer("remap", remap, persistent=False)
        dim = self.config.dim
        self.embed = nn.Embedding(lm.vocab_rows, dim)
        nn.init.normal_(self.embed.weight, std=0.02)
        self.layers = nn.ModuleList(Block(dim, lm) for _ in range(self.config.n_layers))
        self.norm = RMSNorm(dim, lm.rms_eps)
        self.engrams = nn.ModuleDict()
        if lm.use_engram:
            for li, layer_id in enumerate(self.config.engram_layer_ids):
                engram = (engrams or {}).get(layer_id)
                if engram is None:  # fresh, trainable: float32 table and wkv
                    table = TrainableTable(self.config.engram_num_embeddings[li], self.config.engram_head_dim, 0.02)
                    engram = Engram(self.config, layer_id, table, mode="float32", device="cpu")
                self.engrams[str(layer_id)] = engram

    def index_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Raw ids -> rows of the small vocabulary (unknown -> 0), same shape."""
        return self.remap[input_ids]

    def hash_ids(self, input_ids: torch.Tensor, token_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Row ids ``[B, T, n_engram_layers, 24]`` of one full prefill (the suite's hasher)."""
        return hash_prompt(self.config, self.token_map, input_ids.cpu(), token_mask).to(input_ids.device)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_mask: torch.Tensor | None = None,
        hash_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """input_ids ``[B, T]`` raw V4 ids; token_mask ``[B, T]`` (False: image position, gate shut);
        hash_ids optional precomputed ``[B, T, n_engram_layers, 24]``. Returns float32 logits
        ``[B, T, vocab_rows]``."""
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must have shape [batch, seq_len], got {list(input_ids.shape)}")
        t = input_ids.shape[1]
        if len(self.engrams) and hash_ids is None:
            hash_ids = self.hash_ids(input_ids, token_mask)
        x = self.embed(self.index_ids(input_ids)).float()
        h = x.unsqueeze(2).repeat(1, 1, self.config.hc_mult, 1)
        head_dim = self.config.dim // self.lm.attn_heads
        cos, sin = rope_tables(t, head_dim, self.lm.rope_theta, x.device)
        for i, block in enumerate(self.layers):
            engram = self.engrams[str(i)] if str(i) in self.engrams else None  # noqa: SIM401 (ModuleDict has no .get)
            if engram is not None:
                li = self.config.engram_layer_ids.index(i)
                h = engram(h, hash_ids[:, :, li, :], token_mask).float()
            u = h.mean(dim=2)
            h = h + (block(u, cos, sin) - u).unsqueeze(2)
        return self.norm(h.mean(dim=2)) @ self.embed.weight.float().T

    def loss(self, input_ids: torch.Tensor, hash_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Mean next-token cross-entropy (nats) over ``input_ids [B, T+1]`` (targets in the small vocab)."""
        logits = self(input_ids[:, :-1], hash_ids=None if hash_ids is None else hash_ids[:, :-1])
        target = self.index_ids(input_ids[:, 1:])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def count_parameters(model: nn.Module) -> dict[str, int]:
    """Parameter counts by part: embedding, blocks, Engram tables, Engram projections."""
    out = {"embed": 0, "blocks": 0, "engram_table": 0, "engram_other": 0}
    for name, p in model.named_parameters():
        if name.startswith("embed."):
            out["embed"] += p.numel()
        elif name.startswith("engrams.") and ".table." in name:
            out["engram_table"] += p.numel()
        elif name.startswith("engrams."):
            out["engram_other"] += p.numel()
        else:
            out["blocks"] += p.numel()
    return out


def write_json(path: Path, obj: dict) -> None:
    """Atomic JSON write."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    tmp.replace(path)


@contextmanager
def gates_forced(model: TinyEngramLM, value: float = 0.0):
    """Within the block, every Engram gate of ``model`` is replaced by ``value`` through the
    ``engram.L{n}.gate`` hook points (0 shuts the memory)."""
    handles = [e.hook_gate.add_hook(lambda g, name: torch.full_like(g, value)) for e in model.engrams.values()]
    try:
        yield model
    finally:
        for h in handles:
            h.remove()


# ------------------------------------------------------------------------------ export and load

LM_SHARD = "model-00001-of-00002.safetensors"  # tiny LM: small embedding, blocks, final norm (bf16)
ENGRAM_SHARD = "model-00002-of-00002.safetensors"  # Engram tensors, real checkpoint names and dtypes
INDEX_FILE = "model.safetensors.index.json"


def export_tensors(model: TinyEngramLM) -> dict[str, dict[str, torch.Tensor]]:
    """Shard file name -> {tensor name: tensor}. Engram tensors use the real checkpoint's names and
    dtypes (``layers.N.engram.embed.weight`` e4m3 + ``.scale`` e8m0, ``wkv`` e4m3 + 32 x 32 e8m0
    block scales, bf16 ``q_weight``/``k_weight``); the LM's own tensors are bf16 under ``tiny.``."""
    from engram_viz.core import fp8

    lm = {"tiny.embed.weight": model.embed.weight, "tiny.norm.weight": model.norm.weight}
    lm.update({f"tiny.layers.{name}": p for name, p in model.layers.named_parameters()})
    lm = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in lm.items()}
    lm["tiny.embed.raw_ids"] = model.raw_ids.to(torch.int64).contiguous()
    eng: dict[str, torch.Tensor] = {}
    for key, e in model.engrams.items():
        p = f"layers.{key}.engram."
        table = e.table.weight if isinstance(e.table, TrainableTable) else None
        if table is None:
            raise TypeError(f"Engram layer {key} has no trainable float table to export")
        eng[p + "embed.weight"], eng[p + "embed.scale"] = fp8.quantize_rows(table.detach().float())
        eng[p + "wkv.weight"], eng[p + "wkv.scale"] = fp8.quantize_matrix(e.wkv.weight.detach().float())
        eng[p + "q_weight"] = e.q_weight.detach().to(torch.bfloat16)
        eng[p + "k_weight"] = e.k_weight.detach().to(torch.bfloat16)
    shards = {LM_SHARD: lm}
    if eng:
        shards[ENGRAM_SHARD] = {k: v.contiguous() for k, v in eng.items()}
    return shards


def save_tiny_model(model: TinyEngramLM, out: str | Path, extra_config: dict | None = None) -> list[Path]:
    """Write ``config.json`` (the Engram config + ``tiny_lm``), the index and the shards into ``out``
    (atomically, file by file). Returns the written paths."""
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    shards = export_tensors(model)
    cfg = {k: v for k, v in model.config.to_dict().items() if k != "name"}
    cfg["tiny_lm"] = model.lm.to_dict()
    cfg.update(extra_config or {})
    written = []
    weight_map, total = {}, 0
    for fname, tensors in shards.items():
        tmp = out / (fname + ".tmp")
        save_file(tensors, str(tmp), metadata={"format": "pt"})
        tmp.chmod(0o644)
        tmp.replace(out / fname)
        written.append(out / fname)
        for name, t in tensors.items():
            weight_map[name] = fname
            total += t.numel() * t.element_size()
    write_json(out / INDEX_FILE, {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))})
    write_json(out / "config.json", cfg)
    return [*written, out / INDEX_FILE, out / "config.json"]


def _read_folder(path: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    cfg_file, index_file = path / "config.json", path / INDEX_FILE
    for f in (cfg_file, index_file):
        if not f.is_file():
            raise FileNotFoundError(f"tiny model folder {path} lacks {f.name}")
    raw = json.loads(cfg_file.read_text())
    if "tiny_lm" not in raw:
        raise ValueError(f"{cfg_file} has no 'tiny_lm' section; it is not a tiny Engram LM folder")
    index = json.loads(index_file.read_text())
    tensors: dict[str, torch.Tensor] = {}
    for fname in sorted(set(index["weight_map"].values())):
        tensors.update(load_file(str(path / fname)))
    missing = sorted(set(index["weight_map"]) - set(tensors))
    if missing:
        raise ValueError(f"tiny model folder {path}: tensors {missing[:5]} listed in the index are missing")
    return raw, tensors


def load_tiny_model(
    path: str | Path | None = None, mode: str = "fp8", device: str | torch.device = "cpu"
) -> TinyEngramLM:
    """The exported tiny model (default: the committed ``data/tiny-engram``), in eval mode.

    The Engram layers are built with ``Engram.from_weights`` from the fp8 tensors (``mode`` is the
    wkv mode, ``fp8`` as the reference); the LM's bf16 tensors compute in float32."""
    from engram_viz.config import EngramConfig, match_preset
    from engram_viz.core.tokenizer import get_tokenizer

    path = Path(path) if path is not None else DEFAULT_DIR
    raw, tensors = _read_folder(path)
    config = match_preset(EngramConfig.from_dict(raw, name=path.name))
    lm = TinyLMConfig(**raw["tiny_lm"])
    engrams = {}
    if lm.use_engram:
        from engram_viz.weights.checkpoint import EngramWeights
        from engram_viz.weights.table import InMemoryTable

        for layer_id in config.engram_layer_ids:
            p = f"layers.{layer_id}.engram."
            w = EngramWeights(
                layer_id=layer_id,
                table=InMemoryTable(
                    tensors[p + "embed.weight"], tensors[p + "embed.scale"], label=f"table {p}embed of {path}"
                ),
                wkv_weight=tensors[p + "wkv.weight"],
                wkv_scale=tensors[p + "wkv.scale"],
                q_weight=tensors[p + "q_weight"],
                k_weight=tensors[p + "k_weight"],
            )
            engrams[layer_id] = Engram.from_weights(config, w, mode=mode, device=device)
    tok = get_tokenizer(config)
    model = TinyEngramLM(config, tok.token_map, tensors["tiny.embed.raw_ids"], lm, engrams=engrams)
    state = {"embed.weight": tensors["tiny.embed.weight"], "norm.weight": tensors["tiny.norm.weight"]}
    state.update({k[len("tiny.") :]: v for k, v in tensors.items() if k.startswith("tiny.layers.")})
    own = {k: v for k, v in model.state_dict().items() if not k.startswith("engrams.")}
    if set(own) != set(state):
        raise ValueError(
            f"tiny model folder {path}: LM tensors differ from the architecture: {sorted(set(own) ^ set(state))[:5]}"
        )
    model.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    return model.to(device).eval()


# ------------------------------------------------------------------------ as a suite Checkpoint

TRAINED_ON = "the King James Bible + Debian Reference (zh-CN)"


def is_tiny_lm_folder(path: str | Path | None) -> bool:
    """True when ``path`` is a folder whose ``config.json`` has a ``tiny_lm`` section."""
    if path is None:
        return False
    cfg = Path(path) / "config.json"
    try:
        return cfg.is_file() and "tiny_lm" in json.loads(cfg.read_text())
    except (OSError, ValueError):
        return False


def checkpoint_label(path: str | Path) -> str:
    """The label a tiny-LM folder carries into every output: ``label`` in its ``config.json`` if set,
    else e.g. ``tiny Engram LM trained on ... (engram-viz, data/tiny-engram)``."""
    path = Path(path).resolve()
    raw = json.loads((path / "config.json").read_text())
    if raw.get("label"):
        return str(raw["label"])
    try:
        where = str(path.relative_to(DEFAULT_DIR.parent.parent))
    except ValueError:
        where = str(path)
    seed = raw.get("training", {}).get("seed")
    extra = "" if seed in (None, 0) else f", seed {seed}"
    return f"tiny Engram LM trained on {TRAINED_ON} (engram-viz, {where}{extra})"


def compact_token_embedding(path: str | Path, label: str):
    """The tiny LM's token embedding as a suite ``table.TokenEmbedding`` over all raw ids
    (``[vocab_size, dim]`` bf16): ids outside its small vocabulary read the unknown row 0."""
    from safetensors import safe_open

    from engram_viz.weights.table import RowSource, TokenEmbedding

    path = Path(path)
    with safe_open(str(path / LM_SHARD), framework="pt") as f:
        weight, raw_ids = f.get_tensor("tiny.embed.weight"), f.get_tensor("tiny.embed.raw_ids")
    vocab = load_config(path).vocab_size
    remap = np.zeros(vocab, dtype=np.int64)
    remap[raw_ids[1:].numpy()] = np.arange(1, len(raw_ids))

    class _Compact(RowSource):
        def __init__(self):
            self.num_rows, self.cols, self.dtype, self.label = vocab, weight.shape[1], weight.dtype, label

        def read_unique(self, ids: np.ndarray) -> torch.Tensor:
            return weight[torch.from_numpy(remap[ids])]

    return TokenEmbedding(_Compact(), label=f"token embedding of the {label} (unknown ids -> row 0)")
