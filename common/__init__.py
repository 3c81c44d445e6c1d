"""The shared vocabulary of every Magnetar package: the error catalogue, topic and
namespace names, positions, the entry format, task ownership helpers, the version.
It imports nothing of ours."""
