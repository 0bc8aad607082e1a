"""vLLM: a KV offloading spec with Sluice's store behind vLLM's host tier, on every
backend vLLM runs on, CPU included.

Enable it with::

    --kv-transfer-config '{"kv_connector":"OffloadingConnector","kv_role":"kv_both",
      "kv_connector_extra_config":{"spec_name":"SluiceOffloadingSpec",
        "spec_module_path":"sluice.integrations.vllm","cpu_bytes_to_use":4294967296,
        "sluice":{"path":"/nvme/sluice-kv","ssd":"200GiB"}}}'

``SluiceOffloadingSpec`` is vLLM's ``TieringOffloadingSpec`` (its host "primary" tier of
``cpu_bytes_to_use`` bytes, then secondary tiers) with ``SluiceTier`` as the secondary tier
built from the ``sluice`` key (the keys a ``SluiceTier`` entry takes). Two differences:

- On CUDA and XPU the engine's KV moves to and from the host rows with vLLM's own copy
  worker. On every other platform (vLLM's CPU backend, where vLLM refuses its CPU offloading
  with "only supported on CUDA-alike and XPU GPUs") :class:`HostCopyWorker` does it with
  plain memory copies between the engine's cache and the same shared host rows.
- ``sluice`` may be given instead of a ``secondary_tiers`` entry; giving both is an error.

Why behind the host tier rather than in its place: a prefix the engine used a moment ago is
served from vLLM's host rows without any call into the store, and the store's reads and
writes are whole rows (every TP worker's slice at once), so its I/O stays large and
page-aligned (docs/design/vllm-kv.md).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Any

from sluice.errors import ConfigError

TIER_TYPE = "SluiceTier"
MODULE = "sluice.integrations.vllm"


def with_sluice_tier(extra: Mapping[str, Any]) -> dict[str, Any]:
    """``kv_connector_extra_config`` with its ``sluice`` key turned into a ``SluiceTier``
    entry of ``secondary_tiers``. Exactly one Sluice tier is required."""
    out = dict(extra)
    sluice = out.pop("sluice", None)
    tiers = out.get("secondary_tiers") or []
    if not isinstance(tiers, list):
        raise ConfigError(
            f"SluiceOffloadingSpec: 'secondary_tiers' must be a list of tiers, got {tiers!r}"
        )
    tiers = list(tiers)
    ours = [t for t in tiers if isinstance(t, dict) and t.get("type") == TIER_TYPE]
    if sluice is not None:
        if not isinstance(sluice, dict):
            raise ConfigError(
                f"SluiceOffloadingSpec: 'sluice' must be a mapping of store options "
                f'(for example {{"path": "/nvme/sluice-kv"}}), got {sluice!r}'
            )
        if ours:
            raise ConfigError(
                "SluiceOffloadingSpec: give the store's options either in 'sluice' or in a "
                f"{TIER_TYPE} entry of 'secondary_tiers', not both"
            )
        tiers.append({"type": TIER_TYPE, "module_path": MODULE, **sluice})
    elif not ours:
        raise ConfigError(
            "SluiceOffloadingSpec: kv_connector_extra_config needs a 'sluice' key with the "
            'store\'s options, for example "sluice": {"path": "/nvme/sluice-kv"}'
        )
    out["secondary_tiers"] = tiers
    return out


def block_positions(
    blocks: Sequence[int],
    rows: Sequence[int],
    group_sizes: Sequence[int],
    first_indices: Sequence[int],
    blocks_per_row: int,
    job_id: int = -1,
) -> list[tuple[int, Any, Any, Any]]:
    """Where each engine block of a transfer sits in the host rows, per KV cache group:
    ``(group, engine block ids, row ids, sub-block in row)`` as index tensors.

    ``blocks`` lists each group's engine blocks in turn (``group_sizes`` of them) and
    ``rows`` each group's host rows. A group's first block is block ``first_indices[g]``
    of its request, so it is sub-block ``first_indices[g] % blocks_per_row`` of its row
    (a row holds ``blocks_per_row`` consecutive blocks of a request). Raises
    ``ValueError`` before anything is copied when the counts do not add up."""
    import numpy as np
    import torch

    if len(group_sizes) != len(first_indices):
        raise ValueError(
            f"KV transfer {job_id}: {len(group_sizes)} group sizes but "
            f"{len(first_indices)} first-block indices"
        )
    plan = []
    b_off = r_off = 0
    for g, (size, first) in enumerate(zip(group_sizes, first_indices)):
        if size == 0:
            continue
        skip = int(first) % blocks_per_row
        n_rows = -(-(size + skip) // blocks_per_row)
        if b_off + size > len(blocks) or r_off + n_rows > len(rows):
            break
        pos = torch.arange(skip, skip + size)
        row_ids = torch.as_tensor(np.asarray(rows[r_off : r_off + n_rows]), dtype=torch.long)
        blk = torch.as_tensor(np.asarray(blocks[b_off : b_off + size]), dtype=torch.long)
        plan.append((g, blk, row_ids[pos // blocks_per_row], pos % blocks_per_row))
        b_off += size
        r_off += n_rows
    if b_off != len(blocks) or r_off != len(rows):
        raise ValueError(
            f"KV transfer {job_id}: groups of {list(group_sizes)} blocks (first at "
            f"{list(first_indices)}, {blocks_per_row} per row) do not match "
            f"{len(blocks)} engine blocks and {len(rows)} host rows"
        )
    return plan


def _build_classes() -> tuple[type, type]:
    import torch
    from vllm.platforms import current_platform
    from vllm.v1.kv_offload.base import (
        BlockIDsLoadStoreSpec,
        CanonicalKVCaches,
        GPULoadStoreSpec,
        OffloadingWorker,
        TransferResult,
    )
    from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
    from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

    class HostCopyWorker(OffloadingWorker):
        """Copies KV between the engine's cache (in host memory: vLLM's CPU backend) and
        this worker's slots of the shared host rows, as vLLM's CUDA worker does with DMA:
        engine block ``b`` is sub-block ``j`` of a row's ``blocks_per_chunk``, per cache
        tensor. The engine runs a step's forward pass to its end before the connector
        submits the next transfers, so a copy done on submit reads finished KV and lands
        before the pass that reads it; each job is reported finished on the next poll."""

        def __init__(
            self, kv_caches: CanonicalKVCaches, blocks_per_chunk: int, region: Any
        ) -> None:
            self._region = region
            self._bpc = blocks_per_chunk
            self._refs = kv_caches.group_data_refs
            self._engine: list[Any] = []
            self._host: list[Any] = []
            for t in kv_caches.tensors:
                page = t.page_size_bytes
                engine = t.tensor.view(torch.int8).view((-1, page))
                host = region.create_next_worker_view(page * blocks_per_chunk)
                self._engine.append(engine)
                # (row, sub-block, byte) over the same memory.
                self._host.append(
                    host.as_strided(
                        (host.shape[0], blocks_per_chunk, page),
                        (host.stride(0), page, 1),
                    )
                )
            self._finished: list[Any] = []

        def submit_store(self, job_id: int, src_spec: Any, dst_spec: Any) -> bool:
            return self._transfer(job_id, src_spec, dst_spec, to_host=True)

        def submit_load(
            self, job_id: int, src_spec: Any, dst_spec: Any, expedited: bool = False
        ) -> bool:
            # `expedited` (vLLM 0.33): waited on within the step; every copy here is.
            return self._transfer(job_id, dst_spec, src_spec, to_host=False)

        def _transfer(self, job_id: int, engine_spec: Any, host_spec: Any, to_host: bool) -> bool:
            assert isinstance(engine_spec, GPULoadStoreSpec)
            assert isinstance(host_spec, BlockIDsLoadStoreSpec)
            start = time.perf_counter()
            nbytes = 0
            plan = block_positions(
                engine_spec.block_ids,
                host_spec.block_ids,
                engine_spec.group_sizes,
                engine_spec.block_indices,
                self._bpc,
                job_id,
            )
            for g, blk, row, sub in plan:
                for ref in self._refs[g]:
                    page = ref.page_size_bytes
                    engine = self._engine[ref.tensor_idx]
                    host = self._host[ref.tensor_idx]
                    if to_host:
                        host[row, sub, :page] = engine[blk, :page]
                    else:
                        engine[blk, :page] = host[row, sub, :page]
                    nbytes += len(blk) * page
            self._finished.append(TransferResult(job_id, True, nbytes, time.perf_counter() - start))
            return True

        def get_finished(self) -> list[Any]:
            done, self._finished = self._finished, []
            return done

        def wait(self, job_ids: set[int]) -> None:
            return  # every copy is done when its submit returns

        def shutdown(self) -> None:
            self._engine.clear()
            self._host.clear()
            if self._region is not None:
                self._region.cleanup()
                self._region = None

    class SluiceOffloadingSpec(TieringOffloadingSpec):
        """vLLM's tiering spec with a Sluice store as its secondary tier, on every
        platform (see the module docstring)."""

        @classmethod
        def build_metric_definitions(cls, extra_config: dict[str, Any]) -> dict[str, Any]:
            return super().build_metric_definitions(with_sluice_tier(extra_config))

        def __init__(self, config: Any) -> None:
            config = dataclasses.replace(config, extra_config=with_sluice_tier(config.extra_config))
            super().__init__(config)

        def get_worker(self, kv_caches: CanonicalKVCaches) -> Any:
            if self._worker is None:
                if current_platform.is_cuda_alike() or current_platform.is_xpu():
                    self._worker = self.create_worker(kv_caches)
                else:
                    self._worker = self._create_host_worker(kv_caches)
            return self._worker

        def _create_host_worker(self, kv_caches: CanonicalKVCaches) -> Any:
            if self.config.canonical_layout:
                raise ConfigError(
                    "SluiceOffloadingSpec: 'canonical_layout' needs vLLM's GPU copy worker; "
                    f"on {current_platform.device_type!r} remove it from "
                    "kv_connector_extra_config"
                )
            rank = 0 if self.replicated_layout else self.config.parallel.rank
            region = SharedOffloadRegion(
                engine_id=self.config.engine_id,
                num_chunks=self.num_chunks,
                rank=rank,
                kv_bytes_per_chunk=self.kv_bytes_per_chunk,
                cpu_page_size=self.cpu_page_size_per_worker,
            )
            try:
                return HostCopyWorker(kv_caches, self.blocks_per_chunk, region)
            except Exception:
                region.cleanup()
                raise

    return SluiceOffloadingSpec, HostCopyWorker


_classes: tuple[type, type] | None = None


def classes() -> tuple[type, type]:
    """``(SluiceOffloadingSpec, HostCopyWorker)``, built once (they need vLLM)."""
    global _classes
    if _classes is None:
        _classes = _build_classes()
    return _classes
