"""The HTTP frontend process: validate, tokenize, admit, forward to the engine, stream back."""
