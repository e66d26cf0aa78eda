"""gnnserve server: servicer, validation, batcher, pipeline, feature stores, model registry, metrics."""
