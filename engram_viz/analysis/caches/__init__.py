"""Row caches planned from real text: access traces, cache simulation (libCacheSim), page I/O."""
