"""vLLM's ``--load-format sluice``: model weights read by Sluice's engine.

Installing Sluice registers the format in every vLLM process through the
``vllm.general_plugins`` entry point (:func:`register`), so::

    vllm serve /models/Llama-3-8B --load-format sluice
    LLM("/models/Llama-3-8B", load_format="sluice")

load the model's safetensors with Sluice. ``--model-loader-extra-config`` takes Sluice's
options, each checked before anything is read (an unknown key or a bad value is a
:class:`sluice.ConfigError` naming it)::

    --model-loader-extra-config '{"memory_limit": "2GiB", "concurrency": 8, "direct": "auto"}'

How weights reach the parameters: the checkpoint is streamed under ``memory_limit`` (its
tensors arrive as their bytes land) into the model's own ``load_weights``, which knows the
architecture's fused and renamed parameters (q/k/v into ``qkv_proj``, gate/up into
``gate_up_proj``, tensor-parallel slices). So every architecture vLLM supports loads, and
the host memory above the model is bounded by ``memory_limit``. Which parameters were not
filled is checked as vLLM's default loader checks it.

The class needs vLLM at import; this module does not, so the loader is built on the first
:func:`register` (or access to ``SluiceModelLoader``).
"""

from __future__ import annotations

import os
import time
from typing import Any, Optional

from sluice.errors import ConfigError

LOAD_FORMAT = "sluice"

_DIRECT = ("auto", "on", "off")
_ENGINES = ("auto", "io_uring", "threads")


def _byte_size(key: str, value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigError(
            f"model_loader_extra_config {key}={value!r}: a byte count or a size string ('2GiB')"
        )
    if isinstance(value, int) and value <= 0:
        raise ConfigError(f"model_loader_extra_config {key}={value!r}: must be positive")
    return value


def _positive_int(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"model_loader_extra_config {key}={value!r}: must be a positive integer")
    return value


def _choice(choices: tuple[str, ...]):
    def check(key: str, value: Any) -> str:
        if value not in choices:
            raise ConfigError(
                f"model_loader_extra_config {key}={value!r}: use one of {', '.join(choices)}"
            )
        return value

    return check


def _boolean(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"model_loader_extra_config {key}={value!r}: must be true or false")
    return value


#: The keys ``--model-loader-extra-config`` takes, and how each is checked.
EXTRA_CONFIG = {
    "memory_limit": _byte_size,
    "chunk_bytes": _byte_size,
    "concurrency": _positive_int,
    "direct": _choice(_DIRECT),
    "engine": _choice(_ENGINES),
    "drop_cache": _boolean,
}


def stream_options(extra: Optional[dict[str, Any]]) -> dict[str, Any]:
    """``sluice.torch.stream``'s keyword arguments from ``--model-loader-extra-config``;
    an unknown key or a bad value is a :class:`sluice.ConfigError` naming it."""
    if extra is None:
        return {}
    if not isinstance(extra, dict):
        raise ConfigError(
            f"model_loader_extra_config must be a mapping, not {type(extra).__name__}"
        )
    unknown = sorted(set(extra) - set(EXTRA_CONFIG))
    if unknown:
        raise ConfigError(
            f"model_loader_extra_config: unknown key(s) {', '.join(map(repr, unknown))} for "
            f"--load-format sluice; it takes {', '.join(sorted(EXTRA_CONFIG))}"
        )
    return {key: EXTRA_CONFIG[key](key, value) for key, value in extra.items()}


def weights_source(model: str) -> str:
    """Where the safetensors of ``model`` are: a local directory (a Hugging Face snapshot
    or any directory of shards), a ``.safetensors`` or index file, or an object URL."""
    if "://" in model:
        return model
    if not os.path.exists(model):
        raise ConfigError(
            f"model {model!r}: no such directory or file (--load-format sluice reads a local "
            "checkpoint or an s3://, gs:// or az:// URL; download a Hub model first)"
        )
    return model


def _build():
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

    from sluice.torch import stream

    class SluiceModelLoader(BaseModelLoader):
        """``--load-format sluice`` (see the module's documentation)."""

        def __init__(self, load_config):
            super().__init__(load_config)
            self.options = stream_options(load_config.model_loader_extra_config)

        def _source(self, model_config) -> str:
            return weights_source(model_config.model_weights or model_config.model)

        def download_model(self, model_config) -> None:
            self._source(model_config)

        def get_all_weights(self, model_config, model):
            """``(name, tensor)`` of every checkpoint tensor, as its bytes land (vLLM's
            in-place reload and sleep/wake use this too)."""
            progress = bool(getattr(self.load_config, "use_tqdm_on_load", False))
            yield from stream(self._source(model_config), progress=progress, **self.options)

        def load_weights(self, model, model_config) -> None:
            from vllm.logger import init_logger

            start = time.perf_counter()
            loaded = model.load_weights(self.get_all_weights(model_config, model))
            init_logger("vllm.model_executor.model_loader.sluice").info(
                "Loading weights took %.2f seconds (sluice)", time.perf_counter() - start
            )
            if model_config.quantization is None and loaded is not None:
                # vLLM's own rule for which parameters must come from the checkpoint.
                DefaultModelLoader.track_weights_loading(self, model, loaded)

    SluiceModelLoader.__module__ = __name__
    SluiceModelLoader.__qualname__ = "SluiceModelLoader"
    return SluiceModelLoader


_LOADER = None


def __getattr__(name: str):
    global _LOADER
    if name == "SluiceModelLoader":
        if _LOADER is None:
            _LOADER = _build()
        return _LOADER
    raise AttributeError(name)


def register() -> None:
    """Registers ``--load-format sluice`` with vLLM (the ``vllm.general_plugins`` entry
    point calls it in every vLLM process); a second call does nothing."""
    from vllm.model_executor import model_loader

    loader = __getattr__("SluiceModelLoader")
    formats = getattr(model_loader, "_LOAD_FORMAT_TO_MODEL_LOADER", {})
    if formats.get(LOAD_FORMAT) is loader:
        return
    model_loader.register_model_loader(LOAD_FORMAT)(loader)
