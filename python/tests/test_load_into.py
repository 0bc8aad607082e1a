"""`sluice.load_into`: a checkpoint read into tensors that already exist (a model's
parameters), bit-exact for every dtype, with `load_state_dict`'s strictness and
conversions, and every refusal made before a byte is written."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import numpy as np
import pytest
import sluice
import torch
from conftest import TORCH_DTYPES, assert_same_tensors, random_tensor, write_sharded
from safetensors.torch import load_file as st_load_file
from safetensors.torch import save_file
from sluice.errors import ConfigError, HeaderError, SluiceFileNotFoundError, TensorNotFoundError


def zeros_like(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: torch.zeros_like(v) for k, v in tensors.items()}


@pytest.fixture
def every_dtype(tmp_path, gen):
    """Every dtype, odd sizes, an empty tensor and a 9 MiB one (read straight into its
    destination in several chunks; the small ones are gathered)."""
    tensors = {f"t.{n}": random_tensor(d, (37, 129), gen) for n, d in TORCH_DTYPES.items()}
    tensors["big"] = random_tensor(torch.float32, (9 << 18, 1), gen)
    tensors["empty"] = torch.empty(0, 3)
    tensors["scalar"] = random_tensor(torch.float64, (), gen)
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path))
    return path, tensors


def test_every_dtype_lands_bit_exact_in_place(every_dtype):
    path, want = every_dtype
    dest = zeros_like(want)
    pointers = {k: v.data_ptr() for k, v in dest.items()}
    result = sluice.load_into(path, dest, chunk_bytes="1MiB")
    assert result == sluice.torch.IncompatibleKeys([], [])
    assert_same_tensors(dest, want)
    # In place: the destinations are the same tensors, not replaced.
    assert {k: v.data_ptr() for k, v in dest.items()} == pointers
    stats = sluice.last_load_stats()
    assert stats["tensors"] == len(want)
    assert stats["tensor_bytes"] == sum(v.numel() * v.element_size() for v in want.values())


def test_a_module_is_filled_through_its_state_dict(tmp_path, gen):
    model = torch.nn.Sequential(torch.nn.Linear(300, 200), torch.nn.LayerNorm(200))
    want = {k: random_tensor(v.dtype, tuple(v.shape), gen) for k, v in model.state_dict().items()}
    save_file(want, str(tmp_path / "m.safetensors"))
    assert sluice.load_into(tmp_path / "m.safetensors", model) == ([], [])
    assert_same_tensors(model.state_dict(), want)
    assert model[0].weight.requires_grad  # still a parameter, only its data changed


def test_a_sharded_index_with_a_small_memory_limit(tmp_path, gen):
    shards = {
        f"model-{i:05d}-of-00003.safetensors": {
            f"layer{i}.{j}": random_tensor(torch.bfloat16, (256 + i, 1000 + j), gen)
            for j in range(4)
        }
        for i in range(3)
    }
    index = write_sharded(tmp_path / "m", shards)
    want = {k: v for s in shards.values() for k, v in s.items()}
    dest = zeros_like(want)
    seen = []
    sluice.load_into(index, dest, memory_limit="2MiB", on_progress=lambda d, t: seen.append((d, t)))
    assert_same_tensors(dest, want)
    total = sum(v.numel() * v.element_size() for v in want.values())
    assert seen and seen[-1] == (total, total)
    assert all(a[0] <= b[0] for a, b in zip(seen, seen[1:]))


def test_strict_refuses_missing_and_unexpected_names_before_reading(mixed_file):
    path, want = mixed_file
    dest = zeros_like(want)
    del dest["embed"]
    dest["not.in.file"] = torch.zeros(3)
    with pytest.raises(TensorNotFoundError, match=r"not\.in\.file") as e:
        sluice.load_into(path, dest)
    assert "embed" in str(e.value) and str(path) in str(e.value)
    assert all(not v.any() for v in dest.values()), "nothing may be written"


def test_non_strict_loads_the_common_names_and_reports_the_rest(mixed_file):
    path, want = mixed_file
    dest = zeros_like(want)
    del dest["embed"]
    dest["not.in.file"] = torch.zeros(3)
    result = sluice.load_into(path, dest, strict=False)
    assert result.missing_keys == ["not.in.file"]
    assert result.unexpected_keys == ["embed"]
    assert not dest["not.in.file"].any()
    del dest["not.in.file"]
    assert_same_tensors(dest, {k: v for k, v in want.items() if k != "embed"})


def test_a_shape_mismatch_names_the_tensor_and_writes_nothing(mixed_file):
    path, want = mixed_file
    dest = zeros_like(want)
    dest["layer.0.w"] = torch.zeros(1001, 300)
    with pytest.raises(ConfigError, match=r"layer\.0\.w.*\[1001, 300\].*\[300, 1001\]"):
        sluice.load_into(path, dest)
    assert all(not v.any() for v in dest.values())


def test_other_dtypes_and_layouts_are_converted_as_load_state_dict_does(mixed_file):
    path, want = mixed_file
    dest = zeros_like(want)
    dest["layer.0.w"] = torch.zeros(300, 1001, dtype=torch.float64)  # converted
    dest["embed"] = torch.zeros(1024, 512, dtype=torch.bfloat16).t()  # not contiguous
    wide = torch.zeros(3 * 4097, dtype=torch.int64)
    dest["layer.1.w"] = wide[4097 : 2 * 4097]  # contiguous, inside a bigger storage
    sluice.load_into(path, dest)
    exact = {"rtol": 0, "atol": 0, "equal_nan": True}
    torch.testing.assert_close(dest["layer.0.w"], want["layer.0.w"].to(torch.float64), **exact)
    assert torch.equal(dest["embed"].view(torch.int16), want["embed"].view(torch.int16))
    assert torch.equal(dest["layer.1.w"], want["layer.1.w"])
    assert not wide[:4097].any() and not wide[2 * 4097 :].any()
    assert_same_tensors(
        {k: dest[k] for k in ("layer.0.b", "flag", "scale")},
        {k: want[k] for k in ("layer.0.b", "flag", "scale")},
    )


def test_tied_destinations_are_read_once_and_overlaps_refused(tmp_path, gen):
    shared = random_tensor(torch.float32, (64, 32), gen)
    save_file({"embed": shared, "lm_head": shared.clone()}, str(tmp_path / "tied.safetensors"))
    tied = torch.zeros(64, 32)
    dest = {"embed": tied, "lm_head": tied}
    sluice.load_into(tmp_path / "tied.safetensors", dest)
    assert torch.equal(tied.view(torch.int32), shared.view(torch.int32))
    assert sluice.last_load_stats()["tensor_bytes"] == shared.numel() * 4

    save_file({"a": shared[:40], "b": shared[:40].clone()}, str(tmp_path / "o.safetensors"))
    backing = torch.zeros(64, 32)
    overlapping = {"a": backing[:40], "b": backing[20:60]}
    with pytest.raises(ConfigError, match="overlap"):
        sluice.load_into(tmp_path / "o.safetensors", overlapping)
    assert not backing.any()


def test_bad_destinations_and_paths(mixed_file, tmp_path):
    path, want = mixed_file
    dest = zeros_like(want)
    dest["scale"] = 1.0
    with pytest.raises(ConfigError, match=r"scale.*float"):
        sluice.load_into(path, dest)
    with pytest.raises(SluiceFileNotFoundError):
        sluice.load_into(tmp_path / "absent.safetensors", zeros_like(want))
    (tmp_path / "bad.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")
    with pytest.raises(HeaderError, match=r"bad\.safetensors"):
        sluice.load_into(tmp_path / "bad.safetensors", {})


def test_a_read_only_destination_is_refused_not_a_crash(tmp_path, gen):
    """A tensor over a read-only mapping (np.memmap mode "r") would fault in the copy that
    fills it: refused before any read, naming the tensor. Small (gathered, copied) and
    large (read straight in) destinations alike."""
    want = {"small": random_tensor(torch.uint8, (100,), gen)}
    want["large"] = random_tensor(torch.uint8, (8 << 20,), gen)
    save_file(want, str(tmp_path / "m.safetensors"))
    for name in want:
        backing = tmp_path / f"{name}.bin"
        backing.write_bytes(bytes(want[name].numel()))
        mapped = np.memmap(backing, dtype=np.uint8, mode="r")
        dest = zeros_like(want)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch: "The given NumPy array is not writable"
            dest[name] = torch.from_numpy(mapped)
        with pytest.raises(ConfigError, match=rf"{name}.*not writable"):
            sluice.load_into(tmp_path / "m.safetensors", dest)
        assert not any(v.any() for k, v in dest.items() if k != name)


def test_a_file_truncated_on_disk_is_an_error(tmp_path, gen):
    want = {f"w{i}": random_tensor(torch.float32, (1 << 18,), gen) for i in range(4)}
    path = tmp_path / "t.safetensors"
    save_file(want, str(path))
    size = path.stat().st_size
    os.truncate(path, size - (1 << 20))
    with pytest.raises(HeaderError, match=r"t\.safetensors"):
        sluice.load_into(path, zeros_like(want))


def test_matches_safetensors_on_a_model_file(tmp_path, gen):
    """What a user does: a model built, then its weights loaded, compared with the
    `load_state_dict(safetensors.load_file)` way."""

    def build() -> torch.nn.Module:
        return torch.nn.Transformer(
            d_model=64, nhead=4, num_encoder_layers=1, num_decoder_layers=1, batch_first=True
        )

    model = build()
    want = {k: random_tensor(v.dtype, tuple(v.shape), gen) for k, v in model.state_dict().items()}
    save_file(want, str(tmp_path / "t.safetensors"))
    sluice.load_into(tmp_path / "t.safetensors", model)
    other = build()
    other.load_state_dict(st_load_file(str(tmp_path / "t.safetensors")))
    assert_same_tensors(model.state_dict(), other.state_dict())


def test_ctrl_c_mid_load_interrupts_and_the_next_load_is_whole(tmp_path, gen):
    """Ctrl-C during a load raises KeyboardInterrupt once the reads in flight are done
    (none outlives the call), and the same destinations then load whole."""
    want = {f"w{i}": random_tensor(torch.uint8, (64 << 20,), gen) for i in range(4)}
    path = tmp_path / "big.safetensors"
    save_file(want, str(path))
    script = textwrap.dedent(
        f"""
        import torch, sluice
        from safetensors.torch import load_file
        path = {str(path)!r}
        dest = {{f"w{{i}}": torch.empty(64 << 20, dtype=torch.uint8) for i in range(4)}}
        print("ready", flush=True)
        try:
            while True:
                sluice.load_into(path, dest, concurrency=1, chunk_bytes="64KiB",
                                 drop_cache=True)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
        sluice.load_into(path, dest)
        want = load_file(path)
        assert all(torch.equal(dest[k], want[k]) for k in want)
        print("whole", flush=True)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert out.split() == ["interrupted", "whole"]
    assert proc.returncode == 0


def test_numpy_arrays_are_filled_in_place(tmp_path):
    import sluice.numpy
    from safetensors.numpy import save_file as save_numpy

    rng = np.random.default_rng(5)
    want = {
        f"a{i}": rng.integers(0, 255, size=(33, 8 * (3 + i)), dtype=np.uint8).view(dt)
        for i, dt in enumerate([np.uint8, np.int16, np.float32, np.float64, np.complex64])
    }
    want["big"] = rng.standard_normal(3 << 20).astype(np.float32)
    save_numpy(want, str(tmp_path / "np.safetensors"))
    dest = {k: np.zeros_like(v) for k, v in want.items()}
    wide = np.zeros((33, 2 * want["a1"].shape[1]), dtype=np.int16)
    dest["a1"] = wide[:, ::2]  # strided: filled through a copy
    assert sluice.numpy.load_into(tmp_path / "np.safetensors", dest) == ([], [])
    for k, v in want.items():
        got = np.ascontiguousarray(dest[k])
        assert got.dtype == v.dtype and np.array_equal(got.view(np.uint8), v.view(np.uint8))
    assert not wide[:, 1::2].any()

    frozen = {k: np.zeros_like(v) for k, v in want.items()}
    frozen["a0"].flags.writeable = False
    with pytest.raises(ConfigError, match=r"a0.*not writeable"):
        sluice.numpy.load_into(tmp_path / "np.safetensors", frozen)
    wrong = {k: np.zeros_like(v) for k, v in want.items()}
    wrong["a2"] = np.zeros(want["a2"].shape, dtype=np.float64)
    with pytest.raises(ConfigError, match=r"a2.*float64.*float32"):
        sluice.numpy.load_into(tmp_path / "np.safetensors", wrong)
    assert not any(v.any() for v in wrong.values())
    with pytest.raises(TensorNotFoundError, match="big"):
        sluice.numpy.load_into(tmp_path / "np.safetensors", {"a0": np.zeros_like(want["a0"])})
    partial = {"a0": np.zeros_like(want["a0"]), "extra": np.zeros(3)}
    result = sluice.numpy.load_into(tmp_path / "np.safetensors", partial, strict=False)
    assert result.missing_keys == ["extra"] and "big" in result.unexpected_keys
    assert np.array_equal(partial["a0"], want["a0"])
