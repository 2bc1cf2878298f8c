"""Inference servers we start ourselves: the Tesseract CPU engine and the vLLM launcher.

Imports ``inference`` (metrics, readiness), ``page`` (the protocol) and ``core``; only ``cli``
imports it.
"""
