"""Sources: each reads one kind of thing (an engine, the GPUs, the host) into samples."""
