"""The ``magnetar`` command line and the wiring shared by every server process."""

__version__ = "0.1.0"
