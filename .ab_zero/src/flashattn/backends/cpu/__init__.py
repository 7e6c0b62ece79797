"""Chunked torch backends (any device torch runs on): dense.py (forward / backward / varlen),
kvcache.py (append, rotary, attention against a cache, combine), backend.py (the interface
dispatch calls)."""
