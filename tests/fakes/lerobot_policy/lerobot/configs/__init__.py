"""See lerobot/__init__.py."""
