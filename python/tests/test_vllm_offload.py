"""SluiceOffloadingSpec's parts that need no vLLM: the copy plan of the host copy worker
and the `sluice` key of kv_connector_extra_config (the engine itself: engine_tests)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sluice.errors import ConfigError
from sluice.integrations.vllm_offload import block_positions, with_sluice_tier


def reference(blocks, rows, sizes, firsts, bpc):
    """Each engine block's (row, sub-block), one block at a time."""
    out, b, r = [], 0, 0
    for g, (n, first) in enumerate(zip(sizes, firsts)):
        if n == 0:
            continue
        skip = first % bpc
        for i in range(n):
            p = skip + i
            out.append((g, blocks[b + i], rows[r + p // bpc], p % bpc))
        b += n
        r += (skip + n + bpc - 1) // bpc
    return out


@pytest.mark.parametrize(
    "sizes, firsts, bpc",
    [
        ([5], [0], 1),  # one block per row: rows are blocks
        ([8], [0], 4),  # whole rows
        ([6], [2], 4),  # starts mid-row, ends mid-row
        ([3, 0, 7], [5, 0, 9], 4),  # several groups, one empty
        ([1], [3], 4),  # one block, last of its row
    ],
)
def test_every_block_lands_in_its_row_and_sub_block(sizes, firsts, bpc):
    n_rows = sum((f % bpc + n + bpc - 1) // bpc for n, f in zip(sizes, firsts) if n)
    blocks = np.arange(100, 100 + sum(sizes), dtype=np.int32)[::-1].copy()
    rows = np.arange(50, 50 + n_rows, dtype=np.int32) * 3
    plan = block_positions(blocks, rows, sizes, firsts, bpc)
    got = [
        (g, int(b), int(r), int(s)) for g, blk, row, sub in plan for b, r, s in zip(blk, row, sub)
    ]
    assert got == reference(list(blocks), list(rows), sizes, firsts, bpc)
    assert all(t.dtype == torch.long for _, *ts in plan for t in ts)


def test_counts_that_do_not_add_up_are_refused_before_any_copy():
    with pytest.raises(ValueError, match=r"transfer 7: .* 3 engine blocks and 2 host rows"):
        block_positions([1, 2, 3], [0, 1], [3], [0], 1, job_id=7)
    with pytest.raises(ValueError, match="1 group sizes but 2 first-block"):
        block_positions([1], [0], [1], [0, 0], 1)
    with pytest.raises(ValueError, match="4 engine blocks and 1 host rows"):
        block_positions([1, 2, 3, 4], [0], [2], [0], 2)  # blocks left over


def test_the_sluice_key_becomes_a_sluice_tier():
    extra = {"cpu_bytes_to_use": 1 << 30, "sluice": {"path": "/kv", "ssd": "1GiB"}}
    out = with_sluice_tier(extra)
    assert out["secondary_tiers"] == [
        {
            "type": "SluiceTier",
            "module_path": "sluice.integrations.vllm",
            "path": "/kv",
            "ssd": "1GiB",
        }
    ]
    assert "sluice" not in out and "sluice" in extra  # the caller's mapping is left alone
    # A SluiceTier entry written out in full is taken as it is.
    assert with_sluice_tier(out) == out


@pytest.mark.parametrize(
    "extra, message",
    [
        ({}, "needs a 'sluice' key"),
        ({"secondary_tiers": [{"type": "fs"}]}, "needs a 'sluice' key"),
        ({"sluice": "/kv"}, "'sluice' must be a mapping"),
        (
            {"sluice": {"path": "/a"}, "secondary_tiers": [{"type": "SluiceTier", "path": "/b"}]},
            "not both",
        ),
        ({"sluice": {"path": "/a"}, "secondary_tiers": {"type": "x"}}, "must be a list"),
    ],
)
def test_a_bad_sluice_key_is_named(extra, message):
    with pytest.raises(ConfigError, match=message):
        with_sluice_tier(extra)
