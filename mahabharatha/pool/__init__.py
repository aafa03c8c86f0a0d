"""Worker pools: ``lock work`` and its team of workers."""
