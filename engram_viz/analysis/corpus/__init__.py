"""Corpora counted: documents, the default corpus, n-gram windows, keys and counts (one process or on Dask,
spilled past a memory limit), the row ids of every n-gram, bucket passes and readable n-gram text."""
