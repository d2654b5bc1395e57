"""Quantised tables: candidate tables (GGUF types applied on the fly, GGUF files, Engram off), what each
costs in row error, keys and values, gates, output and (on the tiny LM) loss, and the tidy summaries."""
