"""Storage: the only room that knows Tortoise and SQL."""
