"""What a tick did, as plain values (``TickReport``), and what is derived from it: the event
feed, the metrics, the spans. The engine's half of the seed's stream manager."""
