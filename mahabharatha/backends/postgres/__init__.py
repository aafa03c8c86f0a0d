"""The PostgreSQL backend: statements, connections, namespaces."""
