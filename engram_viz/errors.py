"""Every exception of engram-viz, one line a class, grouped by the layer that raises it.

Each user-facing error derives from :class:`EngramVizError`, so a caller (the CLI, a notebook, a
service) can catch them all in one place and show one line: the message names the input, what was
expected and what came. Errors that are also a ``ValueError``, a ``TypeError``, an ``OSError`` or a
``RuntimeError`` by nature keep that second base, so existing ``except ValueError`` code works.
Anything else raised inside the suite is a bug and keeps its traceback.
"""

from __future__ import annotations


class EngramVizError(Exception):
    """Base of every user-facing error of engram-viz (bad input, missing file, corrupt weights...)."""


# foundation: arguments, config, settings, files
class InputError(EngramVizError, ValueError):
    """An argument or input outside what a function takes (a bad shape, range, name or option)."""


class InputTypeError(EngramVizError, TypeError):
    """An argument or input of the wrong type (a list where a tensor goes, a float where ids go)."""


class ConfigError(EngramVizError, ValueError):
    """A config file is missing, unreadable or inconsistent."""


class SettingError(EngramVizError, ValueError):
    """An ``ENGRAM_VIZ_*`` variable holds a value the suite cannot use."""


class WriteError(EngramVizError, OSError):
    """A file or an output folder cannot be written: in the way, no permission, or another run writing."""


# core: tokens and the reference path
class TokenMapError(EngramVizError, ValueError):
    """The compressed map built from a tokenizer does not match the config."""


class TokenInputError(EngramVizError, ValueError):
    """Token ids, token types or a hasher argument out of range or of the wrong shape."""


class TokenInputTypeError(EngramVizError, TypeError):
    """Token ids or token types of the wrong type (floats, strings, bools, lists where tensors go)."""


class DeviceError(EngramVizError, ValueError):
    """A device that is not one of auto, cpu, cuda, cuda:N, mps, or is not available in this torch."""


class Bf16GemmError(EngramVizError, ValueError):
    """``gemm='bf16'`` asked for on operands or a device where bf16 operands are not exact."""


# weights: bytes on disk
class CheckpointError(EngramVizError, ValueError):
    """A checkpoint or safetensors file is missing, corrupt, truncated or does not match the config."""


class RowIdError(CheckpointError):
    """A row id (table row or token id) outside the table."""


class NonFiniteError(CheckpointError):
    """A weight tensor holds NaN or Inf (names the file, the tensor and the rows)."""


class HubError(CheckpointError):
    """A checkpoint on the Hugging Face Hub that cannot be had: no such repository, gated, offline, a broken download."""


class TransientReadError(Exception):
    """Internal, never shown: a Hub byte range worth another try (a dropped connection, a 5xx); the text is why."""


class GGUFHeaderError(CheckpointError):
    """The bytes are not a GGUF header the suite reads (truncated, another magic or version, an unknown type)."""


class RowEditError(EngramVizError, ValueError):
    """An edit names a row outside the table, an unknown spec or a row of the wrong shape."""


# tiny: the embedded default model
class SourceMissingError(EngramVizError, FileNotFoundError):
    """A corpus source's Debian package is not installed (the message names it)."""


# run: prompts, streams, traces, attaching
class PromptError(EngramVizError, ValueError):
    """A prompt file is missing, malformed or inconsistent."""


class PromptInputError(EngramVizError, ValueError):
    """A prompt the comparison cannot run; the message is shown in the widget."""


class PromptTypeError(EngramVizError, TypeError):
    """A prompt that is neither a string, a dict nor an object with ``.text`` / ``.input_ids``."""


class ImagePromptError(EngramVizError, ValueError):
    """A placeholder is malformed or asks for more image tokens than the model takes."""


class PictureError(ImagePromptError):
    """A prompt's picture is missing, empty, unreadable, truncated, or outside the prompt file's folder."""


class StreamsError(EngramVizError, ValueError):
    """Residual streams (a tensor or a streams file) of the wrong shape, content or layers."""


class TraceError(EngramVizError, ValueError):
    """A Trace is inconsistent, or a saved one is missing, corrupt or mismatched."""


class AttachError(EngramVizError, ValueError):
    """A model cannot be attached to: no Engram-like submodules, ambiguous ones, or a bad layout."""


class LayoutError(AttachError):
    """A model's Engram layout is missing, malformed, or disagrees with its modules or the given config."""


# analysis: corpora, row statistics, explanations, edits
class CorpusError(EngramVizError, ValueError):
    """A corpus file is missing or malformed, or the default corpus is not installed."""


class MemoryLimitError(EngramVizError, ValueError):
    """A memory limit that is not a positive number of bytes."""


class RowIndexError(EngramVizError, ValueError):
    """A row-index file that is unreadable or built for another config."""


class AttributionError(EngramVizError, ValueError):
    """A position or layer that the prompt or the model does not have."""


class LensError(EngramVizError, ValueError):
    """A lens asked of a model without an LM head, or a position outside the text."""


class EditTargetError(EngramVizError, ValueError):
    """An entity not found in its text, or one too short to hold an n-gram."""


class CacheSimError(EngramVizError, ValueError):
    """A cache simulation asked with a bad size, an unknown policy, an empty trace or no libcachesim."""


# viz: frames, fonts, export
class FrameError(EngramVizError, ValueError):
    """A frame given to a plot lacks the columns, rows or values it needs."""


class CJKFontMissingError(EngramVizError, RuntimeError):
    """Raised by ``require_cjk_font`` when no CJK-capable font is installed."""


class CJKFontWarning(UserWarning):
    """No CJK-capable font was found; Chinese tokens would render as empty boxes."""


class ExportError(EngramVizError, RuntimeError):
    """A figure could not be exported."""


class BrowserNotFoundError(ExportError):
    """Plotly static export needs Chrome/Chromium and none was found."""


# apps: the jobs
class ReportError(EngramVizError, RuntimeError):
    """The report could not be produced (bad prompts, an unreadable checkpoint, a failed write)."""


class UploadError(PictureError):
    """A picture uploaded into the comparison is empty, too big, or not a complete PNG or JPEG."""
