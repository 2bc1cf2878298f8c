"""The bottom layer, shared by every other: typed errors, settings, secret redaction, the clock.

Imports nothing of ours.
"""
