"""Fake of vllm@0.33.0:vllm/v1/kv_offload/tiering/factory.py for out-of-tree tiers:
``type`` is the class name in ``module_path``; ``type``, ``module_path`` and
``backpressure`` are removed from the entry and every other key (``locality`` too) is a
constructor keyword."""

from __future__ import annotations

import importlib

from vllm.v1.kv_offload.tiering.base import SecondaryTierManager


class SecondaryTierFactory:
    @classmethod
    def get_tier_class(cls, tier_config: dict) -> type:
        tier_type = tier_config.get("type")
        if not tier_type:
            raise ValueError("Secondary tier configuration must include 'type'")
        module_path = tier_config.get("module_path")
        if module_path is None:
            raise ValueError(f"Unknown secondary tier type: {tier_type!r}")
        tier_cls = getattr(importlib.import_module(module_path), tier_type)
        assert issubclass(tier_cls, SecondaryTierManager)
        return tier_cls

    @classmethod
    def create_secondary_tier(cls, tier_config, primary_kv_view, offloading_spec):
        tier_cls = cls.get_tier_class(tier_config)
        config = dict(tier_config)
        tier_type = config.pop("type")
        config.pop("module_path", None)
        if config.pop("backpressure", None) is not None:
            raise NotImplementedError("the fake factory builds no backpressure detector")
        return tier_cls(
            offloading_spec=offloading_spec,
            primary_kv_view=primary_kv_view,
            tier_type=tier_type,
            backpressure_detector=None,
            **config,
        )
