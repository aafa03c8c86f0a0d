"""Who owns a lock: the owner details and the proof of life (judged in ``backends/liveness.py``)."""
