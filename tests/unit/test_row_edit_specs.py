"""engram_viz.weights.row_edits: every spec form (row ids as a mapping, an array, a list, a tensor;
row specs as 'zero', a source row, a new row, stored bits) either makes the edit it names or is a
RowEditError naming the spec, what was expected and what came; never another exception, never a
float, bool or string id truncated or parsed, never a non-finite row let in."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engram_viz.core import fp8
from engram_viz.errors import RowEditError
from engram_viz.weights.procedural import ProceduralTable
from engram_viz.weights.row_edits import STACK_ATTR, edit_rows, edit_tables

N, D = 300, 64
TABLE = ProceduralTable(N, D, seed=11)
INT_NP = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
INT_TORCH = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8]
FLOAT_NP = [np.float16, np.float32, np.float64]
FLOAT_TORCH = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def _bytes(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.uint8).numpy()


def _fp8_pair(w_bytes, s_bytes):
    w = torch.tensor(w_bytes, dtype=torch.uint8).view(torch.float8_e4m3fn)
    return w, torch.tensor(s_bytes, dtype=torch.uint8).view(torch.float8_e8m0fnu)


# --- row ids: (value, the ids it names, or None when it must be refused) ---
valid_ids = st.lists(st.integers(0, 127), min_size=0, max_size=8)  # 127: fits every integer dtype


@st.composite
def id_forms(draw):
    ids = draw(valid_ids)
    good = sorted(set(ids))
    kind = draw(st.integers(0, 11))
    if kind == 0:
        return ids, good
    if kind == 1:
        return tuple(ids), good
    if kind == 2:
        return np.array(ids, dtype=draw(st.sampled_from(INT_NP))), good
    if kind == 3:
        return torch.tensor(ids, dtype=draw(st.sampled_from(INT_TORCH))), good
    if kind == 4 and ids:
        return ids[0], [ids[0]]
    if kind == 5 and len(ids) >= 2 and len(ids) % 2 == 0:
        return np.array(ids, dtype=np.int64).reshape(2, -1).tolist(), good  # nested: ids of any shape
    if kind == 6:  # out of range, somewhere
        bad = draw(st.sampled_from([-1, N, 2**31, 2**63, 2**70, -(2**63)]))
        return [*ids, bad], None
    if kind == 7:
        return np.array([*ids, N], dtype=draw(st.sampled_from([np.int64, np.uint64, np.uint16]))), None
    if kind == 8:  # floats (even integral ones), bools, strings: never truncated or parsed
        bad = draw(st.sampled_from([1.7, 2.0, True, False, "5", "x", None, np.float32(3), np.bool_(True), 1j]))
        return [*ids, bad], None
    if kind == 9:
        dtype = draw(st.sampled_from([*FLOAT_NP, np.bool_, np.complex64, "U3", "S3", "datetime64[s]"]))
        return np.array([*ids, 1]).astype(dtype), None
    if kind == 10:
        return torch.tensor([*ids, 1], dtype=draw(st.sampled_from([*FLOAT_TORCH, torch.bool]))), None
    return draw(st.sampled_from([None, "zero", "12", b"12", 3.0, True, object()])), None


@settings(max_examples=200)
@given(id_forms())
def test_row_ids_are_zeroed_or_refused(form):
    edits, want = form
    try:
        with edit_rows(TABLE, edits) as ov:
            got = sorted(ov.rows.tolist())
            rows = TABLE(torch.arange(N))
    except RowEditError as err:
        assert want is None, f"refused a valid edit {edits!r}: {err}"
        assert TABLE.label in str(err) and "\n" not in str(err)
        return
    finally:
        assert STACK_ATTR not in vars(TABLE) and "_gather_unique" not in vars(TABLE)
    assert want is not None, f"accepted {edits!r} as rows {got}"
    assert got == want
    assert (rows[want] == 0).all()


# --- row specs: (spec, the stored bits it must give (weight, scale bytes), or None) ---
finite32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


@st.composite
def spec_forms(draw):
    kind = draw(st.integers(0, 10))
    src = draw(st.integers(0, N - 1))
    values = np.array(draw(st.lists(finite32, min_size=D, max_size=D)), dtype=np.float32)
    qw, qs = fp8.quantize_rows(torch.from_numpy(values)[None])
    row_bits = _bytes(qw[0]), _bytes(qs[0])
    if kind == 0:
        return "zero", (np.zeros(D, np.uint8), np.full(D // 32, 127, np.uint8))
    if kind == 1:
        w, s = TABLE.gather_fp8(torch.tensor([src]))
        return draw(st.sampled_from([int, np.int32, np.uint16]))(src), (_bytes(w[0]), _bytes(s[0]))
    if kind == 2:
        form = draw(st.sampled_from(["tensor32", "tensor64", "numpy32", "numpy64", "list"]))
        spec = {
            "tensor32": torch.from_numpy(values),
            "tensor64": torch.from_numpy(values.astype(np.float64)),
            "numpy32": values,
            "numpy64": values.astype(np.float64),
            "list": values.tolist(),
        }[form]
        return spec, row_bits
    if kind == 3:
        return (qw[0], qs[0]), row_bits
    if kind == 4:  # stored bits holding the checkpoint's NaN bytes somewhere
        w, s = row_bits[0].copy(), row_bits[1].copy()
        if draw(st.booleans()):
            w[draw(st.integers(0, D - 1))] = draw(st.sampled_from([0x7F, 0xFF]))
        else:
            s[draw(st.integers(0, D // 32 - 1))] = 0xFF
        return _fp8_pair(w, s), None
    if kind == 5:  # a row with NaN / Inf, or float64 values past float32's range
        v = values.astype(np.float64)
        v[draw(st.integers(0, D - 1))] = draw(st.sampled_from([np.nan, np.inf, -np.inf, 1e39, -1e300]))
        return draw(st.sampled_from([torch.from_numpy(v), v, v.tolist()])), None
    if kind == 6:  # an fp8 / bf16 / fp16 row with a non-finite value
        dtype = draw(st.sampled_from([torch.float8_e4m3fn, torch.float16, torch.bfloat16]))
        t = torch.zeros(D).to(dtype)
        t.view(torch.uint8)[: t.element_size()] = 0xFF  # the first value: all ones, NaN in each dtype
        return t, None
    if kind == 7:  # wrong shapes and dtypes
        return draw(
            st.sampled_from(
                [
                    torch.ones(D - 1),
                    torch.ones(1, D),
                    torch.ones(D, dtype=torch.int64),
                    torch.ones(D, dtype=torch.bool),
                    torch.ones(D, dtype=torch.complex64),
                    np.ones(D, dtype=np.int32),
                    np.array(["a"] * D),
                    [1.0] * (D + 1),
                    [[1.0] * D, [2.0]],
                ]
            )
        ), None
    if kind == 8:  # pairs that are not the stored bits
        return draw(
            st.sampled_from(
                [
                    (1.0, 2.0),
                    (None, None),
                    (qw[0].float(), qs[0]),
                    (qw[0], qs[0].float()),
                    (qw[0][:-1], qs[0]),
                    (qw[0], qs[0][:1]),
                    ("zero", "zero"),
                    (qw[0], qs[0], qs[0]),
                ]
            )
        ), None
    if kind == 9:  # source rows that are not ids
        return draw(st.sampled_from([-1, N, 2**70, True, np.bool_(False), 3.0, np.float64(2)])), None
    return draw(st.sampled_from([None, "erase", "", b"zero", object(), {}, [], 1j, ...])), None


@settings(max_examples=200)
@given(spec_forms(), st.integers(0, N - 1))
def test_row_specs_make_their_edit_or_are_refused(form, row):
    spec, want = form
    try:
        with edit_rows(TABLE, {row: spec}):
            w, s = TABLE.gather_fp8(torch.tensor([row]))
    except RowEditError as err:
        assert want is None, f"refused a valid spec {spec!r}: {err}"
        assert re.search(rf"\brow {row}\b", str(err)) and TABLE.label in str(err) and "\n" not in str(err)
        return
    finally:
        assert STACK_ATTR not in vars(TABLE)
    assert want is not None, f"accepted {spec!r}"
    assert np.array_equal(_bytes(w[0]), want[0]) and np.array_equal(_bytes(s[0]), want[1])


@pytest.mark.parametrize("key", [1.0, 2.5, True, "1", None, (1,)])
def test_mapping_keys_must_be_int_rows(key):
    with pytest.raises(RowEditError, match="must be an int row id"), edit_rows(TABLE, {key: "zero"}):
        pass


@pytest.mark.parametrize(
    "edits, match",
    [(None, "mapping"), ([1, 2], "mapping"), ("zero", "mapping"), ({True: [1]}, "layer"), ({1.0: [1]}, "layer")],
)
def test_edit_tables_names_bad_layer_edits(edits, match):
    with pytest.raises(RowEditError, match=match), edit_tables({1: TABLE}, edits):
        pass
    assert STACK_ATTR not in vars(TABLE)


def test_float64_overflow_is_named():
    with pytest.raises(RowEditError, match=r"beyond float32's range .* features \[3\]"):
        row = torch.zeros(D, dtype=torch.float64)
        row[3] = 1e300
        with edit_rows(TABLE, {5: row}):
            pass
