"""The live scheduler dashboard: the event feed's SSE route and fan-out, and the page."""
