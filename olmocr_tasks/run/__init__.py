"""One run of the engine: planned, converted and published.

Discovery (and S3 events), batching, converting a batch, progress, and the pipeline the CLI drives.
The top of the engine; ``cli`` and ``provider`` call it.
"""
