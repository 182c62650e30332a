"""The chat path that every surface speaking in conversations shares and no surface owns: a
conversation as the pipeline runs it, its reply read as it comes, an engine's ending as a
finish reason or an error, the engine's logprobs as tokens, the ids of OpenAI's replies."""
