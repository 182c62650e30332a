"""Who waits, who gets a slot, what goes in the batch, when a request ends, how fast requests
leave: the seed's admission (the engine's acceptance), queue, policies and the batch's plan."""
