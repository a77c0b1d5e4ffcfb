"""`mmtrt compare`: two bundles, or a bundle and its PyTorch source, partition by partition through Polygraphy."""
