"""Placeholder so setup.py builds; the module lands in a following commit."""
