"""Configuration of the bundles layer (ownership, leader, load reports, shedding)."""

from __future__ import annotations

from dataclasses import dataclass

from common.errors import ConfigError


# The least time a broker fences itself before its lease could expire in etcd (see
# BundlesConfig.fence_after_s): covers the guard's polling (0.25 s) and a loaded event
# loop's lag, so that two brokers never serve one bundle at once.
FENCE_MARGIN_S_MIN = 1.0


@dataclass(frozen=True)
class BundlesConfig:
    # The broker's lease: a dead broker's bundles are free this long after its last
    # keep-alive.
    lease_ttl_s: int = 10
    # A broker that has not heard etcd confirm its lease for this share of the TTL
    # stops serving its bundles: etcd could expire the lease (and give the bundles to
    # another broker) after the full TTL, so the two never serve at once. Until then it
    # goes on serving the topics it has loaded through an etcd outage (docs/
    # architecture.md, "Metadata outages"): 0.9 of 10 s leaves a second (less the
    # guard's 0.25 s polling) before etcd could expire the lease; with refreshes every
    # 0.5 s and reconnects within 0.3 s, an outage of 8 s is ridden through whenever
    # it starts (9 - 0.5 - 0.3, less a refresh's round trip).
    fence_fraction: float = 0.9
    # Load reports are written this often; the leader decides this often.
    report_interval_s: float = 5.0
    leader_interval_s: float = 1.0
    # A leader round or a load report taking longer than this is logged and cancelled
    # (bundles/rounds.py). A round is a few metadata calls (5 s each at most) in the
    # usual case; one per unowned bundle after many brokers died.
    round_timeout_s: float = 30.0
    # How long a request for a topic waits for its bundle to come to this broker (a
    # transfer or assignment in flight) before answering ServiceNotReady.
    ownership_wait_s: float = 10.0
    # An assignment not taken up within this long goes to another broker.
    assignment_timeout_s: float = 15.0
    shedding_enabled: bool = True
    shedding_threshold: float = 0.25
    # A bundle that moved does not move again for this long.
    shedding_cooldown_s: float = 30.0
    # The leader counts a move it ordered as not yet shown in the load reports until
    # both brokers have reported an interval that began this long after the order:
    # time for the release, the clients' reconnects (their back-off starts at 0.1 s)
    # and the burst of messages they held meanwhile (bundles/balancer.py).
    move_settle_s: float = 2.0
    default_bundles: int = 4

    @property
    def fence_after_s(self) -> float:
        """Seconds without a lease confirmation after which the broker fences itself:
        ``fence_fraction`` of the TTL, but never less than ``FENCE_MARGIN_S_MIN`` before
        the TTL (a short TTL's fraction would leave a margin shorter than an event-loop
        hiccup), and never less than a fifth of the TTL."""
        ttl_s = float(self.lease_ttl_s)
        return max(min(ttl_s * self.fence_fraction, ttl_s - FENCE_MARGIN_S_MIN), ttl_s / 5)

    def __post_init__(self) -> None:
        if not 2 <= self.lease_ttl_s <= 300:
            raise ConfigError("lease_ttl_s must be in [2, 300]")
        if not 0.2 <= self.fence_fraction <= 0.95:
            raise ConfigError("fence_fraction must be in [0.2, 0.95]")
        if not 1 <= self.round_timeout_s <= 600:
            raise ConfigError("round_timeout_s must be in [1, 600]")
        if not 0.1 <= self.report_interval_s <= 600 or not 0.05 <= self.leader_interval_s <= 600:
            raise ConfigError("report_interval_s and leader_interval_s must be positive and sane")
        if not 0.5 <= self.ownership_wait_s <= 120:
            raise ConfigError("ownership_wait_s must be in [0.5, 120]")
        if not 0 <= self.move_settle_s <= 600:
            raise ConfigError("move_settle_s must be in [0, 600]")
        if self.shedding_threshold <= 0:
            raise ConfigError("shedding_threshold must be positive")
        if not 1 <= self.default_bundles <= 1024:
            raise ConfigError("default_bundles must be in [1, 1024]")
