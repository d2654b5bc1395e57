"""The runner: prompts -> tokenizer -> hasher -> Engram layers (on some residual streams) -> Trace.

``Pipeline(checkpoint, streams=..., device=..., mode=...)`` puts the pieces together:

- **weights**: ``checkpoint`` is ``None`` (``weights.resolve``: ``$ENGRAM_VIZ_CHECKPOINT`` when set,
  else the embedded default), a folder path or an opened
  :class:`engram_viz.weights.checkpoint.Checkpoint`; ``Pipeline.from_checkpoint(path)`` and
  ``Pipeline.synthetic(config, seed)`` name the two other sources. A folder holding the *tiny Engram LM*
  (``config.json`` with a ``tiny_lm`` section, see ``engram_viz.tiny``) runs as a whole model (its own
  streams) unless other streams are asked for.
- **streams** (what each Engram layer reads as ``x``; its label goes into every Trace):
  ``"auto"`` (the model's own streams when the weights are a whole model, else embedding
  streams), ``"model"`` (on a checkpoint folder holding every block before the last Engram layer it runs
  them: ``block_streams.BlockStreams``, true streams for every Engram layer, chained with the Engram
  layers, whose ``wkv`` then multiplies on the blocks' float32 GEMM operands), ``"embedding"`` (``streams.embedding_streams``: the token embedding
  repeated into hc streams, a proxy for later layers), ``"block0"`` (``streams.Block0Streams``: the
  checkpoint's own embed + block 0, the model's own streams for layer 1; later layers get the same
  streams and their label says they need captured or attached ones), a captured-streams safetensors path
  (``streams.load_captured_streams``; the prompts are the file's ``input_ids``), or a callable
  ``fn(input_ids [B, T], token_types [B, T], layer) -> x [B, T, hc, dim]``. In the Engram-only
  modes every layer reads its own copy of the streams (layers are not chained). The argument is read
  once (``stream_sources.choose_stream_source``) into ``pipe.streams_source``, which the runs only call;
  ``pipe.streams_mode`` is its name.
- **device**: ``None`` picks CUDA when available, else the CPU; tables stay on the host.

``run(prompts, names=...) -> Trace``: prompts are strings, ``{"id", "category", "text"}`` dicts or
objects with those attributes; ``<image:WxH>`` / ``<image:WxHpx>`` placeholders expand into image
spans with no image features (``images.build_input``), real pictures (``<image:path>``, or bare
``<image>`` filled from a prompt's ``"images"``: paths, PNG/JPEG bytes or Pillow images) into spans the
``block0`` and ``model`` streams fill with the vision tower's features when the checkpoint has one; the Trace's
``meta["image_spans"]`` says what fills each span. Prompts run in batches of ``batch_size`` (right-padded; the hash
and the gates of a position depend only on it and earlier positions, so padding changes
nothing). Row ids, token mask and gates are always captured; ``names`` adds hook names or globs.
Each batch's capture goes to the CPU and the next batch starts clean, so memory does not grow
with the number of batches beyond what the Trace keeps. The collision exposure of each position
is an analysis of the Trace (``engram_viz.analysis.row_stats.trace_ngrams.collision_exposure``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from engram_viz._progress import progress_bar
from engram_viz.config import TEXT, EngramConfig
from engram_viz.core.devices import resolve_device
from engram_viz.core.engram import Engram
from engram_viz.core.hashing import HashConstants, TokenInputError, check_id_values, check_token_types, id_sequence
from engram_viz.core.image_merge import ImageInput
from engram_viz.core.tokenizer import get_tokenizer
from engram_viz.errors import CheckpointError, InputError, PromptTypeError
from engram_viz.run.capture import DEFAULT_NAMES, ActivationCache, HookFn, HookRegistry
from engram_viz.run.images import ImagePromptError, ImageSpan, ImageTextInput, build_input
from engram_viz.run.prompt_text import PromptInputError, check_prompt_text
from engram_viz.run.prompts import Prompt, build_prompt
from engram_viz.run.stream_sources import ModelStreams, StreamsFn, choose_stream_source, runs_model_whole
from engram_viz.run.streams import BatchImages, StreamSource
from engram_viz.run.trace import Trace, trace_from_cache
from engram_viz.tiny.files import load_tiny_model
from engram_viz.tiny.gguf_model import is_tiny_lm_gguf, load_tiny_gguf, tiny_gguf_label
from engram_viz.tiny.model import TinyEngramLM
from engram_viz.weights.checkpoint import Checkpoint
from engram_viz.weights.gguf_file import is_gguf_path
from engram_viz.weights.resolve import open_weights, resolve_weights
from engram_viz.weights.synthetic import synthetic_checkpoint
from engram_viz.weights.tiny_folder import checkpoint_label, is_tiny_lm_folder


@dataclass(frozen=True)
class PromptInput:
    """One prompt, built: raw ids and token types ``[T]`` (numpy int64)."""

    id: str
    category: str
    text: str
    input_ids: np.ndarray
    token_types: np.ndarray
    spans: tuple[ImageSpan, ...] = ()  # image spans; those with a picture get image features where the streams can

    def pictures(self) -> list[ImageInput]:
        """The reference's ``ImageInput`` of each span that holds a real picture."""
        return [
            ImageInput(
                s.start,
                torch.from_numpy(self.token_types[s.start : s.stop]),
                s.picture.patches,
                s.picture.plan.vit_h,
                s.picture.plan.vit_w,
            )
            for s in self.spans
            if s.picture is not None
        ]


def _get(p: Any, key: str, default: Any = None) -> Any:
    if isinstance(p, Mapping):
        return p.get(key, default)
    return getattr(p, key, default)


def _prompt_fields(p: Any, i: int) -> tuple[str, str, str | None, Any, Any]:
    """``(id, category, text, input_ids, token_types)`` of a string, dict or object prompt."""
    if isinstance(p, str):
        return f"p{i}", "", p, None, None
    if not isinstance(p, Mapping) and not hasattr(p, "text") and not hasattr(p, "input_ids"):
        raise PromptTypeError(f"prompt #{i} is a {type(p).__name__}; expected a string, a dict or an object with .text")
    text, ids = _get(p, "text"), _get(p, "input_ids")
    if text is None and ids is None:
        raise PromptInputError(f"prompt #{i} ({_get(p, 'id', '?')!r}) has neither 'text' nor 'input_ids'")
    return str(_get(p, "id", f"p{i}")), str(_get(p, "category", "") or ""), text, ids, _get(p, "token_types")


def _span_record(span: ImageSpan) -> dict[str, Any]:
    """One image span as the Trace meta lists it: positions, grid and what fills it."""
    return {"start": span.start, "stop": span.stop, "grid": [span.width, span.height], "fill": span.kind}


class Pipeline:
    """Tokenizer + hasher + Engram layers + a stream source; see the module docstring."""

    def __init__(
        self,
        checkpoint: Any = None,
        *,
        streams: str | Path | StreamsFn = "auto",
        device: str | torch.device | None = None,
        mode: str = "fp8",
        batch_size: int = 8,
        bos: bool = True,
    ):
        self.device = resolve_device(device)  # None or "auto": CUDA when available; else DeviceError if unusable
        self.mode = mode
        if batch_size < 1:
            raise InputError(f"batch_size must be at least 1, got {batch_size}")
        self.batch_size = batch_size
        self.bos = bos
        self.lm: TinyEngramLM | None = None
        self.checkpoint = None
        # None: $ENGRAM_VIZ_CHECKPOINT, else the embedded default; a Hub repository: its local folder
        checkpoint = resolve_weights(checkpoint, streams=streams)
        whole_model = runs_model_whole(streams)
        if isinstance(checkpoint, (str, Path)):
            path = Path(checkpoint)
            if not path.exists():
                raise FileNotFoundError(f"checkpoint {path} does not exist; expected a checkpoint folder")
            folder = path if path.is_dir() else path.parent
            if is_tiny_lm_gguf(path) and whole_model:  # a GGUF file of the tiny LM runs whole too
                self._load_tiny_lm(path)
            elif is_tiny_lm_folder(folder) and whole_model and not is_gguf_path(path):
                self._load_tiny_lm(folder)
            else:
                checkpoint = open_weights(path)
        if self.lm is None:
            folder = getattr(checkpoint, "path", None)
            # a tiny LM runs whole: its own streams
            if folder is not None and (is_tiny_lm_folder(folder) or is_tiny_lm_gguf(folder)) and whole_model:
                self._load_tiny_lm(Path(folder))
            else:  # Engram layers only (a tiny LM too, when other streams are asked for)
                self._load_checkpoint(checkpoint)
        # the layout, token map and hash arrays, derived and checked once: every run hashes with them
        self.hash_constants = HashConstants.build(self.config, self.tokenizer.token_map)
        self._setup_streams(streams)

    @classmethod
    def from_checkpoint(cls, path: str | Path | Checkpoint, **kwargs: Any) -> Pipeline:
        """A Pipeline on the checkpoint folder ``path`` (or an opened Checkpoint), whatever
        ``$ENGRAM_VIZ_CHECKPOINT`` says; ``kwargs`` as for ``Pipeline``."""
        if path is None:
            raise CheckpointError(
                "Pipeline.from_checkpoint: expected a checkpoint folder or an opened Checkpoint, got None "
                "(Pipeline() runs on the default weights)"
            )
        return cls(path, **kwargs)

    @classmethod
    def synthetic(cls, config: EngramConfig | str = "tiny", seed: int = 0, **kwargs: Any) -> Pipeline:
        """A Pipeline on seeded synthetic weights of ``config`` (labelled SYNTHETIC; embedding
        streams unless ``streams`` says otherwise); ``kwargs`` as for ``Pipeline``."""
        return cls(synthetic_checkpoint(config, seed), **kwargs)

    # -- set-up -----------------------------------------------------------------------------------

    def _load_tiny_lm(self, folder: Path) -> None:
        """The tiny LM from its folder, or from a GGUF file the suite wrote of it."""
        gguf = is_gguf_path(folder)
        load = load_tiny_gguf if gguf else load_tiny_model
        self.lm = load(folder, mode=self.mode, device=self.device)
        self.config: EngramConfig = self.lm.config
        self.tokenizer = get_tokenizer(self.config)
        # cast: the LM's ModuleDict holds its Engram layers, typed as plain Modules
        self.engrams: dict[int, Engram] = {int(k): cast(Engram, e) for k, e in self.lm.engrams.items()}
        self.model_label = tiny_gguf_label(folder) if gguf else checkpoint_label(folder)
        self.registry = HookRegistry.from_module(self.lm)

    def _load_checkpoint(self, checkpoint: Any) -> None:
        self.checkpoint = checkpoint
        self.config = checkpoint.config
        self.tokenizer = get_tokenizer(self.config, checkpoint.tokenizer_path)
        self.engrams = {
            n: Engram.from_weights(self.config, checkpoint.layer(n), mode=self.mode, device=self.device)
            for n in self.config.engram_layer_ids
        }
        self.model_label = checkpoint.label
        self.registry = HookRegistry()
        for e in self.engrams.values():
            self.registry.update(HookRegistry(e.hook_points()))

    def _setup_streams(self, streams: str | Path | StreamsFn) -> None:
        self.streams_source: StreamSource = choose_stream_source(
            streams,
            self.config,
            lm=self.lm,
            checkpoint=self.checkpoint,
            model_label=self.model_label,
            mode=self.mode,
            device=self.device.type,
        )
        self.streams_label = self.streams_source.label  # the last run's label (a run may add clauses)
        gemm = getattr(self.streams_source, "engram_gemm", None)  # blocks chained with the Engram layers
        if gemm is not None:  # ... fix their wkv GEMM: one arithmetic for the pass (run.block_streams)
            for e in self.engrams.values():
                e.gemm = gemm

    @property
    def streams_mode(self) -> str:
        """The stream source's name (``"model"``, ``"embedding"``, ``"block0"``, ``"captured"``, ``"callable"``)."""
        return self.streams_source.name

    @property
    def layer_ids(self) -> tuple[int, ...]:
        return tuple(self.config.engram_layer_ids)

    def __repr__(self) -> str:
        return (
            f"Pipeline(config={self.config.name!r}, model={self.model_label!r}, streams={self.streams_mode!r}, "
            f"device={self.device}, mode={self.mode!r})"
        )

    # -- prompts ----------------------------------------------------------------------------------

    def build(self, prompts: str | Any | Sequence[Any]) -> list[PromptInput]:
        """Tokenize prompts (image placeholders expanded) into :class:`PromptInput`."""
        if isinstance(prompts, (str, Mapping)) or hasattr(prompts, "text") or hasattr(prompts, "input_ids"):
            prompts = [prompts]
        out = []
        for i, p in enumerate(prompts):
            if _get(p, "text") is None and _get(p, "input_ids") is None and _get(p, "seed") is not None:
                p = Prompt(
                    str(_get(p, "id", f"p{i}")),
                    str(_get(p, "category", "random_token")),
                    None,
                    int(_get(p, "seed")),
                    int(_get(p, "length")),
                )
            if hasattr(p, "random_ids") and getattr(p, "is_random", False):  # a random-token control
                built = build_prompt(p, self.tokenizer, self.config, bos=self.bos)
                out.append(
                    PromptInput(
                        p.id,
                        p.category,
                        f"<{p.length} random tokens, seed {p.seed}>",
                        built.input_ids,
                        built.token_types,
                    )
                )
                continue
            pid, cat, text, ids, types = _prompt_fields(p, i)
            spans: tuple[ImageSpan, ...] = ()
            if ids is not None:  # pre-tokenized (e.g. random-token controls): used as given, no BOS added
                ids, types = self._pretokenized(pid, ids, types)
                text = text if text is not None else self.tokenizer.decode(ids)
            else:
                built_in = self._tokenized(pid, text, p)
                text, ids, types, spans = built_in.text, built_in.input_ids, built_in.token_types, built_in.spans
            if len(ids) == 0:
                raise PromptInputError(f"prompt {pid!r} produced no tokens; give a non-empty text")
            out.append(PromptInput(pid, cat, text, ids, types, spans))
        ids = [p.id for p in out]
        dup = sorted({x for x in ids if ids.count(x) > 1})
        if dup:
            raise PromptInputError(f"prompt ids must be unique; repeated: {dup}")
        return out

    def _pretokenized(self, pid: str, ids: Any, types: Any) -> tuple[np.ndarray, np.ndarray]:
        """Given ids and token types ``[T]``, checked as the hasher checks its input: integers (no
        floats, bools, strings), one sequence, raw ids in the vocabulary, token types -1..3."""
        ids_t = id_sequence(f"prompt {pid!r}: input_ids", ids)
        check_id_values(f"prompt {pid!r}: input_ids", ids_t, self.config.vocab_size)
        if types is None:
            types_t = torch.full_like(ids_t, TEXT)
        else:
            types_t = id_sequence(f"prompt {pid!r}: token_types", types)
            check_token_types(f"prompt {pid!r}: token_types", types_t)
        if len(types_t) != len(ids_t):
            raise TokenInputError(f"prompt {pid!r}: {len(types_t)} token_types for {len(ids_t)} input_ids")
        return ids_t.numpy(), types_t.numpy()

    def _tokenized(self, pid: str, text: Any, p: Any) -> ImageTextInput:
        """A text prompt built, checked by the rule the prompt file and the widget use
        (``prompt_text.check_prompt_text``); its pictures: ``<image:path>`` in the text and ``images``
        (paths, bytes or Pillow images for bare ``<image>``; a prompt file's stay in its ``folder``).
        Image errors name the prompt (and its file)."""
        text = check_prompt_text(text, name=f"prompt {pid!r}")
        folder, source = _get(p, "folder"), _get(p, "source")
        try:
            return build_input(
                text,
                self.tokenizer,
                self.config,
                bos=self.bos,
                images=_get(p, "images") or (),
                folder=folder,
                confined=folder is not None,
            )
        except ImagePromptError as err:
            where = f"{source}: " if isinstance(source, str) else ""
            raise type(err)(f"{where}prompt {pid!r}: {err}") from None

    def _pad(self, batch: Sequence[PromptInput]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        t = max(len(p.input_ids) for p in batch)
        ids = torch.full((len(batch), t), self.config.engram_pad_id, dtype=torch.int64)
        types = torch.full((len(batch), t), TEXT, dtype=torch.int64)
        for i, p in enumerate(batch):
            ids[i, : len(p.input_ids)] = torch.from_numpy(p.input_ids)
            types[i, : len(p.token_types)] = torch.from_numpy(p.token_types)
        lengths = torch.tensor([len(p.input_ids) for p in batch], dtype=torch.int64)
        return ids, types, lengths

    # -- forward ----------------------------------------------------------------------------------

    def forward(
        self, input_ids: torch.Tensor, token_types: torch.Tensor | None = None, images: BatchImages = ()
    ) -> dict[int, torch.Tensor]:
        """One forward over ``input_ids [B, T]``; returns each Engram layer's output ``[B, T, hc, dim]``
        (whole-model mode: also ``-1`` -> the LM's logits). ``images``: each row's real pictures
        (``PromptInput.pictures``), for stream sources with a vision tower. Hooks fire on the way."""
        if token_types is None:
            token_types = torch.full(input_ids.shape, TEXT, dtype=torch.int64)
        mask = token_types < 0
        hashes = self.hash_constants.hash_prompt(input_ids.cpu(), mask.cpu())
        if self.lm is not None:
            if isinstance(self.streams_source, ModelStreams):
                self.streams_source.note_images(token_types, images)
            outs: dict[int, torch.Tensor] = {}
            handles = [
                e.hook_out.add_hook(lambda t, name, n=n: outs.__setitem__(n, t)) for n, e in self.engrams.items()
            ]
            try:
                with torch.no_grad():
                    outs[-1] = self.lm(input_ids.to(self.device), mask.to(self.device), hashes.to(self.device))
            finally:
                for h in handles:
                    h.remove()
            return outs
        out = {}
        with torch.no_grad():
            for li, (n, engram) in enumerate(self.engrams.items()):
                x = self.streams_source(input_ids, token_types, n, images).x
                out[n] = engram(x.to(self.device), hashes[:, :, li].to(self.device), mask.to(self.device))
                if getattr(self.streams_source, "chains", False):  # the blocks after n continue from its output
                    cast(Any, self.streams_source).engram_output(n, out[n])
        return out

    def run_with_cache(
        self,
        prompts: Any,
        names: str | Iterable[str] | None = DEFAULT_NAMES,
        device: str | None = "cpu",
        hooks: Mapping[str, HookFn] | None = None,
    ) -> tuple[dict[int, torch.Tensor], ActivationCache]:
        """All prompts in one padded batch: ``(outputs, cache)`` (TransformerLens style)."""
        built = self.build(prompts)
        ids, types, _ = self._pad(built)
        images = [p.pictures() for p in built]
        return self.registry.run_with_cache(lambda: self.forward(ids, types, images), names, device, hooks)

    def run(
        self,
        prompts: Any = None,
        names: str | Iterable[str] | None = (),
        *,
        hooks: Mapping[str, HookFn] | None = None,
        batch_size: int | None = None,
        progress: bool = False,
    ) -> Trace:
        """Run ``prompts`` and return their :class:`Trace` (see the module docstring)."""
        own = self.streams_source.prompts()  # a captured file's prompts: the default, and one batch
        if prompts is None and own is None:
            raise InputError("run() needs prompts (strings, dicts or Prompt objects)")
        built = self.build(own if prompts is None else prompts)
        extra = [names] if isinstance(names, str) else list(names or [])
        wanted = list(DEFAULT_NAMES) + [n for n in extra if n not in DEFAULT_NAMES]
        self.registry.resolve(wanted)  # a typo fails before any work
        size = len(built) if own is not None else batch_size or self.batch_size
        # batch prompts of similar length together (less padding); the Trace keeps the given order
        order = sorted(range(len(built)), key=lambda i: len(built[i].input_ids))
        chunks = [[built[i] for i in order[j : j + size]] for j in range(0, len(built), size)]
        if progress:
            chunks = progress_bar(chunks, desc="engram-viz run", unit="batch")
        if hasattr(self.streams_source, "progress"):  # a bar per block too
            cast(Any, self.streams_source).progress = progress
        parts = []
        for chunk in chunks:
            ids, types, lengths = self._pad(chunk)
            images = [p.pictures() for p in chunk]
            _, cache = self.registry.run_with_cache(
                lambda ids=ids, types=types, images=images: self.forward(ids, types, images), wanted, "cpu", hooks
            )
            parts.append(
                trace_from_cache(
                    cache,
                    ids,
                    layer_ids=self.layer_ids,
                    tokenizer=self.tokenizer,
                    model_label=self.model_label,
                    streams_label=self.streams_source.label,
                    token_types=types,
                    lengths=lengths,
                    prompt_ids=[p.id for p in chunk],
                    categories=[p.category for p in chunk],
                    texts=[p.text for p in chunk],
                    meta=self._meta(),
                )
            )
            del cache
        labels = list(dict.fromkeys(part.streams_label for part in parts))
        # batches with image spans add a clause to the embedding label; one label covers the run
        label = max(labels, key=len) if all(x in max(labels, key=len) for x in labels) else " | ".join(labels)
        for part in parts:
            part.streams_label = label
        self.streams_label = label
        trace = Trace.concat(parts)
        if trace.prompt_ids != [p.id for p in built]:
            trace = trace.select([p.id for p in built])
        trace.meta["image_spans"] = {p.id: [_span_record(s) for s in p.spans] for p in built if p.spans}
        return trace

    def _meta(self) -> dict[str, Any]:
        return {
            "config": self.config.name,
            "n_heads": self.config.engram_n_heads,
            "hc_mult": self.config.hc_mult,
            "pad_id": self.config.engram_pad_id,
            "pad_compressed": int(self.tokenizer.token_map[self.config.engram_pad_id]),
            "device": str(self.device),
            "wkv_mode": self.mode,
            "streams_mode": self.streams_mode,
            "bos": self.bos,
            "synthetic": bool(getattr(self.checkpoint, "synthetic", False)),
        }
