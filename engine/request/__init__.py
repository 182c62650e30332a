"""One request inside the engine: its state (``Sequence``) and what it carries: its timeline,
stop strings, prompt-lookup guesses and prompt logprobs. Every room above it imports it."""
