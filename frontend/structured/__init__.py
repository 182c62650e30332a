"""Structured output: JSON schemas turned into GBNF grammars the engine enforces."""
