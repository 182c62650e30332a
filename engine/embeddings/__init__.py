"""Embedding requests: queued by the policy, given a share of each tick, pooled in a llama.cpp
context of their own. No seed component."""
