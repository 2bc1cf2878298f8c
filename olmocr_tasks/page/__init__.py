"""One page from PDF to result.

olmOCR's page protocol, PDFium rendering (``render_worker`` runs inside the sandboxed worker
processes, ``render_pool`` is the parent side, ``render_wire`` the format between them), the page
ladder (retries, rotations, fallback) and the results. Imports only ``core``.
"""
