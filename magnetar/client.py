"""``magnetar.client``: the public asyncio client of Pulsar's protocol (docs/client.md).

The code lives in the ``client`` package (client/api.py and what it builds on), a
storage-layer sibling the gateway and the Spark source import directly; this module
gives users the distribution's own name for it, ``from magnetar.client import Client``,
so nothing user-facing depends on a top-level package named as generically as
``client``."""

from client.api import *  # noqa: F401,F403
from client.api import __all__  # noqa: F401
