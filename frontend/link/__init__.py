"""The frontend's side of the engine: its sockets, the handshake and heartbeat, the board."""
