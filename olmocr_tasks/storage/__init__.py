"""Where bytes live: the ``Storage`` facade over local folders and S3 (``backends``).

Also URIs, the allow-list of locations a run may use, and OpenLineage names. Imports only ``core``.
"""
