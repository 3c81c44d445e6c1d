"""The shared vocabulary of every Magnetar package: the error catalogue, topic and
namespace names, positions (and the entries found there), the entry format, the entry
cache, histogram buckets, the version. It imports nothing of ours and nothing outside
the standard library but ``crc32c`` (the entry digest): what runs (servers, sockets,
tasks, tokens) lives one floor up, in ``runtime/``."""
