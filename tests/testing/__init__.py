"""Tests of the test kit itself (the stand-in vLLM server)."""
