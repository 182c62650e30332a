"""The HTTP API declared once: request and reply bodies of every route as pydantic models.

Validation (and its 400 messages naming the field), the OpenAPI document and the replies all
derive from these declarations: ``common`` holds the rules every body follows and the field
types the surfaces share, ``native``, ``openai_requests`` / ``openai_reply_bodies``,
``responses_requests`` / ``responses_replies`` and ``anthropic_requests`` /
``anthropic_replies`` the bodies (the last two surfaces translated into chat requests by
``translated``), ``parse`` turns request bytes into a model or a 400.
"""
