"""The management UI: Jinja2 pages, templates and static assets (pages arrive with the UI issue)."""
