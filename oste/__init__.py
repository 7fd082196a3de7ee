"""OSTE, the Open Scheduled Task Engine."""

__version__ = "0.1.0"
