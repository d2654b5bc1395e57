"""The Engram module: table rows -> ``wkv`` -> one key per stream + a shared value -> per-stream gates.

The math is the reference's ``Engram.forward`` (reference section 5), in float32, top to bottom::

    rows  = table(hash_ids)                                  bf16 [B, T, 24, head_dim]
    kv    = wkv(rows.flatten(-2))                            bf16 [B, T, (hc + 1) * dim]
    key   = kv[..., :hc * dim] as [B, T, hc, dim]            float32
    value = kv[..., hc * dim:]                               float32 [B, T, dim]
    rstd  = rsqrt(mean(h^2) + eps) * rsqrt(mean(key^2) + eps)          per (token, stream), over dim
    dot   = sum(h * q_weight * k_weight * key) * rstd / sqrt(dim)      [B, T, hc]
    gate  = sigmoid(copysign(sqrt(max(|dot|, 1e-6)), dot)), 0 where token_mask is False
    out   = (h + gate * value).to(x.dtype)                              [B, T, hc, dim]

with ``h = x.float()`` and ``eps = config.norm_eps`` (1e-20 for V4.1-Flash) used as is.

``wkv`` (``core/wkv.py``) runs in one of three modes (:data:`WKV_MODES`: ``fp8``, the reference
path; ``bf16``; ``float32`` for training), its GEMM on exact bf16 operands with float32
accumulation where the device has bf16 kernels, else in float32 (``gemm``: ``auto``, ``bf16``,
``float32``); the two differ only in float32 summation order.

Devices: the module computes on ``device`` (default: CUDA when available, else CPU). Tables stay
where they are: a host table is gathered on the CPU and only the gathered rows move to the device
(through pinned memory, non-blocking: :func:`to_device`);
a table that is itself a trainable ``nn.Module`` is registered as a submodule and gathered on its
own device. ``forward`` returns its output on the device of ``x``.

Hook points (identity unless a hook is attached; see :mod:`engram_viz.core.hooks`), named
``engram.L{layer_id}.{site}`` for the sites of :data:`engram_viz.core.hooks.SITES` (shapes, dtypes
and meanings there; the README's hook table is made from it). :func:`engram_steps` is the forward
itself, with one hook call after each step; :class:`Engram` and ``run.attach`` (the same hooks on a
reference-structured module) both run it, so the formula lives once.

A hook that returns a tensor replaces the intermediate for the rest of the forward (e.g. force
``gate`` to 0 to ablate the memory).

CPU vs CUDA, and bf16 vs float32 GEMM operands (stated tolerance, checked by
``benchmarks/gpu_check.py``, ``benchmarks/wkv_forward.py`` and tests): the GEMM sums in a different order on each device and path, so a few bf16-rounded ``key``/``value``
elements (about 5 in 100,000 at v41-flash size) land one bf16 ulp apart; the rest differs only by
float32 rounding (reductions over dim, rsqrt, sigmoid). Hence ``key``/``value`` agree within one bf16 ulp, ``dot`` within
:data:`CPU_CUDA_DOT_ATOL` (1e-3; ~1.5e-4 seen), gates within :data:`CPU_CUDA_GATE_ATOL` (5e-3) at
worst and within :data:`CPU_CUDA_GATE_P99` (1e-4) for 99% of them (~6e-6 seen). The worst case is
loose because the signed square root is steep at ``dot = 0``: ``|dgate| <= 0.5 * sqrt(|ddot| / 2)``
when ``dot`` changes sign. ("seen": the float32 path against float64 accumulation, 768 tokens at
v41-flash size on synthetic weights, standing in for a second summation order.)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from engram_viz.config import EngramConfig, load_config
from engram_viz.core import fp8
from engram_viz.core.devices import resolve_device
from engram_viz.core.hooks import HOOK_SITES, HookPoint, hook_name, hook_points
from engram_viz.core.schema import SAFETENSORS_DTYPES, expected_tensors
from engram_viz.core.wkv import GEMMS, WKV_MODES, WkvLinear  # noqa: F401 - GEMMS, WKV_MODES re-exported
from engram_viz.errors import InputError, InputTypeError

CLAMP_VALUE = 1e-6  # |dot| floor before the signed square root (reference ``clamp_value``)
CPU_CUDA_GATE_ATOL = 5e-3  # stated CPU vs CUDA gate tolerance: max abs difference
CPU_CUDA_GATE_P99 = 1e-4  # ... and the 99th percentile of the abs differences
CPU_CUDA_DOT_ATOL = 1e-3  # stated CPU vs CUDA tolerance of dot (max abs difference)


def tensor_shapes(config: EngramConfig | str, layer_id: int) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Checkpoint name (without the ``layers.N.engram.`` prefix) -> (shape, dtype) for one Engram layer."""
    config = load_config(config)
    if layer_id not in config.engram_layer_ids:
        raise InputError(f"layer {layer_id} is not an Engram layer; expected one of {list(config.engram_layer_ids)}")
    prefix = f"layers.{layer_id}.engram."
    return {
        name.removeprefix(prefix): (shape, getattr(torch, SAFETENSORS_DTYPES[dtype][0]))
        for name, (dtype, shape) in expected_tensors(config).items()
        if name.startswith(prefix)
    }


def param_counts(config: EngramConfig | str) -> dict[int, dict[str, int]]:
    """Parameters per Engram layer from the tensor shapes: ``table``, ``wkv``, ``gate_weights``
    (q and k), ``total``; plus the fp8 scales, which are not counted as parameters."""
    config = load_config(config)
    out: dict[int, dict[str, int]] = {}
    for layer_id in config.engram_layer_ids:
        n = {name: math.prod(shape) for name, (shape, _) in tensor_shapes(config, layer_id).items()}
        counts = {"table": n["embed.weight"], "wkv": n["wkv.weight"], "gate_weights": n["q_weight"] + n["k_weight"]}
        counts["total"] = sum(counts.values())
        counts["scales_not_counted"] = n["embed.scale"] + n["wkv.scale"]
        out[layer_id] = counts
    return out


def _no_hook(site: str, t: torch.Tensor) -> torch.Tensor:
    return t


def engram_dot(hwk: torch.Tensor, h_sq: torch.Tensor, key_sq: torch.Tensor, eps: float, dim: int) -> torch.Tensor:
    """``dot [..., hc]`` from its three reductions over dim: ``hwk = sum(h * q_weight * k_weight * key)``,
    ``h_sq = mean(h^2)``, ``key_sq = mean(key^2)`` (h and the key normalised per (token, stream))."""
    rstd = torch.rsqrt(h_sq + eps) * torch.rsqrt(key_sq + eps)
    return hwk * rstd * dim**-0.5


def engram_gate(dot: torch.Tensor, clamp: float = CLAMP_VALUE) -> torch.Tensor:
    """The gate from ``dot``: the signed square root before the sigmoid (token mask not applied)."""
    return torch.sigmoid(torch.copysign(dot.abs().clamp_min(clamp).sqrt(), dot))


def engram_steps(
    x: torch.Tensor,
    hash_ids: torch.Tensor,
    token_mask: torch.Tensor,
    *,
    gather: Callable[[torch.Tensor], torch.Tensor],
    wkv: Callable[[torch.Tensor], torch.Tensor],
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    clamp: float = CLAMP_VALUE,
    hook: Callable[[str, torch.Tensor], torch.Tensor] = _no_hook,
) -> torch.Tensor:
    """The reference ``Engram.forward`` (the formula block of this module's docstring), with
    ``hook(site, tensor) -> tensor`` called after each step for the sites of ``core.hooks.SITES``.

    x ``[B, T, hc, dim]``, hash_ids ``[B, T, 24]``, token_mask ``[B, T]`` bool (all on one device);
    ``gather(hash_ids) -> rows [B, T, 24, head_dim]``; ``wkv(rows.flatten(-2)) -> [B, T, (hc + 1) * dim]``;
    q_weight, k_weight ``[hc, dim]``. Returns ``[B, T, hc, dim]`` in x.dtype. No checks: callers check.
    """
    hc, dim = q_weight.shape
    x = hook("streams", x)
    h = x.float()
    token_mask = hook("token_mask", token_mask)
    hash_ids = hook("hash_ids", hash_ids)
    rows = hook("rows", gather(hash_ids))
    kv = wkv(rows.flatten(-2))
    key, value = kv.split([hc * dim, dim], dim=-1)
    key = hook("key", key.float().unflatten(-1, (hc, dim)))
    value = hook("value", value.float())
    weight = q_weight.float() * k_weight.float()  # only ever used as a product
    # normalised per (token, stream) over dim, not jointly over the streams
    dot = hook("dot", engram_dot((h * weight * key).sum(-1), h.square().mean(-1), key.square().mean(-1), eps, dim))
    gate = hook("gate", engram_gate(dot, clamp).masked_fill(~token_mask.unsqueeze(-1), 0))
    return hook("out", (h + gate.unsqueeze(-1) * value.unsqueeze(-2)).to(x.dtype))


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on ``device``. Host rows bound for CUDA go through pinned memory (torch's caching host
    allocator: reused across calls, never overwritten before its copy is done) with a non-blocking
    copy, so the transfer runs at full PCIe/NVLink rate and the host returns at once."""
    if device.type != "cuda" or t.device.type != "cpu":
        return t.to(device)
    staging = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    staging.copy_(t)
    return staging.to(device, non_blocking=True)


def _table_device(table: Any) -> torch.device:
    if isinstance(table, nn.Module):
        for t in (*table.parameters(), *table.buffers()):
            return t.device
    dev = getattr(table, "device", None)
    return torch.device(dev) if dev is not None else torch.device("cpu")


def _table_rows(table: Any) -> int | None:
    for attr in ("num_rows", "num_embeddings"):
        n = getattr(table, attr, None)
        if isinstance(n, int):
            return n
    return None


class Engram(nn.Module):
    """One Engram layer. ``forward(x [B, T, hc, dim], hash_ids [B, T, 24], token_mask [B, T] | None)
    -> [B, T, hc, dim]`` in ``x.dtype``, on ``x``'s device.

    ``table`` is any callable ``row_ids LongTensor [...] -> rows [..., head_dim]`` (an fp8
    ``EngramTable``, or a trainable ``nn.Module``). ``wkv_weight`` is the dequantised float matrix
    ``[(hc + 1) * dim, 24 * head_dim]``; ``q_weight``/``k_weight`` are ``[hc, dim]``. Left out,
    ``wkv_weight`` is drawn from N(0, 1/K) (with ``generator``) and ``q_weight``/``k_weight`` are
    ones, as the reference initialises them. ``trainable`` sets ``requires_grad`` on wkv/q/k.
    """

    # one HookPoint per site of HOOK_SITES, set in __init__ (declared here for the type checker)
    hook_streams: HookPoint
    hook_token_mask: HookPoint
    hook_hash_ids: HookPoint
    hook_rows: HookPoint
    hook_key: HookPoint
    hook_value: HookPoint
    hook_dot: HookPoint
    hook_gate: HookPoint
    hook_out: HookPoint

    def __init__(
        self,
        config: EngramConfig | str,
        layer_id: int,
        table: Callable[[torch.Tensor], torch.Tensor],
        wkv_weight: torch.Tensor | None = None,
        q_weight: torch.Tensor | None = None,
        k_weight: torch.Tensor | None = None,
        *,
        mode: str = "fp8",
        gemm: str = "auto",
        device: str | torch.device | None = None,
        trainable: bool = True,
        generator: torch.Generator | None = None,
    ):
        super().__init__()
        config = load_config(config)
        if layer_id not in config.engram_layer_ids:
            raise InputError(
                f"layer {layer_id} is not an Engram layer; expected one of {list(config.engram_layer_ids)}"
            )
        if not callable(table):
            raise InputTypeError(f"table must be callable row_ids -> rows, got {type(table).__name__}")
        self.config = config
        self.layer_id = layer_id
        self.layer_hash_index = config.engram_layer_ids.index(layer_id)
        self.dim, self.hc_mult, self.head_dim = config.dim, config.hc_mult, config.engram_head_dim
        self.n_hash_cols = config.n_hash_cols
        self.eps = config.norm_eps
        self.clamp_value = CLAMP_VALUE
        device = resolve_device(device)

        n, k = self.dim * (self.hc_mult + 1), self.n_hash_cols * self.head_dim
        if wkv_weight is None:
            std: float = k**-0.5  # N(0, 1/K); annotated because int ** float is typed Any
            wkv_weight = torch.randn(n, k, generator=generator) * std
        if q_weight is None:
            q_weight = torch.ones(self.hc_mult, self.dim)
        if k_weight is None:
            k_weight = torch.ones(self.hc_mult, self.dim)
        for name, t, shape in (
            ("wkv_weight", wkv_weight, (n, k)),
            ("q_weight", q_weight, (self.hc_mult, self.dim)),
            ("k_weight", k_weight, (self.hc_mult, self.dim)),
        ):
            if tuple(t.shape) != shape:
                raise InputError(f"{name} has shape {list(t.shape)}; config {config.name!r} expects {list(shape)}")

        # A trainable table module trains with the layer (registered, moves with .to()); any other
        # table is held outside the module tree, so .to(device) never copies a table to the GPU.
        if isinstance(table, nn.Module) and any(p.requires_grad for p in table.parameters()):
            self.table = table
        else:
            object.__setattr__(self, "table", table)
        self.wkv = WkvLinear(wkv_weight.to(device), mode=mode, trainable=trainable, gemm=gemm)
        self.q_weight = nn.Parameter(q_weight.detach().to(device), requires_grad=trainable)
        self.k_weight = nn.Parameter(k_weight.detach().to(device), requires_grad=trainable)
        if isinstance(table, nn.Module) and "table" in self._modules:
            table.to(device)

        for site in HOOK_SITES:  # self.hook_streams ... self.hook_out
            setattr(self, f"hook_{site}", HookPoint(hook_name(layer_id, site)))

    @classmethod
    def from_weights(
        cls,
        config: EngramConfig | str,
        weights: Any,
        mode: str = "fp8",
        device: str | torch.device | None = None,
        gemm: str = "auto",
    ) -> Engram:
        """Build from checkpoint weights (``checkpoint.EngramWeights``: ``layer_id``, ``table``,
        ``wkv_weight`` e4m3 ``[N, K]``, ``wkv_scale`` e8m0 ``[ceil(N/32), ceil(K/32)]`` or None for a float
        ``wkv_weight``, ``q_weight``,
        ``k_weight`` bf16 ``[hc, dim]``). The wkv weight is dequantised once, on the target device;
        the table stays on the host. Parameters are frozen (inference)."""
        config = load_config(config)
        device = resolve_device(device)
        layer_id = weights.layer_id
        shapes = tensor_shapes(config, layer_id)
        (n, k), _ = shapes["wkv.weight"]
        if tuple(weights.wkv_weight.shape) != (n, k):
            raise InputError(
                f"layers.{layer_id}.engram.wkv.weight has shape {list(weights.wkv_weight.shape)}; expected {[n, k]}"
            )
        table = weights.table
        head_dim = getattr(table, "head_dim", None)
        if head_dim is not None and head_dim != config.engram_head_dim:
            raise InputError(
                f"table of layer {layer_id} has head_dim {head_dim}; config {config.name!r} expects {config.engram_head_dim}"
            )
        rows, want_rows = _table_rows(table), shapes["embed.weight"][0][0]
        if rows is not None and rows != want_rows:
            raise InputError(
                f"table of layer {layer_id} has {rows:,} rows; config {config.name!r} expects {want_rows:,}"
            )
        if weights.wkv_scale is None:  # already a float matrix (a GGUF file's wkv, dequantised when read)
            wkv = weights.wkv_weight.to(device).float()
        else:
            wkv = fp8.dequantize_blocks(weights.wkv_weight.to(device), weights.wkv_scale.to(device))
        return cls(
            config,
            layer_id,
            table,
            wkv,
            weights.q_weight,
            weights.k_weight,
            mode=mode,
            gemm=gemm,
            device=device,
            trainable=False,
        )

    # -- properties ---------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.wkv.weight.device

    @property
    def mode(self) -> str:
        return self.wkv.mode

    @mode.setter
    def mode(self, mode: str) -> None:
        self.wkv.mode = mode

    @property
    def gemm(self) -> str:
        """The wkv GEMM's operands (``auto``, ``bf16``, ``float32``; see ``WkvLinear``)."""
        return self.wkv.gemm

    @gemm.setter
    def gemm(self, gemm: str) -> None:
        self.wkv.gemm = gemm

    @property
    def embed(self) -> Any:
        """The table under the reference's attribute name."""
        return self.table

    def hook_points(self) -> dict[str, HookPoint]:
        """``{'engram.L{n}.gate': HookPoint, ...}`` for the sites in :data:`HOOK_SITES`."""
        return hook_points(self)

    # -- forward ------------------------------------------------------------------------------------
    def gather(self, hash_ids: torch.Tensor) -> torch.Tensor:
        """Rows of ``hash_ids [...]`` gathered where the table lives, moved to ``device``: ``[..., head_dim]``."""
        rows = self.table(hash_ids.to(_table_device(self.table)))
        if rows.shape != (*hash_ids.shape, self.head_dim):
            raise InputError(
                f"table returned rows of shape {list(rows.shape)}; expected {[*hash_ids.shape, self.head_dim]}"
            )
        return to_device(rows, self.device)

    def forward(self, x: torch.Tensor, hash_ids: torch.Tensor, token_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x ``[B, T, hc, dim]``; hash_ids ``[B, T, 24]`` int; token_mask ``[B, T]`` bool (False: the gate
        is shut and the position passes through unchanged). Returns ``[B, T, hc, dim]`` in x.dtype."""
        self._check_inputs(x, hash_ids, token_mask)
        if token_mask is None:
            token_mask = torch.ones(x.shape[:2], dtype=torch.bool)
        out = engram_steps(
            x.to(self.device),
            hash_ids,
            token_mask.to(self.device),
            gather=self.gather,
            wkv=self.wkv,
            q_weight=self.q_weight,
            k_weight=self.k_weight,
            eps=self.eps,
            clamp=self.clamp_value,
            hook=self._run_hook,
        )
        return out.to(x.device)

    def _run_hook(self, site: str, t: torch.Tensor) -> torch.Tensor:
        return getattr(self, f"hook_{site}")(t)

    def _check_inputs(self, x: torch.Tensor, hash_ids: torch.Tensor, token_mask: torch.Tensor | None) -> None:
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise InputTypeError(
                f"x must be a floating tensor [B, T, {self.hc_mult}, {self.dim}], got {getattr(x, 'dtype', type(x))}"
            )
        if x.dim() != 4 or tuple(x.shape[2:]) != (self.hc_mult, self.dim):
            raise InputError(
                f"x must have shape [B, T, {self.hc_mult}, {self.dim}] (hc_mult streams of dim), got {list(x.shape)}"
            )
        bt = tuple(x.shape[:2])
        if not isinstance(hash_ids, torch.Tensor) or hash_ids.dtype not in (torch.int64, torch.int32):
            raise InputTypeError(
                f"hash_ids must be an int64 tensor [B, T, {self.n_hash_cols}], got {getattr(hash_ids, 'dtype', type(hash_ids))}"
            )
        if tuple(hash_ids.shape) != (*bt, self.n_hash_cols):
            raise InputError(
                f"hash_ids must have shape {[*bt, self.n_hash_cols]} (x's [B, T] and {self.n_hash_cols} row ids of "
                f"layer {self.layer_id}), got {list(hash_ids.shape)}"
            )
        n_rows = _table_rows(self.table)
        if hash_ids.numel() and n_rows is not None:
            lo, hi = int(hash_ids.min()), int(hash_ids.max())
            if lo < 0 or hi >= n_rows:
                raise InputError(
                    f"hash_ids holds row {lo if lo < 0 else hi}; the layer {self.layer_id} table has rows 0..{n_rows - 1}"
                )
        if token_mask is not None:
            if not isinstance(token_mask, torch.Tensor) or token_mask.dtype != torch.bool:
                raise InputTypeError(
                    f"token_mask must be a bool tensor [B, T], got {getattr(token_mask, 'dtype', type(token_mask))}"
                )
            if tuple(token_mask.shape) != bt:
                raise InputError(f"token_mask must have shape {list(bt)} (x's [B, T]), got {list(token_mask.shape)}")

    def extra_repr(self) -> str:
        label = getattr(self.table, "label", type(self.table).__name__)
        return f"layer_id={self.layer_id}, hc_mult={self.hc_mult}, dim={self.dim}, table={label!r}"
