"""Adapters that plug ``sluice.kv`` into inference engines' own tier interfaces.

One module per engine, each pinned to the engine version whose source it was written
against (docs/design/kv-adapters.md has the interfaces at those versions):

- :mod:`sluice.integrations.vllm`: vLLM 0.33.0, a ``SecondaryTierManager`` for
  ``TieringOffloadingSpec`` (class ``SluiceTier``).
- :mod:`sluice.integrations.sglang`: SGLang 0.5.23, a ``HiCacheStorage`` backend loaded
  through ``--hicache-storage-backend dynamic`` (class ``SluiceHiCacheStorage``).
- :mod:`sluice.integrations.lmcache`: LMCache 0.5.6, an MP-mode ``L2AdapterInterface``
  (class ``SluiceL2Adapter``).
- :mod:`sluice.integrations.mlperf`: the MLPerf Storage kv_cache_benchmark (commit
  23aa82ed), a drop-in for its ``NVMeBackend`` (class ``SluiceKVBenchBackend``).

Importing a module never imports its engine: the engine classes are built on first use,
so ``sluice`` itself stays free of engine dependencies.
"""
