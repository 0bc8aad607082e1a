#!/usr/bin/env python3
"""Standalone GPU check of Sluice's torch front end (device="cuda" paths).

Run on a CUDA machine with a Sluice wheel installed (`maturin build --release -o wheels`, then
`pip install --no-deps --no-index wheels/*.whl` there):

    python3 benches/gpu_check.py

Environment:
  GPU_CHECK_DEVICE=cpu    run everything against "cpu" instead of CUDA (script shakedown)
  GPU_CHECK_SIZE_MIB=N    size of the big single file (default 1024)
  GPU_CHECK_DATA=DIR      where checkpoints are written (default: a non-tmpfs dir)
  OUT=DIR                 the JSON summary is also written to $OUT/gpu_check.json

Each check runs in its own try/except; the JSON summary lists pass/fail per check,
exceptions with type and message, timings and versions.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import struct
import subprocess
import sys
import time
import traceback

T0 = time.perf_counter()
CPU_MODE = os.environ.get("GPU_CHECK_DEVICE", "cuda") == "cpu"
SIZE_MIB = int(os.environ.get("GPU_CHECK_SIZE_MIB", "1024"))
RESULTS: dict = {"checks": {}, "info": {}, "timings": {}}


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


def exc_info(e: BaseException) -> dict:
    return {
        "type": f"{type(e).__module__}.{type(e).__qualname__}",
        "mro": [c.__name__ for c in type(e).__mro__][:6],
        "message": str(e)[:2000],
        "traceback_tail": traceback.format_exc().strip().splitlines()[-6:],
    }


def check(name: str):
    """Decorator-ish runner: records pass / fail / error with details."""

    def run(fn):
        log(f"check {name} ...")
        t = time.perf_counter()
        entry: dict = {}
        try:
            detail = fn()
            entry["status"] = "pass"
            if detail is not None:
                entry["detail"] = detail
        except AssertionError as e:
            entry["status"] = "fail"
            entry["error"] = exc_info(e)
        except BaseException as e:
            if isinstance(e, KeyboardInterrupt):
                raise
            entry["status"] = "error"
            entry["error"] = exc_info(e)
        entry["seconds"] = round(time.perf_counter() - t, 3)
        RESULTS["checks"][name] = entry
        log(
            f"  -> {entry['status']} ({entry['seconds']}s)"
            + (
                f" {entry['error']['type']}: {entry['error']['message'][:300]}"
                if "error" in entry
                else ""
            )
        )
        return fn

    return run


# --------------------------------------------------------------------------- imports
import contextlib  # noqa: E402

import numpy as np  # noqa: E402
import safetensors  # noqa: E402
import safetensors.torch as st  # noqa: E402
import sluice  # noqa: E402
import torch  # noqa: E402
from safetensors import safe_open as st_safe_open  # noqa: E402

RESULTS["info"].update(
    python=sys.version.split()[0],
    platform=platform.platform(),
    torch=torch.__version__,
    torch_cuda=torch.version.cuda,
    safetensors=safetensors.__version__,
    numpy=np.__version__,
    sluice=getattr(sluice, "__version__", None),
    sluice_file=sluice.__file__,
    cpu_mode=CPU_MODE,
    cuda_available=torch.cuda.is_available(),
    cpu_count=os.cpu_count(),
)
if torch.cuda.is_available():
    RESULTS["info"]["gpu_name"] = torch.cuda.get_device_name(0)
    RESULTS["info"]["gpu_count"] = torch.cuda.device_count()
    RESULTS["info"]["gpu_mem_gib"] = round(
        torch.cuda.get_device_properties(0).total_memory / 2**30, 1
    )

if CPU_MODE:
    DEV = torch.device("cpu")
    DEVICE_VARIANTS = ["cpu", "cpu:0", torch.device("cpu")]
    REF_DEVICE = "cpu"
else:
    DEV = torch.device("cuda", 0)
    DEVICE_VARIANTS = ["cuda", "cuda:0", 0]
    REF_DEVICE = "cuda:0"


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


# --------------------------------------------------------------------------- data
def fs_type(path: str) -> str:
    path = os.path.realpath(path)
    best, kind = "", "?"
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                mnt, typ = parts[1], parts[2]
                if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(
                    best
                ):
                    best, kind = mnt, typ
    except OSError:
        pass
    return f"{kind} ({best})"


def pick_data_dir() -> str:
    if os.environ.get("GPU_CHECK_DATA"):
        return os.environ["GPU_CHECK_DATA"]
    for cand in ("/var/tmp", os.path.join(os.getcwd(), "gpu-check"), "/tmp"):
        if (
            os.path.isdir(cand)
            and os.access(cand, os.W_OK)
            and not fs_type(cand).startswith("tmpfs")
        ):
            return os.path.join(cand, "sluice-gpu-data")
    return "/tmp/sluice-gpu-data"


DATA = pick_data_dir()
shutil.rmtree(DATA, ignore_errors=True)
os.makedirs(DATA, exist_ok=True)
RESULTS["info"]["data_dir"] = DATA
RESULTS["info"]["data_fs"] = fs_type(DATA)
with contextlib.suppress(OSError):
    RESULTS["info"]["data_disk_free_gib"] = round(shutil.disk_usage(DATA).free / 2**30, 1)

BIG = os.path.join(DATA, "big.safetensors")
SHARDS = os.path.join(DATA, "sharded")
INDEX = os.path.join(SHARDS, "model.safetensors.index.json")
UNALIGNED = os.path.join(DATA, "unaligned.safetensors")
HAS_F8 = hasattr(torch, "float8_e4m3fn")
HAS_F8_E5 = hasattr(torch, "float8_e5m2")


def make_big() -> dict:
    g = torch.Generator().manual_seed(1234)
    tensors: dict[str, torch.Tensor] = {}
    # small / edge tensors
    tensors["edge.empty_f32"] = torch.empty((0, 16), dtype=torch.float32)
    tensors["edge.empty_bf16"] = torch.empty((4, 0), dtype=torch.bfloat16)
    tensors["edge.scalar_f32"] = torch.tensor(3.25, dtype=torch.float32)
    tensors["edge.scalar_i64"] = torch.tensor(-(2**40) - 7, dtype=torch.int64)
    tensors["edge.mask"] = torch.rand(1000, generator=g) > 0.5
    tensors["edge.i8"] = torch.randint(-128, 128, (333, 7), dtype=torch.int8, generator=g)
    tensors["edge.i64"] = torch.randint(-(2**62), 2**62, (1001,), dtype=torch.int64, generator=g)
    tensors["edge.f16_odd"] = torch.randn(3, 5, 7, generator=g).to(torch.float16)
    if HAS_F8:
        tensors["edge.f8_e4m3"] = (
            (torch.randn(257, 33, generator=g) * 4).clamp(-440, 440).to(torch.float8_e4m3fn)
        )
    if HAS_F8_E5:
        tensors["edge.f8_e5m2"] = torch.randn(100, 3, generator=g).to(torch.float8_e5m2)
    # 2-D tensors for slicing
    tensors["slice.w_bf16"] = torch.randn(1024, 768, generator=g).to(torch.bfloat16)
    tensors["slice.w_f32"] = torch.randn(513, 257, generator=g)
    # bulk: mixed dtypes, up to the target size
    target = SIZE_MIB * 2**20
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    # one large tensor (128 MiB at 1 GiB scale) to cover a tensor larger than a window
    big_rows = max(1, (target // 8) // (4096 * 4))
    tensors["bulk.big_f32"] = torch.randn(big_rows, 4096, generator=g)
    total += big_rows * 4096 * 4
    dtypes = [torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.int64, torch.bool]
    if HAS_F8:
        dtypes.append(torch.float8_e4m3fn)
    i = 0
    while total < target:
        dt = dtypes[i % len(dtypes)]
        elem = torch.empty((), dtype=dt).element_size()
        nbytes = min(16 * 2**20 + 4096 * (i % 5), target - total)
        n = max(1, nbytes // elem)
        cols = 1024
        rows = max(1, n // cols)
        shape = (rows, cols)
        if dt == torch.bool:
            t = torch.rand(shape, generator=g) > 0.5
        elif dt in (torch.int8, torch.int64):
            info = torch.iinfo(dt)
            t = torch.randint(
                max(info.min, -(2**62)), min(info.max, 2**62), shape, dtype=dt, generator=g
            )
        elif HAS_F8 and dt == torch.float8_e4m3fn:
            t = (torch.randn(shape, generator=g) * 8).clamp(-440, 440).to(dt)
        else:
            t = torch.randn(shape, generator=g).to(dt)
        tensors[f"bulk.layer{i:03d}.{str(dt).split('.')[-1]}"] = t
        total += t.numel() * t.element_size()
        i += 1
    st.save_file(tensors, BIG, metadata={"format": "pt", "made_by": "gpu-check"})
    return {"tensors": len(tensors), "bytes": os.path.getsize(BIG)}


def make_shards() -> dict:
    g = torch.Generator().manual_seed(99)
    os.makedirs(SHARDS, exist_ok=True)
    weight_map = {}
    total = 0
    for s in range(3):
        tensors = {}
        for j in range(4):
            name = f"model.layers.{s * 4 + j}.weight"
            dt = [torch.bfloat16, torch.float16, torch.float32, torch.int8][j]
            if dt == torch.int8:
                t = torch.randint(-128, 128, (512, 1000), dtype=dt, generator=g)
            else:
                t = torch.randn(512 + s, 1000, generator=g).to(dt)
            tensors[name] = t
            total += t.numel() * t.element_size()
        if s == 0:
            tensors["model.embed.weight"] = torch.randn(4096, 512, generator=g).to(torch.bfloat16)
            total += 4096 * 512 * 2
        if s == 2:
            tensors["lm_head.bias"] = torch.zeros(0, dtype=torch.float32)
        fname = f"model-{s + 1:05d}-of-00003.safetensors"
        st.save_file(tensors, os.path.join(SHARDS, fname), metadata={"format": "pt"})
        for name in tensors:
            weight_map[name] = fname
    with open(INDEX, "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    return {"files": sorted(os.listdir(SHARDS)), "bytes": total}


def make_unaligned() -> dict:
    """Hand-written file: a 3-byte U8 tensor, then F32 / I64 / BF16 at unaligned offsets."""
    a = np.arange(3, dtype=np.uint8)
    b = np.arange(10, dtype=np.float32) * 1.5
    c = np.arange(-5, 6, dtype=np.int64)
    d = np.arange(9, dtype=np.float32).astype(np.float32).view(np.uint32)
    d = (d >> 16).astype(np.uint16)  # bf16 bit patterns
    parts = [
        ("a_u8", "U8", [3], a.tobytes()),
        ("b_f32", "F32", [2, 5], b.tobytes()),
        ("c_i64", "I64", [11], c.tobytes()),
        ("d_bf16", "BF16", [3, 3], d.tobytes()),
    ]
    header, off, blob = {}, 0, b""
    for name, dt, shape, raw in parts:
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        blob += raw
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * ((8 - len(hj) % 8) % 8)
    with open(UNALIGNED, "wb") as f:
        f.write(struct.pack("<Q", len(hj)) + hj + blob)
    return {"offsets": {n: h["data_offsets"] for n, h in header.items()}}


# --------------------------------------------------------------------------- helpers
def as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def compare_dicts(got: dict, ref: dict, expect_device: torch.device) -> dict:
    """Asserts keys, dtype, shape, device and bytes all match."""
    assert isinstance(got, dict), f"got {type(got)}"
    missing = sorted(set(ref) - set(got))
    extra = sorted(set(got) - set(ref))
    assert not missing and not extra, f"key mismatch: missing={missing[:5]} extra={extra[:5]}"
    bad = []
    for k, r in ref.items():
        err = compare_tensor(got[k], r, expect_device)
        if err:
            bad.append(f"{k}: {err}")
    assert not bad, f"{len(bad)} tensors differ: {bad[:5]}"
    return {"tensors": len(ref)}


def compare_tensor(g, r: torch.Tensor, expect_device: torch.device):
    if not isinstance(g, torch.Tensor):
        return f"not a tensor: {type(g)}"
    if g.dtype != r.dtype:
        return f"dtype {g.dtype} != {r.dtype}"
    if tuple(g.shape) != tuple(r.shape):
        return f"shape {tuple(g.shape)} != {tuple(r.shape)}"
    if not same_device(g.device, expect_device):
        return f"device {g.device} != {expect_device}"
    rr = r.to(g.device) if g.device != r.device else r
    if g.numel() == 0:
        return None
    if not torch.equal(as_bytes(g), as_bytes(rr)):
        return "bytes differ"
    f8 = [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)]
    no_nan = not (g.is_floating_point() and torch.isnan(g).any())
    if g.dtype not in f8 and no_nan and not torch.equal(g, rr):
        return "torch.equal False (bytes equal!)"
    return None


def settled(got: dict, ref: dict, stats: bool = False) -> dict:
    """Waits for the device, compares ``got`` with ``ref`` (:func:`compare_dicts`), adds the
    load's stats when asked, and frees ``got``'s device memory."""
    sync()
    out = compare_dicts(got, ref, DEV)
    if stats:
        out["stats"] = stats_summary()
    got.clear()
    free_cuda()
    return out


def same_device(a: torch.device, b: torch.device) -> bool:
    a, b = torch.device(a), torch.device(b)
    if a.type != b.type:
        return False
    if a.type == "cuda":
        return (a.index or 0) == (b.index or 0) and a.index is not None
    return True


def free_cuda():
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def stats_summary():
    s = sluice.last_load_stats()
    if not s:
        return s
    return {
        k: s.get(k)
        for k in (
            "engine",
            "io_mode",
            "tensors",
            "tensor_bytes",
            "read_bytes",
            "mapped_bytes",
            "windows",
            "seconds",
            "gb_per_s",
            "peak_pool_bytes",
        )
    } | {
        "files_direct": [f.get("direct") for f in s.get("files", [])][:4],
        "buffered_reason": [f.get("buffered_reason") for f in s.get("files", [])][:4],
    }


# --------------------------------------------------------------------------- setup
REF: dict = {}
REF_SHARDS: dict = {}
REF_UNALIGNED: dict = {}


@check("setup.make_big")
def _():
    return make_big()


@check("setup.make_shards")
def _():
    return make_shards()


@check("setup.make_unaligned")
def _():
    return make_unaligned()


@check("setup.reference_load")
def _():
    REF.update(st.load_file(BIG, device=REF_DEVICE))
    for f in sorted(os.listdir(SHARDS)):
        if f.endswith(".safetensors"):
            REF_SHARDS.update(st.load_file(os.path.join(SHARDS, f), device=REF_DEVICE))
    try:
        REF_UNALIGNED.update(st.load_file(UNALIGNED, device=REF_DEVICE))
        how = "safetensors"
    except Exception as e:  # build the expected tensors by hand
        how = f"by hand (safetensors refused: {type(e).__name__}: {e})"
        with open(UNALIGNED, "rb") as f:
            raw = f.read()
        n = struct.unpack("<Q", raw[:8])[0]
        hdr = json.loads(raw[8 : 8 + n])
        data = raw[8 + n :]
        tdt = {"U8": torch.uint8, "F32": torch.float32, "I64": torch.int64, "BF16": torch.bfloat16}
        for k, h in hdr.items():
            lo, hi = h["data_offsets"]
            buf = bytearray(data[lo:hi])
            REF_UNALIGNED[k] = (
                torch.frombuffer(buf, dtype=tdt[h["dtype"]]).reshape(h["shape"]).to(REF_DEVICE)
            )
    if CPU_MODE:  # release safetensors' mmaps so the page cache can be dropped
        for d in (REF, REF_SHARDS, REF_UNALIGNED):
            d.update({k: v.clone() for k, v in d.items()})
    sync()
    return {
        "big": len(REF),
        "shards": len(REF_SHARDS),
        "unaligned": how,
        "dtypes": sorted({str(t.dtype) for t in REF.values()}),
    }


# --------------------------------------------------------------------------- load_file
for variant in DEVICE_VARIANTS:

    @check(f"load_file.big.device={variant!r}")
    def _(variant=variant):
        got = sluice.load_file(BIG, device=variant)
        return settled(got, REF, stats=True)


@check("load_file.big.device=torch.device('cuda',0)" if not CPU_MODE else "load_file.big.torchdev")
def _():
    got = sluice.load_file(BIG, device=DEV)
    return settled(got, REF)


for opts in (
    {"direct": "on"},
    {"direct": "off"},
    {"engine": "threads"},
    # the limit must hold two neighbouring windows: the largest tensor is SIZE/8
    {"memory_limit": f"{SIZE_MIB // 4 + 32}MiB", "chunk_bytes": "1MiB"},
):

    @check(f"load_file.big.cuda0.{'_'.join(f'{k}={v}' for k, v in opts.items())}")
    def _(opts=opts):
        got = sluice.load_file(BIG, device=REF_DEVICE, **opts)
        return settled(got, REF, stats=True)


@check("load_file.names_filter.cuda0")
def _():
    want = {k: v for k, v in REF.items() if k.startswith("edge.")}
    got = sluice.load_file(BIG, device=REF_DEVICE, names=lambda n: n.startswith("edge."))
    sync()
    return compare_dicts(got, want, DEV)


for label, path in (("dir", SHARDS), ("index", INDEX)):
    for variant in DEVICE_VARIANTS:

        @check(f"load_file.shards.{label}.device={variant!r}")
        def _(path=path, variant=variant):
            got = sluice.load_file(path, device=variant)
            sync()
            return compare_dicts(got, REF_SHARDS, DEV)


@check("load_file.unaligned.cuda0")
def _():
    got = sluice.load_file(UNALIGNED, device=REF_DEVICE)
    sync()
    return compare_dicts(got, REF_UNALIGNED, DEV)


# --------------------------------------------------------------------------- stream
@check("stream.big.cuda0")
def _():
    got = {}
    order = []
    for name, t in sluice.stream(BIG, device=REF_DEVICE):
        assert name not in got, f"duplicate {name}"
        got[name] = t
        order.append(name)
    return settled(got, REF, stats=True)


@check("stream.big.device=0.memory_limit=300MiB")
def _():
    got = dict(sluice.stream(BIG, device=DEVICE_VARIANTS[2], memory_limit="300MiB"))
    return settled(got, REF)


@check("stream.shards.index.cuda")
def _():
    got = dict(sluice.stream(INDEX, device=DEVICE_VARIANTS[0]))
    sync()
    return compare_dicts(got, REF_SHARDS, DEV)


@check("stream.unaligned.cuda0")
def _():
    got = dict(sluice.stream(UNALIGNED, device=REF_DEVICE))
    sync()
    return compare_dicts(got, REF_UNALIGNED, DEV)


# ---------------------------------------------------------------- pinned path (issue 29)
@check("pinned.runtime")
def _():
    from sluice import _sluice

    rt = _sluice.gpu_runtime()
    assert CPU_MODE or rt is not None, "no CUDA runtime found to pin the read buffers"
    return {"runtime": rt}


@check("stream.big.cuda0.kernels_queued_before_any_sync")
def _():
    # A kernel queued on the current stream right after each tensor is yielded must see its
    # bytes (the copy is ordered before it), over many windows reusing pinned buffers.
    bad = []
    for rnd in range(3):
        sums = {}
        for name, t in sluice.stream(BIG, device=REF_DEVICE, memory_limit="300MiB"):
            sums[name] = as_bytes(t).to(torch.int64).sum()  # queued, not waited for
        sync()
        for name, total in sums.items():
            want = int(as_bytes(REF[name]).to(torch.int64).sum())
            if int(total) != want:
                bad.append((rnd, name))
    assert not bad, f"kernels saw wrong bytes: {bad[:5]}"
    return {"rounds": 3, "tensors": len(REF)}


def kv_round_trips(block: int, rounds: int, count, put, get) -> list:
    """Blocks written by kernels just before ``put`` (its copies come after them on the
    stream), read back by ``get`` and summed by kernels queued before any sync; the
    (round, block) pairs that came back wrong."""
    import tempfile

    import sluice.kv

    bad = []
    words = block // 4
    with (
        tempfile.TemporaryDirectory(dir=pick_data_dir()) as d,
        sluice.kv.open(d, block_bytes=block, ssd="256MiB") as store,
    ):
        for rnd in range(rounds):
            n = count(rnd)
            src = [torch.full((words,), rnd * 1000 + i, dtype=torch.int32, device=DEV)
                   for i in range(n)]  # fmt: skip
            keys = [f"{block}-{rnd}-{i}".encode() for i in range(n)]
            assert all(put(store, keys, src)), f"round {rnd}: put refused"
            out = [torch.zeros_like(t) for t in src]
            assert all(get(store, keys, out)), f"round {rnd}: a miss"
            sums = [t.to(torch.int64).sum() for t in out]  # queued, not waited for
            sync()
            bad += [(rnd, i) for i, s_ in enumerate(sums) if int(s_) != (rnd * 1000 + i) * words]
    return bad


@check("kv.cuda_blocks.ordered_round_trips")
def _():
    bad = kv_round_trips(
        64 << 10,
        20,
        lambda rnd: 1 + rnd * 37 % 300,  # up to 300 blocks of 64 KiB: several 8 MiB slots
        lambda store, keys, src: store.put_batch(keys, src),
        lambda store, keys, out: store.get_batch_into(keys, out),
    )
    assert not bad, f"wrong blocks: {bad[:5]}"
    return {"rounds": 20}


@check("load_into.big.cuda_params")
def _():
    dest = {k: torch.zeros_like(v, device=DEV) for k, v in REF.items()}
    sluice.load_into(BIG, dest)
    return settled(dest, REF)


@check("safe_open.big.cuda0.get_tensor_every_dtype")
def _():
    # get_tensor on CUDA reads through two pinned windows of the process's budget.
    with sluice.safe_open(BIG, "pt", device=REF_DEVICE) as f:
        got = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    out = compare_dicts(got, REF, DEV)
    from sluice import _pinned

    st_ = _pinned.pinned_stats()
    assert st_["held_bytes"] == 0, f"windows not given back: {st_}"
    out["pinned"] = st_
    del got
    free_cuda()
    return out


@check("pinned.budget_memory_is_pinned_for_torch")
def _():
    # torch must see the budget's cudaHostRegister'd memory as pinned, or its non_blocking
    # copies from it would be synchronous.
    from sluice import _pinned

    buf = _pinned.take(8 << 20, "gpu check")
    assert buf is not None, "the default budget refused 8 MiB"
    try:
        t = buf.tensor()
        pinned = bool(t.is_pinned()) if torch.cuda.is_available() else None
        assert CPU_MODE or pinned, "torch does not see the budget's memory as pinned"
        t.fill_(7)
        if not CPU_MODE:
            d = torch.empty(8 << 20, dtype=torch.uint8, device=DEV)
            d.copy_(t, non_blocking=True)
            sync()
            assert int(d.sum()) == 7 * (8 << 20)
    finally:
        buf.release()
    return {"is_pinned": pinned, "stats": _pinned.pinned_stats()}


@check("kv.cuda_blocks.submit_round_trips")
def _():
    bad = kv_round_trips(
        16 << 10,
        10,
        lambda rnd: 50 + rnd * 97 % 700,  # 16 KiB blocks: up to 2 slots of 512
        lambda store, keys, src: store.submit_put(keys, src).wait(60),
        lambda store, keys, out: store.submit_get(keys, out).wait(60),
    )
    assert not bad, f"wrong blocks: {bad[:5]}"
    return {"rounds": 10}


@check("stream.cuda0.file_truncated_mid_load_is_a_typed_error")
def _():
    # The file is cut to half while a load is part-way: a typed error naming it, not zeros.
    cut = os.path.join(DATA, "cut.safetensors")
    shutil.copyfile(BIG, cut)
    got = 0
    try:
        for _name, _t in sluice.stream(cut, device=REF_DEVICE, memory_limit="64MiB"):
            got += 1
            if got == 2:
                os.truncate(cut, os.path.getsize(cut) // 2)
        raise AssertionError(f"the whole load passed after a truncation ({got} tensors)")
    except sluice.SluiceError as e:
        assert "cut.safetensors" in str(e), f"the error does not name the file: {e}"
        return {"error": f"{type(e).__name__}: {str(e)[:200]}", "tensors_before": got}
    finally:
        os.unlink(cut)
        sync()


@check("gds.status")
def _():
    # GPUDirect Storage through kvikio, where installed: whether cuFile reads straight to
    # the GPU here (not compat mode), and its warm read of BIG next to Sluice's.
    try:
        import kvikio
        import kvikio.defaults
    except ImportError as e:
        return {
            "kvikio": f"not installed ({e})",
            "nvidia_fs": os.path.exists("/proc/driver/nvidia-fs"),
        }
    info: dict = {"kvikio": getattr(kvikio, "__version__", "?"),
                  "nvidia_fs": os.path.exists("/proc/driver/nvidia-fs")}  # fmt: skip
    try:
        info["compat_mode"] = str(kvikio.defaults.compat_mode())
    except Exception as e:
        info["compat_mode"] = f"{type(e).__name__}: {e}"
    if CPU_MODE:
        return info
    size = os.path.getsize(BIG)
    buf = torch.empty(size, dtype=torch.uint8, device=DEV)
    times = []
    for _ in range(3):
        sync()
        t = time.perf_counter()
        with kvikio.CuFile(BIG, "r") as f:
            n = f.read(buf)
        sync()
        times.append(time.perf_counter() - t)
    info["kvikio_read_warm_GB_per_s"] = round(size / statistics.median(times) / 1e9, 2)
    info["bytes_read"] = n
    del buf
    free_cuda()
    return info


@check("stream.early_close.cuda0")
def _():
    gen = sluice.stream(BIG, device=REF_DEVICE)
    for n, (_name, _t) in enumerate(gen, start=1):
        if n == 3:
            break
    gen.close()
    # a fresh load after an abandoned one must still work
    got = sluice.load_file(BIG, device=REF_DEVICE, names=lambda k: k.startswith("edge."))
    want = {k: v for k, v in REF.items() if k.startswith("edge.")}
    return compare_dicts(got, want, DEV)


# --------------------------------------------------------------------------- safe_open
def slice_cases(ref_slice, shape):
    _rows, _cols = shape
    return {
        "rows[3:17]": (slice(3, 17),),
        "rows[-5:]": (slice(-5, None),),
        "cols[:, 100:300]": (slice(None), slice(100, 300)),
        "block[10:50, 7:99]": (slice(10, 50), slice(7, 99)),
        "step[1:200:7, ::3]": (slice(1, 200, 7), slice(None, None, 3)),
        "int_row[5]": (5,),
        "neg_int[-1, 2:9]": (-1, slice(2, 9)),
        "ellipsis[..., 4]": (Ellipsis, 4),
        "empty[5:5]": (slice(5, 5),),
    }


for label, path, refd in (("big", BIG, REF), ("shards", SHARDS, REF_SHARDS)):
    for variant in DEVICE_VARIANTS if label == "big" else [REF_DEVICE]:

        @check(f"safe_open.{label}.device={variant!r}.keys_get_tensor")
        def _(path=path, refd=refd, variant=variant):
            with sluice.safe_open(path, framework="pt", device=variant) as f:
                keys = f.keys()
                assert sorted(keys) == sorted(refd), "keys differ"
                assert keys == sorted(keys), "keys() not sorted (safetensors sorts)"
                got = {k: f.get_tensor(k) for k in keys}
                md = f.metadata()
            sync()
            out = compare_dicts(got, refd, DEV)
            out["metadata"] = md
            return out

    @check(f"safe_open.{label}.cuda0.get_tensors")
    def _(path=path, refd=refd):
        with sluice.safe_open(path, framework="pt", device=REF_DEVICE) as f:
            assert hasattr(f, "get_tensors"), "no get_tensors"
            got = f.get_tensors()
        sync()
        out = compare_dicts(got, refd, DEV)
        del got
        free_cuda()
        return out


@check("safe_open.big.cuda0.get_slice_vs_safetensors")
def _():
    results = {}
    bad = []
    with (
        sluice.safe_open(BIG, framework="pt", device=REF_DEVICE) as f,
        st_safe_open(BIG, framework="pt", device=REF_DEVICE) as r,
    ):
        for name in ("slice.w_bf16", "slice.w_f32"):
            s_sl = f.get_slice(name)
            r_sl = r.get_slice(name)
            assert list(s_sl.get_shape()) == list(r_sl.get_shape()), "get_shape differs"
            assert s_sl.get_dtype() == r_sl.get_dtype(), (
                f"get_dtype {s_sl.get_dtype()} != {r_sl.get_dtype()}"
            )
            for cname, idx in slice_cases(r_sl, s_sl.get_shape()).items():
                key = f"{name}{cname}"
                try:
                    ref_t = r_sl[idx]
                except Exception as e:  # safetensors may not support an index form
                    ref_t = REF[name][idx]
                    results[key] = f"ref from torch indexing (safetensors: {type(e).__name__})"
                got_t = s_sl[idx]
                err = compare_tensor(got_t, ref_t, DEV)
                if err:
                    bad.append(f"{key}: {err}")
                else:
                    results.setdefault(key, "ok")
    sync()
    assert not bad, f"slices differ: {bad}"
    return results


@check("safe_open.unaligned.cuda0.get_tensor_and_slice")
def _():
    with sluice.safe_open(UNALIGNED, framework="pt", device=REF_DEVICE) as f:
        got = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118  # noqa: SIM118 (safe_open has no __iter__)
        sl = f.get_slice("b_f32")[1:, 1:4]
    sync()
    out = compare_dicts(got, REF_UNALIGNED, DEV)
    err = compare_tensor(sl, REF_UNALIGNED["b_f32"][1:, 1:4], DEV)
    assert not err, f"slice: {err}"
    return out


# --------------------------------------------------------------------------- bad input
def try_call(fn) -> dict:
    t = time.perf_counter()
    try:
        r = fn()
        if isinstance(r, dict):
            r = {"dict_len": len(r), "devices": sorted({str(v.device) for v in r.values()})[:3]}
        elif isinstance(r, torch.Tensor):
            r = {"tensor_device": str(r.device)}
        else:
            r = repr(r)[:200]
        return {"raised": False, "returned": r, "seconds": round(time.perf_counter() - t, 3)}
    except Exception as e:
        return {
            "raised": True,
            "is_sluice_ConfigError": isinstance(e, sluice.ConfigError),
            "is_ValueError": isinstance(e, ValueError),
            "is_RuntimeError": isinstance(e, RuntimeError),
            "seconds": round(time.perf_counter() - t, 3),
            **exc_info(e),
        }


BAD_DEVICES = ["cuda:7", "cuda:-1", "tpu", 7, -1, "cuda:0:1", "CUDA"]

for bad in BAD_DEVICES:

    @check(f"bad_device.{bad!r}")
    def _(bad=bad):
        small = os.path.join(SHARDS, "model-00003-of-00003.safetensors")
        out = {
            "sluice.load_file": try_call(lambda: sluice.load_file(small, device=bad)),
            "sluice.stream": try_call(lambda: dict(sluice.stream(small, device=bad))),
        }

        def so():
            with sluice.safe_open(small, framework="pt", device=bad) as f:
                return f.get_tensor(f.keys()[0])

        def so_ctor():
            f = sluice.safe_open(small, framework="pt", device=bad)
            f.close()
            return "constructed"

        out["sluice.safe_open(ctor only)"] = try_call(so_ctor)
        out["sluice.safe_open.get_tensor"] = try_call(so)
        out["safetensors.load_file (reference)"] = try_call(lambda: st.load_file(small, device=bad))

        def st_so():
            with st_safe_open(small, framework="pt", device=bad) as f:
                return f.get_tensor(next(iter(f.keys())))

        out["safetensors.safe_open.get_tensor (reference)"] = try_call(st_so)
        # the loader must still work afterwards
        got = sluice.load_file(small, device=REF_DEVICE)
        want = st.load_file(small, device=REF_DEVICE)
        compare_dicts(got, want, DEV)
        out["after: load_file still works"] = True
        s = out["sluice.load_file"]
        assert s["raised"], f"sluice.load_file accepted device {bad!r}: {s}"
        return out


# --------------------------------------------------------------------------- timing
def cached_mib() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("Cached:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        pass
    return -1


def drop_caches() -> str:
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "ok"
    except Exception as e:
        return f"{type(e).__name__}: {e}"


def timed_load(kind: str) -> float:
    sync()
    t = time.perf_counter()
    if kind == "sluice":
        d = sluice.load_file(BIG, device=REF_DEVICE)
    else:
        d = st.load_file(BIG, device=REF_DEVICE)
    sync()
    dt = time.perf_counter() - t
    del d
    free_cuda()
    return dt


@check("timing.load_file_big")
def _():
    size = os.path.getsize(BIG)
    res: dict = {"bytes": size, "device": str(DEV)}
    before = cached_mib()
    dc = drop_caches()
    res["drop_caches"] = dc
    res["meminfo_Cached_MiB_before_after_first_drop"] = [before, cached_mib()]
    cold = {"sluice": [], "safetensors": []}
    stats_cold = []
    for _i in range(3):
        for kind in ("sluice", "safetensors"):
            if dc == "ok":
                drop_caches()
            cold[kind].append(timed_load(kind))
            if kind == "sluice":
                stats_cold.append(stats_summary())
    warm = {"sluice": [], "safetensors": []}
    timed_load("sluice")  # make sure the file is cached
    stats_warm = []
    for _i in range(3):
        for kind in ("sluice", "safetensors"):
            warm[kind].append(timed_load(kind))
            if kind == "sluice":
                stats_warm.append(stats_summary())
    for label, runs in (("cold" if dc == "ok" else "cold_no_drop", cold), ("warm", warm)):
        for kind, ts in runs.items():
            med = statistics.median(ts)
            res[f"{label}.{kind}"] = {
                "runs_s": [round(x, 3) for x in ts],
                "median_s": round(med, 3),
                "GB_per_s": round(size / med / 1e9, 2),
            }
    res["sluice_stats_cold_runs"] = [
        {
            k: (s or {}).get(k)
            for k in (
                "io_mode",
                "engine",
                "read_bytes",
                "mapped_bytes",
                "gb_per_s",
                "buffered_reason",
                "files_direct",
            )
        }
        for s in stats_cold
    ]
    res["sluice_stats_warm_last"] = stats_warm[-1] if stats_warm else None
    RESULTS["timings"] = res
    return None


def gbps(nbytes: int, fn, rounds: int = 5) -> dict:
    ts = []
    for _ in range(rounds):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        ts.append(time.perf_counter() - t)
    med = statistics.median(ts)
    return {
        "GB_per_s": round(nbytes / med / 1e9, 2),
        "range_s": [round(min(ts), 4), round(max(ts), 4)],
    }


def kv_rates(block: int, total: int) -> dict:
    import tempfile

    import sluice.kv

    count = total // block
    src = [torch.randint(0, 255, (block,), dtype=torch.uint8, device=DEV) for _ in range(count)]
    out = [torch.empty_like(t) for t in src]
    keys = [f"b{block}-{i}".encode() for i in range(count)]
    k = f"{block >> 10}KiB"
    res = {}
    with (
        tempfile.TemporaryDirectory(dir=pick_data_dir()) as d,
        sluice.kv.open(
            d, block_bytes=block, dram=2 * total, ssd=2 * total, write_mode="write-back"
        ) as store,
    ):
        rounds = iter(range(100))

        def put_fresh() -> None:  # new keys each round: a stored key's put is a no-op
            r = next(rounds)
            fresh = [b"r%d-" % r + key for key in keys0]
            store.put_batch(fresh, src)
            keys[:] = fresh

        keys0 = list(keys)
        res[f"kv_put_{k}"] = gbps(total, put_fresh, 3)
        res[f"kv_get_{k}"] = gbps(total, lambda: store.get_batch_into(keys, out), 3)
        assert all(torch.equal(a, b) for a, b in zip(src, out)), f"{block}: wrong bytes"
        res[f"loop_to_cpu_{k}"] = gbps(total, lambda: [t.to("cpu") for t in src], 3)
    return res


@check("timing.pinned_vs_pageable_and_kv")
def _():
    # The targets' yardsticks in the same run: torch's pinned and pageable host-to-device
    # bandwidth, and KV blocks between HBM and Sluice's DRAM tier (2 MiB, 128 KiB, 16 KiB)
    # against a loop of per-block tensor.to() copies.
    res: dict = {}
    n = 1 << 30 if not CPU_MODE else 64 << 20
    host = {
        "pinned": torch.empty(n, dtype=torch.uint8, pin_memory=torch.cuda.is_available()),
        "pageable": torch.empty(n, dtype=torch.uint8),
    }
    dev = torch.empty(n, dtype=torch.uint8, device=DEV)
    res["torch_h2d_pinned"] = gbps(n, lambda: dev.copy_(host["pinned"], non_blocking=True))
    res["torch_d2h_pinned"] = gbps(n, lambda: host["pinned"].copy_(dev, non_blocking=True))
    res["torch_h2d_pageable"] = gbps(n, lambda: dev.copy_(host["pageable"]))
    host.clear()
    dev = None
    total = 512 << 20 if not CPU_MODE else 32 << 20
    for block in (2 << 20, 128 << 10, 16 << 10):
        res.update(kv_rates(block, total))
        free_cuda()
    RESULTS["timings"]["pinned_vs_pageable_and_kv"] = res
    return res


# --------------------------------------------------------------------------- summary
try:
    RESULTS["info"]["nvidia_smi"] = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        timeout=20,
    ).stdout.strip()
except Exception as e:
    RESULTS["info"]["nvidia_smi"] = f"{type(e).__name__}: {e}"
RESULTS["info"]["kernel"] = platform.release()
counts: dict = {}
for c in RESULTS["checks"].values():
    counts[c["status"]] = counts.get(c["status"], 0) + 1
RESULTS["summary"] = {
    **counts,
    "total": len(RESULTS["checks"]),
    "failed": [k for k, c in RESULTS["checks"].items() if c["status"] != "pass"],
    "runtime_s": round(time.perf_counter() - T0, 1),
}
text = json.dumps(RESULTS, indent=1, default=str)
print(text, flush=True)
out_dir = os.environ.get("OUT")
if out_dir:
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "gpu_check.json"), "w") as f:
        f.write(text)
if not os.environ.get("GPU_CHECK_KEEP_DATA"):
    shutil.rmtree(DATA, ignore_errors=True)
