"""One page from PDF to result.

olmOCR's page protocol, PDFium rendering (``render_worker`` runs inside the worker processes,
``render_pool`` is the parent side), the page ladder (retries, rotations, fallback) and the results.
Imports only ``core``.
"""
