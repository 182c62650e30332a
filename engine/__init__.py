"""The engine process: the one process that owns llama.cpp and schedules every sequence."""
