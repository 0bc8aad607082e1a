"""Contract tests of the SGLang 0.5.23 HiCache storage backend (docs/design/
kv-adapters.md §2.6).

The backend is built as the ``dynamic`` factory builds it, then registered with a host
pool, then driven with the controller's calls: ``batch_exists`` (prefix count),
``batch_set_v1``/``batch_get_v1`` with token-slot ``host_indices``, and the deprecated
flat-tensor calls when ``interface_v1`` is off. Runs against the real SGLang modules
where importable, else against tests/integration_fakes.
"""

from __future__ import annotations

import hashlib
import re
import threading

import pytest
from integration_fakes.engine_fakes import flip_byte_of_block, unwritable_dir, use_engine
from sluice.errors import ConfigError, SluicePermissionError

torch = pytest.importorskip("torch")
REAL_SGLANG = use_engine("sglang.srt.mem_cache.storage.backend_factory")

from sglang.srt.mem_cache.hicache_storage import (  # noqa: E402
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
)
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: E402

PAGE = 64


class FakeHostKVCache:
    """The MHA host pool's zero-copy surface (pool_host/mha.py at 0.5.23): K and V
    halves of one pinned buffer; ``get_page_buffer_meta`` gives K then V per page."""

    def __init__(self, pages=24, layout="page_first", layer_num=2, head_num=2, head_dim=64):
        self.page_size = PAGE
        self.layout = layout
        self.dtype = torch.bfloat16
        self.layer_num, self.head_num, self.head_dim = layer_num, head_num, head_dim
        self.size = pages * PAGE
        self.kv_buffer = torch.zeros(2, self.size, layer_num, head_num, head_dim, dtype=self.dtype)

    def get_page_buffer_meta(self, indices):
        assert len(indices) % self.page_size == 0
        item = self.dtype.itemsize
        token = self.layer_num * self.head_num * self.head_dim * item
        v_offset = self.size * token
        base = self.kv_buffer.data_ptr()
        ptrs = []
        for start in indices.tolist()[:: self.page_size]:
            ptrs += [base + start * token, base + start * token + v_offset]
        return ptrs, [token * self.page_size] * len(ptrs)

    def get_data_page(self, index, flat=True):
        page = self.kv_buffer[:, index : index + self.page_size]
        return page.flatten() if flat else page

    def get_dummy_flat_data_page(self):
        return torch.zeros(
            (2, self.page_size, self.layer_num, self.head_num, self.head_dim), dtype=self.dtype
        ).flatten()

    def set_from_flat_data_page(self, index, data_page):
        shape = (2, self.page_size, self.layer_num, self.head_num, self.head_dim)
        self.kv_buffer[:, index : index + self.page_size] = data_page.reshape(shape)

    def get_size_per_token(self):
        return 2 * self.layer_num * self.head_num * self.head_dim * self.dtype.itemsize

    def get_ksize_per_token(self):
        return self.get_size_per_token() // 2

    def page(self, start):
        """Bytes of the page at token slot ``start`` (K and V)."""
        raw = self.kv_buffer[:, start : start + PAGE].contiguous().view(torch.uint8)
        return raw.numpy().tobytes()


def chain(n, seed="s"):
    keys, h = [], seed
    for i in range(n):
        h = hashlib.sha256(f"{h}/{i}".encode()).hexdigest()
        keys.append(h)
    return keys


def make_backend(path, pool=None, interface_v1=1, mla=False, tp_rank=0, **extra):
    cfg = HiCacheStorageConfig(
        tp_rank, 2 if tp_rank else 1, 0, 1, 0, 1, mla, False, True, "test-model",
        extra_config={
            "backend_name": "sluice",
            "module_path": "sluice.integrations.sglang",
            "class_name": "SluiceHiCacheStorage",
            "interface_v1": interface_v1,
            "path": str(path),
            "ssd": "32MiB",
            **extra,
        },
    )  # fmt: skip
    pool = pool or FakeHostKVCache()
    backend = StorageBackendFactory.create_backend("dynamic", cfg, pool)
    backend.register_mem_pool_host(pool)
    backend.on_host_pools_registered()
    return backend, pool


def fill_pages(pool, start, n_pages, seed):
    gen = torch.Generator().manual_seed(seed)
    span = slice(start, start + n_pages * PAGE)
    pool.kv_buffer[:, span] = torch.randn(pool.kv_buffer[:, span].shape, generator=gen).to(
        pool.dtype
    )


def test_zero_copy_round_trip_and_prefix_semantics(tmp_path):
    backend, pool = make_backend(tmp_path / "kv")
    try:
        assert isinstance(backend, HiCacheStorage)
        info = HiCacheStorageExtraInfo()
        keys = chain(10)
        hi_a = torch.arange(0, 10 * PAGE)
        hi_b = torch.arange(10 * PAGE, 20 * PAGE)
        fill_pages(pool, 0, 10, seed=1)
        assert backend.batch_exists(keys, info) == 0
        assert backend.batch_set_v1(keys, hi_a, info) == [True] * 10
        assert backend.batch_exists(keys, info) == 10
        assert backend.batch_exists([keys[0], "f" * 64, keys[2]], info) == 1
        assert backend.batch_get_v1(keys, hi_b, info) == [True] * 10
        for i in range(10):
            assert pool.page(10 * PAGE + i * PAGE) == pool.page(i * PAGE)

        pool.kv_buffer[:, 20 * PAGE : 23 * PAGE] = 7
        before = pool.page(21 * PAGE), pool.page(22 * PAGE)
        got = backend.batch_get_v1([keys[0], "e" * 64, keys[2]], torch.arange(20 * PAGE, 23 * PAGE))
        assert got == [True, False, False]
        assert pool.page(20 * PAGE) == pool.page(0)
        assert (pool.page(21 * PAGE), pool.page(22 * PAGE)) == before  # left untouched
    finally:
        backend.close()


def test_a_full_storage_batch_from_three_threads_at_once(tmp_path):
    pool = FakeHostKVCache(pages=3 * 128 + 128)
    backend, _ = make_backend(tmp_path / "kv", pool=pool, ssd="128MiB")
    keys = chain(128, "big")
    fill_pages(pool, 0, 128, seed=2)
    try:
        assert backend.batch_set_v1(keys, torch.arange(0, 128 * PAGE)) == [True] * 128
        results = {}

        def setter():
            other = chain(128, "other")
            results["set"] = backend.batch_set_v1(other, torch.arange(0, 128 * PAGE))

        def getter():
            dst = torch.arange(128 * PAGE, 256 * PAGE)
            results["get"] = backend.batch_get_v1(keys, dst)

        def exister():
            results["exists"] = backend.batch_exists(keys)

        threads = [threading.Thread(target=f) for f in (setter, getter, exister)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert results == {"set": [True] * 128, "get": [True] * 128, "exists": 128}
        for i in range(0, 128, 17):
            assert pool.page((128 + i) * PAGE) == pool.page(i * PAGE)
    finally:
        backend.close()


def test_flat_tensor_path_when_interface_v1_is_off(tmp_path):
    backend, pool = make_backend(tmp_path / "kv", interface_v1=0)
    try:
        keys = chain(3, "flat")
        fill_pages(pool, 0, 3, seed=3)
        pages = [pool.get_data_page(i * PAGE) for i in range(3)]
        assert backend.batch_set(keys, pages) is True
        assert backend.exists(keys[1]) and not backend.exists("d" * 64)
        assert backend.set("c" * 64, pages[0]) is True
        dummies = [pool.get_dummy_flat_data_page() for _ in range(3)]
        got = backend.batch_get([keys[0], "b" * 64, keys[2]], dummies)
        assert got[0] is dummies[0] and got[1] is None and got[2] is None
        assert torch.equal(got[0], pages[0])
        assert torch.equal(backend.get(keys[2]), pages[2])
        assert backend.get("a" * 64) is None
    finally:
        backend.close()


def test_mla_pages_are_one_block_shared_by_every_rank(tmp_path):
    class MlaPool(FakeHostKVCache):
        def get_page_buffer_meta(self, indices):
            token = self.layer_num * self.head_num * self.head_dim * self.dtype.itemsize
            base = self.kv_buffer.data_ptr()
            ptrs = [base + s * token for s in indices.tolist()[:: self.page_size]]
            return ptrs, [token * self.page_size] * len(ptrs)

    keys = chain(2, "mla")
    a, pool = make_backend(tmp_path / "kv", pool=MlaPool(), mla=True)
    fill_pages(pool, 0, 2, seed=4)
    assert a._parts == 1
    assert a.batch_set_v1(keys, torch.arange(0, 2 * PAGE)) == [True, True]
    a.close()
    b, _ = make_backend(tmp_path / "kv", pool=MlaPool(), mla=True, tp_rank=1)
    try:
        assert b.batch_exists(keys) == 2  # rank 1 reads rank 0's pages
    finally:
        b.close()
    c, _ = make_backend(tmp_path / "kv", tp_rank=1)  # MHA rank 1: its own namespace
    try:
        assert c.batch_exists(keys) == 0
    finally:
        c.close()


def test_a_corrupted_page_is_a_miss_and_the_pages_after_it_too(tmp_path):
    backend, pool = make_backend(tmp_path / "kv")
    keys = chain(3, "bad")
    fill_pages(pool, 0, 3, seed=5)
    backend.batch_set_v1(keys, torch.arange(0, 3 * PAGE))
    backend.close()
    k_page = pool.kv_buffer[0, PAGE : 2 * PAGE].contiguous().view(torch.uint8).numpy()
    flip_byte_of_block(tmp_path / "kv" / "sglang-tp0of1-pp0-cp0-dcp0", k_page.tobytes())
    backend, pool2 = make_backend(tmp_path / "kv")
    try:
        got = backend.batch_get_v1(keys, torch.arange(3 * PAGE, 6 * PAGE))
        assert got == [True, False, False]
        assert pool2.page(3 * PAGE) == pool.page(0)
    finally:
        backend.close()


def test_bad_input_raises_typed_errors_naming_the_value(tmp_path):
    with pytest.raises(ConfigError, match="'root'"):
        make_backend(tmp_path / "kv", root="/x")
    bad = unwritable_dir(tmp_path)
    with pytest.raises(SluicePermissionError, match=re.escape(str(bad))):
        make_backend(bad)
    backend, pool = make_backend(tmp_path / "kv")
    try:
        keys = chain(2)
        with pytest.raises(ConfigError, match=r"need 128 host indices \(page size 64\), got 64"):
            backend.batch_set_v1(keys, torch.arange(0, PAGE))
        with pytest.raises(ConfigError, match=f"host index {pool.size}"):
            backend.batch_get_v1(keys[:1], torch.arange(pool.size, pool.size + PAGE))
        with pytest.raises(ConfigError, match="page 0: 64 bytes"):
            backend.batch_set(keys[:1], [torch.zeros(64, dtype=torch.uint8)])
    finally:
        backend.close()


def test_methods_that_have_no_meaning_here_raise_not_return_none(tmp_path):
    backend, _ = make_backend(tmp_path / "kv")
    try:
        with pytest.raises(NotImplementedError):
            backend.clear()
        with pytest.raises(NotImplementedError):
            backend.batch_get_v2([])
        with pytest.raises(NotImplementedError):
            backend.batch_set(chain(1), None)
    finally:
        backend.close()
