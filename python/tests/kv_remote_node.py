"""One node of the two-node KV test (test_kv_remote.py), run in a network namespace of its
own: a store in its own directory whose shared tier is the object store at ``url``.

``put DIR URL MODEL N``: puts N blocks, waits for the first segment to go up, and closes
(the last pass uploads the rest).
``get DIR URL MODEL N``: waits up to 30 s to find the N blocks, reads them, checks every
byte, then reads them again (from its own tiers now). Prints one JSON line: what it found
and its stats."""

from __future__ import annotations

import json
import sys
import time

import numpy as np
import sluice.kv

BLOCK = 64 << 10


def block(i: int) -> np.ndarray:
    return np.frombuffer(np.random.default_rng(i).bytes(BLOCK), np.uint8)


def main() -> None:
    mode, path, url, model, n = sys.argv[1:6]
    keys = [b"node-chain-%06d" % i for i in range(int(n))]
    shared = "4MiB" if mode == "put" else 0
    with sluice.kv.open(
        path,
        block_bytes=BLOCK,
        ssd="8MiB",
        model=model,
        remote=url,
        shared=shared,
        shared_refresh_ms=50,
        segment_bytes="1MiB",
    ) as kv:
        out: dict = {}
        if mode == "put":
            out["put"] = kv.put_batch(keys, [block(i) for i in range(len(keys))])
            # A full segment goes up in the background; close() puts up the rest.
            deadline = time.monotonic() + 30
            while kv.stats()["remote"]["uploaded_segments"] == 0:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)
        else:
            deadline = time.monotonic() + 30
            while kv.lookup(keys) < len(keys) and time.monotonic() < deadline:
                time.sleep(0.05)
            bufs = [np.zeros(BLOCK, np.uint8) for _ in keys]
            out["found"] = kv.lookup(keys)
            out["got"] = kv.get_batch_into(keys, bufs)
            out["exact"] = all((b == block(i)).all() for i, b in enumerate(bufs))
            out["again"] = kv.get_batch_into(keys, bufs)
        out["stats"] = kv.stats()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
