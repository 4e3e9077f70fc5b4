import os
import shutil
from pathlib import Path

import pytest

REPO = Path(os.environ.get("STRATA_REPO", Path(__file__).resolve().parents[2]))


@pytest.fixture
def wh(tmp_path):
    """A fresh warehouse folder."""
    return str(tmp_path / "wh")


@pytest.fixture
def example(tmp_path):
    """A copy of an example folder (its data files), by name."""
    def copy(name):
        dst = tmp_path / name
        shutil.copytree(REPO / "examples" / name, dst,
                        ignore=shutil.ignore_patterns("warehouse", "__pycache__"))
        return dst
    return copy


def rows(table, order=None):
    """A pyarrow Table as a sorted list of row tuples (a multiset comparison)."""
    cols = table.column_names
    out = [tuple(r[c] for c in cols) for r in table.to_pylist()]
    return sorted(out, key=lambda r: tuple((v is None, str(v)) for v in r))
