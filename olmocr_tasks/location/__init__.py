"""The output location's layout and what is recorded there.

Ledger, claims, page store, outputs, run folders, manifests (written, read, overview), failure
reports and retention. Imports ``inference`` (GPU-busy values), ``page`` (results), ``storage`` and
``core``.
"""
