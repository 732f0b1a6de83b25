"""estimators.dtypes: the one dtype table agrees with torch."""

from __future__ import annotations

import pytest
import torch

from estimators.dtypes import DTYPE_BYTES, itemsize, torch_dtype, torch_dtypes


def test_every_size_is_torchs_itemsize():
    for name, size in DTYPE_BYTES.items():
        assert getattr(torch, name).itemsize == size, name


def test_names_map_to_torch_dtypes_and_unknown_names_are_refused():
    assert torch_dtypes()["bfloat16"] is torch.bfloat16
    assert itemsize(torch.float16) == 2 and itemsize("float8_e4m3fn") == 1
    with pytest.raises(ValueError, match="unknown dtype 'float128'"):
        torch_dtype("float128")
