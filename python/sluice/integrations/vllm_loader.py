"""vLLM's ``--load-format sluice``: model weights read by Sluice's engine.

Installing Sluice registers the format in every vLLM process through the
``vllm.general_plugins`` entry point (:func:`register`), so::

    vllm serve /models/Llama-3-8B --load-format sluice
    LLM("/models/Llama-3-8B", load_format="sluice")

load the model's safetensors with Sluice. ``--model-loader-extra-config`` takes Sluice's
options, each checked before anything is read (an unknown key or a bad value is a
:class:`sluice.ConfigError` naming it)::

    --model-loader-extra-config '{"memory_limit": "2GiB", "concurrency": 8, "direct": "auto"}'

``weights`` reads the safetensors from elsewhere than ``--model``, which then only needs
the config (and tokenizer) files: an ``s3://``, ``gs://`` or ``az://`` prefix, with the
store configured by the environment as for every Sluice load::

    vllm serve /models/llama-config --load-format sluice \
        --model-loader-extra-config '{"weights": "s3://models/llama-3-8b/"}'

How weights reach the parameters: the checkpoint is streamed under ``memory_limit`` (its
tensors arrive as their bytes land) into the model's own ``load_weights``, which knows the
architecture's fused and renamed parameters (q/k/v into ``qkv_proj``, gate/up into
``gate_up_proj``, tensor-parallel slices). So every architecture vLLM supports loads, and
the host memory above the model is bounded by ``memory_limit``. Which parameters were not
filled is checked as vLLM's default loader checks it.

Under tensor parallelism the ranks load as a group (``sluice.stream(..., group=)``, the same
mechanism any torch.distributed group uses): each reads one contiguous run of every round of
tensors and sends it to the others over vLLM's CPU (gloo) group, so the files are read once
between the ranks, not once per rank.

The class needs vLLM at import; this module does not, so the loader is built on the first
:func:`register` (or access to ``SluiceModelLoader``).
"""

from __future__ import annotations

import os
import time
from typing import Any, Optional

from sluice.errors import ConfigError

LOAD_FORMAT = "sluice"


def _load_option(key: str, value: Any) -> Any:
    """A load option, checked by the same rules as every Sluice load (``check_options``);
    a size comes back as its bytes."""
    from sluice import _sluice

    try:
        _sluice.check_options(**{key: value})
        if key in ("memory_limit", "chunk_bytes"):
            return _sluice.parse_byte_size(key, value)
    except ConfigError as e:
        raise ConfigError(f"model_loader_extra_config {key}={value!r}: {e}") from None
    return value


def _boolean(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"model_loader_extra_config {key}={value!r}: must be true or false")
    return value


def _weights_key(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"model_loader_extra_config {key}={value!r}: a path or an object URL")
    return value


#: The keys ``--model-loader-extra-config`` takes, and how each is checked.
EXTRA_CONFIG = {
    "memory_limit": _load_option,
    "chunk_bytes": _load_option,
    "concurrency": _load_option,
    "direct": _load_option,
    "engine": _load_option,
    "drop_cache": _boolean,
    "distributed": _boolean,
    "weights": _weights_key,
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


def weights_device(model: Any) -> str:
    """Where the tensors a load yields should be: the model's CUDA device when its
    parameters are on one (the reads then land in pinned buffers and each tensor's copy is
    queued on the device's stream, so the weight loaders copy device to device), else
    host memory."""
    for param in model.parameters():
        device = param.device
        return str(device) if device.type == "cuda" else "cpu"
    return "cpu"


def _tp_group():
    """vLLM's tensor-parallel group coordinator when it has more than one rank."""
    try:
        from vllm.distributed import parallel_state
    except ImportError:
        return None
    if not parallel_state.model_parallel_is_initialized():
        return None
    group = parallel_state.get_tp_group()
    return group if group.world_size > 1 else None


def _log_read(options: dict[str, Any], group) -> int:
    """Logs (and returns) the bytes this process read from storage in its last stream."""
    from vllm.logger import init_logger

    from sluice import last_load_stats
    from sluice._core import bytes_read

    read = bytes_read(last_load_stats())
    where = (
        f"tensor-parallel rank {group.rank_in_group} of {group.world_size}"
        if group
        else "one process"
    )
    init_logger("vllm.model_executor.model_loader.sluice").info(
        "sluice read %d bytes of the checkpoint's files (%s)", read, where
    )
    return read


def _shared_weights(source: str, group, options: dict[str, Any], device: str):
    """Every tensor, read by one rank of vLLM's tensor-parallel group and passed to the others
    over its CPU (gloo) group: Sluice's grouped stream (``sluice.stream(..., group=)``)."""
    from sluice.torch import stream

    yield from stream(source, group=group.cpu_group, device=device, **options)
    _log_read(options, group)


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
            where = self.options.get("weights") or model_config.model_weights
            return weights_source(where or model_config.model)

        def download_model(self, model_config) -> None:
            self._source(model_config)

        def get_all_weights(self, model_config, model):
            """``(name, tensor)`` of every checkpoint tensor, as its bytes land (vLLM's
            in-place reload and sleep/wake use this too). Under tensor parallelism each
            tensor is read by one rank and broadcast to the others (``distributed``, on by
            default), so the checkpoint is read from storage once, not once per rank."""
            options = dict(self.options)
            options.pop("weights", None)
            distributed = options.pop("distributed", True)
            source = self._source(model_config)
            group = _tp_group() if distributed else None
            if group is None:
                progress = bool(getattr(self.load_config, "use_tqdm_on_load", False))
                device = weights_device(model)
                yield from stream(source, progress=progress, device=device, **options)
                _log_read(options, None)
                return
            yield from _shared_weights(source, group, options, weights_device(model))

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
