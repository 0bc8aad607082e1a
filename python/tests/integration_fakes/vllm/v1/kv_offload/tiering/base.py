"""Fake of vllm@0.33.0:vllm/v1/kv_offload/tiering/base.py: the job types and the
SecondaryTierManager ABC with 0.33.0's abstract methods and optional hooks."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from vllm.v1.kv_offload.base import Medium, RequestOffloadingContext


@dataclass
class TransferJob:
    job_id: int
    keys: Collection[bytes]
    chunk_ids: np.ndarray
    is_promotion: bool
    req_context: Any
    submit_time: float = field(default_factory=time.monotonic)


@dataclass
class JobResult:
    job_id: int
    success: bool
    successful_keys: Collection[bytes] | None = None
    transfer_time: float | None = None
    transfer_bytes: int | None = None


class SecondaryTierManager(ABC):
    medium: ClassVar[Medium | None] = None
    tolerates_off_thread_polling: ClassVar[bool] = False

    def __init__(self, offloading_spec, primary_kv_view, tier_type, backpressure_detector=None):
        self._offloading_spec = offloading_spec
        self._primary_kv_view = primary_kv_view
        assert primary_kv_view.strides is not None
        self._block_size_bytes = primary_kv_view.strides[0]
        self.tier_type = tier_type
        self.locality = None
        self._bp_detector = backpressure_detector

    @property
    def block_size_bytes(self) -> int:
        return self._block_size_bytes

    @abstractmethod
    def lookup(self, key, req_context): ...

    @abstractmethod
    def submit_store(self, job_metadata: TransferJob) -> None: ...

    @abstractmethod
    def submit_load(self, job_metadata: TransferJob) -> None: ...

    @abstractmethod
    def get_finished_jobs(self): ...

    @abstractmethod
    def on_new_request(self, req_context) -> RequestOffloadingContext: ...

    @abstractmethod
    def drain_jobs(self) -> None: ...

    def has_pending_work(self) -> bool:
        return False

    def take_events(self):
        return ()

    def touch(self, keys, req_context):
        return

    def on_request_finished(self, req_context) -> None:
        return

    def serve_external_requests(self, parent) -> None:
        return

    def on_schedule_end(self, context) -> None:
        return

    def shutdown(self) -> None:
        return

    def get_stats(self):
        return None
