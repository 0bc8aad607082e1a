"""Fake of ``create_l2_adapter`` for plugin adapters (plugin_l2_adapter.py at 0.5.6):
import the module, check the class subclasses L2AdapterInterface, and build it as
``cls(adapter_params, l1_memory_desc=...)``."""

from __future__ import annotations

import importlib

from lmcache.v1.distributed.l2_adapters.base import L2AdapterInterface


def create_l2_adapter(config, l1_memory_desc=None):
    cls = getattr(importlib.import_module(config.module_path), config.class_name)
    if not (isinstance(cls, type) and issubclass(cls, L2AdapterInterface)):
        raise TypeError(f"{config.module_path}.{config.class_name} is not an L2 adapter")
    kwargs = {} if l1_memory_desc is None else {"l1_memory_desc": l1_memory_desc}
    return cls(config.adapter_params, **kwargs)
