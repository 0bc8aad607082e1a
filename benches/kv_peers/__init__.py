"""The systems `make bench-kv` measures side by side, and where each one runs.

Each system is one class (base.KvSystem) in its own module, run in its own worker process
(worker.py) by the interpreter its `venv` names: `main` is the interpreter running
bench_kv.py; `peers` is .venv-kvpeers, for the peers whose pins clash with Sluice's venv.
`tier` says which section it belongs to: `ssd` (durable store, cold loads) or `dram`
(resident blocks, warm loads).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SystemSpec:
    name: str
    label: str
    module: str
    cls: str
    tier: str
    venv: str = "main"
    is_sluice: bool = False


SYSTEMS = {
    s.name: s
    for s in [
        SystemSpec(
            "sluice", "Sluice kv (SSD tier)", "sluice_kv", "SluiceSsd", "ssd", is_sluice=True
        ),
        SystemSpec(
            "sluice-sidecar",
            "Sluice kv (SSD tier) via `sluice kv serve`",
            "sluice_kv",
            "SluiceSidecar",
            "ssd",
            is_sluice=True,
        ),
        SystemSpec(
            "file-buffered",
            "file per block, buffered (vLLM FS tier)",
            "file_per_block",
            "FilePerBlockBuffered",
            "ssd",
        ),
        SystemSpec(
            "file-direct",
            "file per block, O_DIRECT (vLLM FS tier)",
            "file_per_block",
            "FilePerBlockDirect",
            "ssd",
        ),
        SystemSpec(
            "mlperf",
            "MLPerf kv_cache_benchmark (np.save/np.load)",
            "mlperf_npy",
            "MlperfNpy",
            "ssd",
        ),
        SystemSpec(
            "lmcache",
            "LMCache 0.5.6 local disk, O_DIRECT",
            "lmcache_disk",
            "LmcacheDisk",
            "ssd",
            "peers",
        ),
        SystemSpec("memcpy", "memcpy (numpy copy)", "memcpy", "Memcpy", "dram"),
        SystemSpec(
            "sluice-dram",
            "Sluice kv (DRAM tier)",
            "sluice_kv",
            "SluiceDram",
            "dram",
            is_sluice=True,
        ),
        SystemSpec(
            "mooncake",
            "Mooncake store 0.3.13 (TCP, loopback)",
            "mooncake_dram",
            "MooncakeDram",
            "dram",
            "peers",
        ),
    ]
}
