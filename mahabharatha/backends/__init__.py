"""Where locks live: the folder (the default) or PostgreSQL, behind one interface (``base``)."""
