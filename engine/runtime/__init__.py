"""The seed's runtime, the door to llama.cpp: weights, model, context, batch, KV, samplers."""
