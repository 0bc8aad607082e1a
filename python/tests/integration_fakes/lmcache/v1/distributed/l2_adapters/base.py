"""Fake of lmcache@0.5.6:lmcache/v1/distributed/l2_adapters/base.py: the
L2AdapterInterface ABC and its abstract methods."""

from __future__ import annotations

from abc import ABC, abstractmethod


class L2AdapterInterface(ABC):
    def __init__(self, max_capacity_bytes: int = 0) -> None:
        self._max_capacity_bytes = max_capacity_bytes

    @abstractmethod
    def get_store_event_fd(self) -> int: ...

    @abstractmethod
    def get_lookup_and_lock_event_fd(self) -> int: ...

    @abstractmethod
    def get_load_event_fd(self) -> int: ...

    @abstractmethod
    def submit_store_task(self, keys, objects) -> int: ...

    @abstractmethod
    def pop_completed_store_tasks(self) -> dict: ...

    @abstractmethod
    def submit_lookup_and_lock_task(self, keys, group_layout_descs) -> int: ...

    @abstractmethod
    def query_lookup_and_lock_result(self, task_id): ...

    @abstractmethod
    def submit_unlock(self, keys) -> None: ...

    @abstractmethod
    def submit_load_task(self, keys, objects) -> int: ...

    @abstractmethod
    def query_load_result(self, task_id): ...

    @abstractmethod
    def close(self) -> None: ...
