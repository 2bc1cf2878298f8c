"""One page from document to result.

olmOCR's page protocol, rendering (``render_worker`` runs inside the sandboxed worker processes:
PDFium for PDFs, ``image_pages`` for page images, both sized by ``geometry``; ``render_pool`` is the
parent side, ``render_wire`` the format between them), the page ladder (retries, rotations,
fallback) and the results. Imports only ``core``.
"""
