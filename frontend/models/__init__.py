"""The HTTP API declared once: what every surface's request and reply bodies are made of.

Each surface declares its own bodies as pydantic models in its folder (``native/``,
``openai/``, ``responses/``, ``anthropic/``, ``tokenize/``, ``embeddings/``, ``dashboard/``);
validation (and its 400 messages naming the field), the OpenAPI document and the replies all
derive from them. Here is what they share: ``common`` holds the rules every body follows,
``fields`` the field types the surfaces share, ``conversation`` the neutral conversation that
every surface speaking in conversations builds from its own body (chat completions' request
in ``chat``; ``translated``: what the Messages and Responses requests share to build it),
with ``tools`` and ``response_format`` its nested objects, ``progress`` the prefill's
progress, ``errors`` ``ApiError`` and the three error shapes, and ``parse`` turns request
bytes into a model or a 400.
"""
