"""Tests for tinyserve_native: each Cython module checked against a pure-Python reference."""
