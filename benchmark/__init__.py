"""Benchmarks for the chunk-aware ViT embedding cache (see benchmark/README.md)."""
