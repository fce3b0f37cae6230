"""Engine sources: scrape an engine's /metrics, detect its kind, normalize to one schema."""
