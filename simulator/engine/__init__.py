"""One replica's engine: step costs, the KV-cache block manager, schedulers, the event loop."""
