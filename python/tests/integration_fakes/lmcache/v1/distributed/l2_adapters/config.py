"""Fake of the ``--l2-adapter`` parsing in lmcache@0.5.6 (plugin type only)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field


@dataclass
class PluginL2AdapterConfig:
    module_path: str
    class_name: str
    adapter_params: dict = field(default_factory=dict)


@dataclass
class L2AdaptersConfig:
    adapters: list


def parse_args_to_l2_adapters_config(ns) -> L2AdaptersConfig:
    adapters = []
    for raw in ns.l2_adapter:
        d = json.loads(raw)
        if d.pop("type") != "plugin":
            raise ValueError("the fake parses plugin adapters only")
        adapters.append(PluginL2AdapterConfig(**d))
    return L2AdaptersConfig(adapters)
