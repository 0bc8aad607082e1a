"""Header validation against the reference: Sluice opens exactly the files ``safetensors`` opens.

A corpus of hand-built files, each probing one rule of the format (the length prefix, the
JSON, the tensor entries, ``__metadata__``, the layout of the data section, shapes and
dtypes), goes through both readers. For each file:

- ``safetensors`` accepts it (``safetensors.deserialize``, the check behind ``safe_open``
  and ``load_file``) exactly when Sluice accepts it (``open_checkpoint``);
- where both accept, every tensor has the same dtype, shape and bytes, and the metadata
  is the same;
- where Sluice refuses, it raises ``sluice.errors.HeaderError`` naming the file.

One family of files is a documented deviation (``UNDESCRIBABLE``): empty tensors whose
other dimensions multiply past 2^63-1, such as ``[0, 2**63, 2**63]``. safetensors accepts
the header and then numpy (and, for most, torch) cannot build the tensor, raising an error
that names no file; Sluice refuses the header with a HeaderError naming file and tensor.
``docs/design/loader.md`` tabulates the rules.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pytest
import safetensors
import safetensors.numpy
import sluice.numpy
from conftest import Header, assert_same_arrays, write_raw
from conftest import entry as e
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from sluice import _core, _sluice
from sluice.errors import HeaderError, SluiceError

# Every dtype safetensors 0.8 knows, with its width in bits.
DTYPE_BITS = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "U16": 16,
    "I16": 16,
    "U32": 32,
    "I32": 32,
    "U64": 64,
    "I64": 64,
    "F16": 16,
    "BF16": 16,
    "F32": 32,
    "F64": 64,
    "C64": 64,
    "F8_E4M3": 8,
    "F8_E5M2": 8,
    "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
}


@dataclass(frozen=True)
class Case:
    """One corpus file: ``<u64 length><header><data>``, or ``raw`` bytes as they are."""

    name: str
    header: Header = "{}"
    data: bytes = b""
    header_len: Optional[int] = None
    raw: Optional[bytes] = None
    # Sluice refuses what safetensors' header check accepts (see the module docstring).
    undescribable: bool = False


def pattern(n: int) -> bytes:
    return bytes((i * 37 + 11) % 256 for i in range(n))


def twice(first: Any, second: Any) -> str:
    """A header naming tensor "w" twice, which ``json.dumps`` of a dict cannot write."""
    return f'{{"w": {json.dumps(first)}, "w": {json.dumps(second)}}}'


def text_entry(shape: str = "[4]", offsets: str = "[0, 4]", dtype: str = '"U8"') -> str:
    """Tensor "w" written by hand, for numbers JSON spells in ways Python would not."""
    return f'{{"w": {{"dtype": {dtype}, "shape": {shape}, "data_offsets": {offsets}}}}}'


U8x4 = e("U8", [4], 0, 4)
OK4 = json.dumps({"w": U8x4})
BIG = 2**63


def every_dtype() -> Case:
    """One tensor of each dtype, back to back; sub-byte ones with 4 elements."""
    header: dict[str, Any] = {}
    offset = 0
    for dtype, bits in DTYPE_BITS.items():
        shape = [4] if bits < 8 else [2, 3]
        size = 4 * bits // 8 if bits < 8 else 6 * bits // 8
        header[f"t.{dtype}"] = e(dtype, shape, offset, offset + size)
        offset += size
    return Case("every_dtype", header, pattern(offset))


def deep(levels: int) -> str:
    """An ignored field nested so that the whole header is ``levels`` deep."""
    inner = "[" * (levels - 2) + "]" * (levels - 2)
    return '{"w": {"dtype": "U8", "shape": [0], "data_offsets": [0, 0], "x": ' + inner + "}}"


CORPUS = [
    # -- the length prefix --
    Case("file_shorter_than_prefix", raw=b"\x02\x00\x00"),
    Case("header_length_zero", "", header_len=0),
    Case("header_length_past_eof", OK4, pattern(4), header_len=5000),
    Case("header_length_u64_max", OK4, pattern(4), header_len=2**64 - 1),
    Case("header_length_wraps_with_prefix", OK4, pattern(4), header_len=2**64 - 8),
    Case("header_length_over_100mb", OK4, pattern(4), header_len=100_000_001),
    Case("header_length_one_short", OK4, pattern(4), header_len=len(OK4) - 1),
    # -- the JSON text --
    Case("header_not_utf8", b'{"w\xff": 1}'),
    Case("header_with_utf8_bom", b"\xef\xbb\xbf{}"),
    Case("header_truncated_json", '{"w": {"dtype": "U8",'),
    Case("header_padded_with_spaces", OK4 + "      ", pattern(4)),
    Case("header_padded_with_json_whitespace", " \n\t" + OK4 + "\r\n\t ", pattern(4)),
    Case("header_padded_with_nul", OK4 + "\0\0\0", pattern(4)),
    Case("header_is_an_array", "[]"),
    Case("header_is_null", "null"),
    Case("header_is_whitespace", "    "),
    Case("header_nested_to_the_limit", deep(127)),
    Case("header_nested_past_the_limit", deep(128)),
    Case("name_with_lone_surrogate", '{"\\ud800": ' + json.dumps(e("U8", [0], 0, 0)) + "}"),
    Case("name_with_escapes", '{"\\u00e9\\n\\"": ' + json.dumps(U8x4) + "}", pattern(4)),
    Case("empty_header_object", "{}"),
    # -- tensor entries --
    Case("empty_tensor_name", {"": U8x4}, pattern(4)),
    Case("unknown_field_ignored", {"w": {**U8x4, "extra": [1, {"x": None}], "y": 1}}, pattern(4)),
    Case("misspelt_field", {"w": {"dtype": "U8", "shape": [4], "data_offset": [0, 4]}}, pattern(4)),
    Case("missing_dtype", {"w": {"shape": [4], "data_offsets": [0, 4]}}, pattern(4)),
    Case("repeated_field", text_entry(dtype='"U8", "dtype": "U8"'), pattern(4)),
    Case("repeated_tensor_same_entry", twice(U8x4, U8x4), pattern(4)),
    Case("repeated_tensor_last_wins", twice(e("F32", [1], 0, 4), U8x4), pattern(4)),
    Case("repeated_tensor_dropped_entry_unchecked", twice(e("U8", [9], 99, 1), U8x4), pattern(4)),
    Case("repeated_tensor_dropped_entry_mistyped", twice(e("F12", [4], 0, 4), U8x4), pattern(4)),
    Case("repeated_tensor_leaves_a_gap", twice(U8x4, e("U8", [4], 4, 8)), pattern(8)),
    Case("entry_as_array_of_three", '{"w": ["U8", [4], [0, 4]]}', pattern(4)),
    Case("entry_as_array_of_four", '{"w": ["U8", [4], [0, 4], 1]}', pattern(4)),
    Case("entry_is_null", '{"w": null}'),
    Case("dtype_as_map_to_null", {"w": e({"BF16": None}, [2], 0, 4)}, pattern(4)),
    Case("dtype_as_map_to_object", {"w": e({"BF16": {}}, [2], 0, 4)}, pattern(4)),
    Case("dtype_lower_case", {"w": e("u8", [4], 0, 4)}, pattern(4)),
    Case("dtype_unknown", {"w": e("F12", [4], 0, 4)}, pattern(4)),
    Case("shape_float", text_entry(shape="[4.0]"), pattern(4)),
    Case("shape_exponent", text_entry(shape="[4e0]"), pattern(4)),
    Case("shape_negative", {"w": e("U8", [-4], 0, 4)}, pattern(4)),
    Case("shape_negative_zero", text_entry(shape="[-0]", offsets="[0, 0]")),
    Case("shape_bool", {"w": e("U8", [True], 0, 1)}, pattern(1)),
    Case("shape_past_u64", {"w": e("U8", [2**64], 0, 0)}),
    Case("offsets_three_items", text_entry(offsets="[0, 4, 4]"), pattern(4)),
    Case("offsets_float", text_entry(offsets="[0, 4.0]"), pattern(4)),
    Case("offsets_as_object", text_entry(offsets='{"0": 0, "1": 4}'), pattern(4)),
    # -- __metadata__ --
    Case("metadata_strings", {"__metadata__": {"format": "pt", "": ""}, "w": U8x4}, pattern(4)),
    Case("metadata_null", {"__metadata__": None, "w": U8x4}, pattern(4)),
    Case("metadata_after_tensors", {"w": U8x4, "__metadata__": {"k": "v"}}, pattern(4)),
    Case("metadata_value_int", {"__metadata__": {"epoch": 3}}),
    Case("metadata_value_null", {"__metadata__": {"epoch": None}}),
    Case("metadata_is_list", {"__metadata__": ["pt"]}),
    Case("metadata_is_string", {"__metadata__": "pt"}),
    Case("metadata_key_repeated", '{"__metadata__": {"k": "a", "k": "b"}}'),
    Case("metadata_section_repeated", '{"__metadata__": {}, "__metadata__": {}}'),
    # -- the layout of the data section --
    Case("trailing_byte", {"w": U8x4}, pattern(5)),
    Case("trailing_byte_without_tensors", "{}", b"\0"),
    Case("gap_between_tensors", {"a": e("U8", [2], 0, 2), "b": e("U8", [2], 3, 5)}, pattern(5)),
    Case("data_not_starting_at_zero", {"w": e("U8", [4], 2, 6)}, pattern(6)),
    Case("overlapping_tensors", {"a": e("U8", [4], 0, 4), "b": e("U8", [4], 2, 6)}, pattern(6)),
    Case("identical_spans", {"a": U8x4, "b": U8x4}, pattern(4)),
    Case("nested_tensor", {"a": e("U8", [8], 0, 8), "b": e("U8", [2], 2, 4)}, pattern(8)),
    Case(
        "offsets_unsorted_in_json",
        {"c": e("I16", [2], 6, 10), "a": e("U8", [2], 0, 2), "b": e("F32", [1], 2, 6)},
        pattern(10),
    ),
    Case(
        "misaligned_offsets",
        {"a": e("U8", [1], 0, 1), "b": e("F32", [2], 1, 9), "c": e("F64", [1], 9, 17)},
        pattern(17),
    ),
    Case("offsets_inverted", {"w": e("U8", [0], 4, 0)}, pattern(4)),
    Case("offsets_past_the_data", {"w": U8x4}, pattern(3)),
    Case("offsets_u64_max", {"w": e("U8", [0], 2**64 - 1, 2**64 - 1)}),
    Case("size_not_span", {"w": e("F32", [2], 0, 4)}, pattern(4)),
    Case(
        "empty_tensors_at_boundaries",
        {"z": e("F32", [0], 0, 0), "a": U8x4, "m": e("F64", [3, 0], 4, 4), "y": e("U8", [0], 4, 4)},
        pattern(4),
    ),
    Case("empty_tensor_inside_another", {"a": U8x4, "e": e("U8", [0], 2, 2)}, pattern(4)),
    Case("empty_tensor_past_the_end", {"a": U8x4, "e": e("U8", [0], 5, 5)}, pattern(4)),
    Case("only_an_empty_tensor_not_at_zero", {"e": e("U8", [0], 3, 3)}),
    # -- shapes --
    Case("scalar", {"w": e("F64", [], 0, 8)}, pattern(8)),
    Case("zero_size", {"w": e("F32", [0, 3], 0, 0)}),
    Case("zero_beside_big_dimension", {"w": e("U8", [2**61, 0], 0, 0)}),
    Case("zero_beside_largest_i64", {"w": e("U8", [0, 2**63 - 1], 0, 0)}),
    Case("overflow_before_the_zero", {"w": e("U8", [BIG, BIG, 0], 0, 0)}),
    Case("element_count_overflows", {"w": e("U8", [2**32, 2**32], 0, 4)}, pattern(4)),
    Case("bit_count_overflows", {"w": e("F64", [2**61], 0, 8)}, pattern(8)),
    Case("zero_then_past_i64", {"w": e("U8", [0, BIG, BIG], 0, 0)}, undescribable=True),
    Case("zero_then_product_past_i64", {"w": e("U8", [0, 2**62, 2**62], 0, 0)}, undescribable=True),
    Case("zero_then_bytes_past_i64", {"w": e("F32", [0, 2**61], 0, 0)}, undescribable=True),
    # -- dtypes --
    every_dtype(),
    Case("f4_partial_byte", {"w": e("F4", [3], 0, 2)}, pattern(2)),
    Case("f6_partial_byte", {"w": e("F6_E3M2", [2], 0, 2)}, pattern(2)),
    Case("f4_whole_bytes_2d", {"w": e("F4", [3, 2], 0, 3)}, pattern(3)),
]


@dataclass
class Verdict:
    """What a reader made of a file: its tensors and metadata, or the error."""

    tensors: Optional[dict[str, tuple[str, list[int], bytes]]] = None
    metadata: Optional[dict[str, str]] = None
    error: Optional[BaseException] = None

    @property
    def accepted(self) -> bool:
        return self.error is None


def reference(path: Path) -> Verdict:
    """safetensors' verdict: ``deserialize`` runs the header check behind ``safe_open``."""
    try:
        items = safetensors.deserialize(path.read_bytes())
    except Exception as err:  # any refusal is a refusal
        return Verdict(error=err)
    tensors = {name: (t["dtype"], list(t["shape"]), bytes(t["data"])) for name, t in items}
    with safe_open(str(path), framework="np") as f:
        assert sorted(f.keys()) == sorted(tensors), "safe_open disagrees with deserialize"
        metadata = f.metadata()
    return Verdict(tensors=tensors, metadata=metadata)


def sluice_verdict(path: Path) -> Verdict:
    """Sluice's verdict: the header check of ``open_checkpoint``, then the bytes it loads."""
    try:
        checkpoint = _sluice.open_checkpoint(str(path))
    except SluiceError as err:
        return Verdict(error=err)
    tensors = {}
    for window in _core.iter_windows(path, None, bounded=False, checkpoint=checkpoint):
        buffer = np.asarray(window) if len(window) else np.empty(0, dtype=np.uint8)
        for name, dtype, shape, offset, nbytes in window.tensors:
            tensors[name] = (dtype, list(shape), buffer[offset : offset + nbytes].tobytes())
    return Verdict(tensors=tensors, metadata=checkpoint.metadata())


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("parity")
    paths = {}
    for case in CORPUS:
        path = directory / f"{case.name}.safetensors"
        if case.raw is not None:
            path.write_bytes(case.raw)
        else:
            write_raw(path, case.header, case.data, header_len=case.header_len)
        paths[case.name] = path
    return paths


def assert_names_file(err: BaseException, path: Path) -> None:
    assert isinstance(err, HeaderError), f"{type(err).__name__}: {err}"
    assert str(path) in str(err), str(err)


def test_the_corpus_covers_both_verdicts_and_every_dtype() -> None:
    names = [case.name for case in CORPUS]
    assert len(names) == len(set(names)) >= 40
    header = every_dtype().header
    assert isinstance(header, dict)
    assert {entry["dtype"] for entry in header.values()} == set(DTYPE_BITS)


@pytest.mark.parametrize("case", [c for c in CORPUS if not c.undescribable], ids=lambda c: c.name)
def test_sluice_accepts_exactly_what_safetensors_accepts(case: Case, corpus) -> None:
    path = corpus[case.name]
    want, got = reference(path), sluice_verdict(path)

    assert got.accepted == want.accepted, (
        f"safetensors {'accepts' if want.accepted else 'refuses'} {case.name} "
        f"({want.error}), Sluice {'accepts' if got.accepted else 'refuses'} ({got.error})"
    )
    if got.error is not None:
        assert_names_file(got.error, path)
    else:
        assert got.tensors == want.tensors
        assert got.metadata == want.metadata


@pytest.mark.parametrize("case", [c for c in CORPUS if c.undescribable], ids=lambda c: c.name)
def test_empty_tensors_numpy_cannot_describe_are_a_typed_error(case: Case, corpus) -> None:
    path = corpus[case.name]
    assert reference(path).accepted, "safetensors' header check accepts these"
    with pytest.raises(ValueError) as untyped:
        safetensors.numpy.load_file(str(path))
    assert str(path) not in str(untyped.value)  # why Sluice refuses them up front

    err = sluice_verdict(path).error
    assert err is not None
    assert_names_file(err, path)
    assert "'w'" in str(err) and "numpy or torch" in str(err)
    with pytest.raises(HeaderError, match="'w'"):
        sluice.numpy.load_file(path)


def describable(dtype: str, shape: list[int]) -> bool:
    """Sluice's one rule of its own: numpy and torch can build the (empty) tensor."""
    elements = 1
    for dim in shape:
        elements *= dim or 1
    limit = 2**63 - 1
    return elements <= limit and -(-elements * DTYPE_BITS[dtype] // 8) <= limit


SMALL_DTYPES = ["U8", "F32", "F4", "F6_E2M3", "BOOL"]
HUGE_DIMS = [2**32, 2**62, 2**63, 2**64 - 1]
# About half the random files are valid; the others break one thing in one entry, or the end.
FAULTS = [None] * 4 + ["start", "end", "name", "shape", "dtype", "data_len", "trailing", "zero"]


@st.composite
def random_file(draw: st.DrawFn) -> bytes:
    """Up to four tensors back to back, metadata now and then, header padded with 0-7
    spaces; then, in about half the files, one fault: a start or end moved, a name reused
    (the earlier entry drops out), a huge dimension, another dtype (sub-byte ones may not
    fill whole bytes), a short or long data section, or a zero dimension beside huge
    ones (empty tensors safetensors accepts only if the zero comes before the overflow)."""
    count = draw(st.integers(0, 4))
    fault = draw(st.sampled_from(FAULTS)) if count else None
    victim = draw(st.integers(0, count - 1)) if count else -1
    pairs = []
    offset = 0
    for index in range(count):
        dtype = draw(st.sampled_from(SMALL_DTYPES))
        shape = draw(st.lists(st.integers(0, 3), max_size=3))
        if DTYPE_BITS[dtype] < 8:
            shape.append(8)  # whole bytes
        faulty = index == victim
        if faulty and fault == "shape":
            shape.insert(draw(st.integers(0, len(shape))), draw(st.sampled_from(HUGE_DIMS)))
        if faulty and fault == "zero":
            shape = draw(
                st.permutations(
                    [0, *draw(st.lists(st.sampled_from(HUGE_DIMS), min_size=1, max_size=2))]
                )
            )
        elements = 1
        for dim in shape:
            elements *= dim
        size = elements * DTYPE_BITS[dtype] // 8 if elements <= 64 else 0
        if faulty and fault == "dtype":
            dtype = draw(st.sampled_from(SMALL_DTYPES))
        start, end = offset, offset + size
        if faulty and fault == "start":
            start = draw(st.integers(0, offset + 4))
        if faulty and fault == "end":
            end = draw(st.integers(max(0, start - 1), start + 9))
        offset = max(offset, end)
        name = draw(st.sampled_from(["", "t"])) if faulty and fault == "name" else f"t{index}"
        pairs.append((name, {"dtype": dtype, "shape": shape, "data_offsets": [start, end]}))
    if draw(st.booleans()):
        metadata = draw(st.one_of(st.none(), st.dictionaries(st.text(max_size=2), st.text())))
        pairs.insert(draw(st.integers(0, len(pairs))), ("__metadata__", metadata))
    text = "{" + ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in pairs) + "}"
    text += " " * draw(st.integers(0, 7))
    data_len = offset
    if fault == "data_len" or (fault == "trailing" and count):
        data_len = max(0, offset + draw(st.sampled_from([-2, -1, 1, 2])))
    return struct.pack("<Q", len(text)) + text.encode() + pattern(data_len)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_file())
def test_random_headers_get_the_same_verdict(tmp_path_factory, data: bytes) -> None:
    path = tmp_path_factory.mktemp("random") / "r.safetensors"
    path.write_bytes(data)
    want, got = reference(path), sluice_verdict(path)
    if want.accepted and not all(describable(d, shape) for d, shape, _ in want.tensors.values()):
        want = Verdict(error=ValueError("numpy and torch cannot build it"))  # the deviation
    assert got.accepted == want.accepted, (data, want.error, got.error)
    if got.error is not None:
        assert_names_file(got.error, path)
    else:
        assert got.tensors == want.tensors
        assert got.metadata == want.metadata


# numpy has no dtype for these without ml_dtypes (and none at all for F4/F6).
NOT_IN_NUMPY = {"BF16", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ"}
NOT_IN_NUMPY |= {"F4", "F6_E2M3", "F6_E3M2"}


@pytest.mark.parametrize("case", CORPUS, ids=lambda c: c.name)
def test_the_numpy_front_agrees_with_safetensors_numpy(case: Case, corpus) -> None:
    path = corpus[case.name]
    want = reference(path)
    if want.accepted and any(t[0] in NOT_IN_NUMPY for t in want.tensors.values()):
        pytest.skip("a dtype numpy cannot hold")
    if not want.accepted or case.undescribable:
        with pytest.raises(HeaderError) as refused:
            sluice.numpy.load_file(path)
        assert str(path) in str(refused.value)
        return
    assert_same_arrays(sluice.numpy.load_file(path), safetensors.numpy.load_file(str(path)))


def test_the_torch_front_agrees_with_safetensors_torch(corpus) -> None:
    """Torch is slow to import: one test walks the whole corpus."""
    import safetensors.torch
    import sluice.torch
    from conftest import assert_same_tensors

    compared = 0
    for case in CORPUS:
        path = corpus[case.name]
        if not reference(path).accepted or case.undescribable:
            with pytest.raises(HeaderError) as refused:
                sluice.torch.load_file(path)
            assert str(path) in str(refused.value), case.name
            continue
        try:
            expected = safetensors.torch.load_file(str(path))
        except Exception:  # a dtype this torch lacks (F6, say)
            continue
        assert_same_tensors(sluice.torch.load_file(path), expected)
        compared += 1
    assert compared >= 20
