"""``lock run``: a command held under a lock, and its process tree."""
