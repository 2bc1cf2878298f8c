"""vLLM's CPU build serving a tiny random olmOCR-shaped model: what the vllm test tier and
``bench/real_vllm.py`` share.

    environment   the vLLM virtualenv (``requirements.txt``, cached under ``~/.cache/olmocr-airflow``)
    tiny_model    builds the model, run by that virtualenv's Python (offline, seconds)
    server        starts it through ``olmocr-tasks serve-vllm``, one server at a time; reads its ``/metrics``
"""
