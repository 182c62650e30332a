"""Speculation: which sequences guess, how many tokens, and the draft model that guesses (the
prompt lookup each sequence carries is ``request/speculation.py``). No seed component."""
