"""The ``magnetar`` command line and the wiring shared by every server process."""
