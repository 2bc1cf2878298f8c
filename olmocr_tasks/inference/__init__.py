"""Talking to vLLM: the inference client and its policies.

Backpressure, hedging, outages, retries, replicas, readiness, priority classes, vLLM's ``/metrics``
and GPU-busy cost. Imports ``page`` (the protocol) and ``core``.
"""
