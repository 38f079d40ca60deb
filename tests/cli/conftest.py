"""Fixtures of the command-line tests: the shipped checkpoint copied and exported once into a cache folder."""

from __future__ import annotations

import shutil

import pytest

from helpers import REPO


@pytest.fixture(scope="session")
def cached_tiny(tmp_path_factory):
    """(folder, cache root, export): a copy of models/tiny-stdlib-llama whose fp32 CPU export the cache folder
    holds, so `attnzoo generate FOLDER` with ATTNZOO_CACHE=cache root finds it without an export. A test that
    changes the folder copies it (cached_copy) instead."""
    from cli.export_cache import exported

    root = tmp_path_factory.mktemp("cached-tiny")
    folder = root / "tiny"
    shutil.copytree(REPO / "models" / "tiny-stdlib-llama", folder)  # copy2: the weights keep their mtime
    cache = root / "cache"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTNZOO_CACHE", str(cache))
        out = exported(str(folder), "fp32", None)
    return folder, cache, out
