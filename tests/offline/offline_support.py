"""Helpers shared by the offline tests: bad rows to mix in, reading an output folder."""

from __future__ import annotations

import copy
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.fs as pafs

ONE_MB = 1_000_000


def with_bad_rows(rows: list[dict]) -> tuple[list[dict], dict[str, str]]:
    """``rows`` plus four rows made from copies of ``rows[0]``: three invalid ones and a valid
    one with a 1 MB document. Returns the rows and ``{search_id: expected error fragment}``."""
    base = rows[0]

    def variant(suffix: str) -> dict:
        row = copy.deepcopy(base)
        row["search_id"] = f"{base['search_id']}-{suffix}"
        return row

    empty, null_text, no_query, huge = (variant(s) for s in ("empty", "nulltext", "noq", "huge"))
    empty["candidates"] = []
    null_text["candidates"][3]["text"] = None
    no_query["sub_query"] = None
    huge["candidates"][5]["text"] = "lorem ipsum " * (ONE_MB // 12)
    errors = {
        empty["search_id"]: "candidates is empty",
        null_text["search_id"]: "candidates[3].text is missing",
        no_query["search_id"]: "sub_query is missing",
    }
    mixed = rows[:2] + [empty, null_text] + rows[2:] + [no_query, huge]
    return mixed, errors


def read_rows(path: str | Path) -> list[dict]:
    """All rows of an output folder (pyarrow skips ``_acare_job.json``)."""
    return pads.dataset(str(path), format="parquet").to_table().to_pylist()


class FlakyFS:
    """``LocalFileSystem`` whose first ``failures`` ``open_input_file`` calls raise ``OSError``
    (a transient object-store error, injected deterministically)."""

    def __init__(self, failures: int) -> None:
        self.inner = pafs.LocalFileSystem()
        self.failures = failures

    def open_input_file(self, path: str):
        if self.failures > 0:
            self.failures -= 1
            raise OSError(f"injected transient error reading {path}")
        return self.inner.open_input_file(path)

    def __getattr__(self, name: str):
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __getstate__(self) -> dict:
        return {"failures": self.failures}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["failures"])


def invalid_utf8(values: list[bytes | None]) -> pa.Array:
    """A ``string`` array holding these raw bytes (pyarrow does not validate them)."""
    raw = pa.array(values, pa.binary())
    return pa.Array.from_buffers(pa.string(), len(raw), raw.buffers(), raw.null_count)
