"""The gateway's callers by provider (gateway/auth.py ``caller_of``), without a broker.

Proves: Bearer and Basic credentials are passed on as they came (each only when its
provider is on), with distinct cache digests; without an Authorization header a
verified client certificate names its CN as the original principal, asked about with
the gateway's service token (only with the tls provider); anything else is 401; and
GatewayConfig refuses a tls provider without HTTPS client-certificate trust or a
service token.
"""

from __future__ import annotations

import base64
from unittest import mock

import pytest
from aiohttp.test_utils import make_mocked_request

from common.errors import AuthenticationFailed, ConfigError
from runtime.tls import TlsConfig
from gateway.app import default_config
from gateway.auth import caller_of

ALL = frozenset({"token", "basic", "tls"})
CERTIFICATE = {"subject": ((("commonName", "device-7"),),)}


def _request(authorization: str | None = None, certificate: dict | None = None):
    transport = mock.Mock()
    transport.get_extra_info = lambda name, default=None: certificate if name == "peercert" else default
    headers = {"Authorization": authorization} if authorization is not None else {}
    return make_mocked_request("POST", "/v1/topics/persistent/public/default/t/message", headers=headers,
                               transport=transport)


def test_each_provider_and_its_refusals():
    basic = "Basic " + base64.b64encode(b"user:pw").decode()
    digest_token, header, principal = caller_of(_request("Bearer abc"), ALL, "service")
    assert (header, principal) == ("Bearer abc", None)
    digest_basic, header, principal = caller_of(_request(basic), ALL, "service")
    assert (header, principal) == (basic, None) and digest_basic != digest_token
    digest_tls, header, principal = caller_of(_request(certificate=CERTIFICATE), ALL, "service")
    assert (header, principal) == ("Bearer service", "device-7") and digest_tls not in (digest_token, digest_basic)
    # A header wins over a certificate.
    assert caller_of(_request("Bearer abc", CERTIFICATE), ALL, "service")[2] is None
    for request, providers in ((_request(basic), frozenset({"token"})),
                               (_request("Bearer abc"), frozenset({"basic"})),
                               (_request(certificate=CERTIFICATE), frozenset({"token", "basic"})),
                               (_request(), ALL), (_request("Digest x"), ALL), (_request("Bearer "), ALL)):
        with pytest.raises(AuthenticationFailed):
            caller_of(request, providers, "service")


def test_config_needs_client_certificate_trust_and_a_service_token_for_tls(tmp_path):
    https = TlsConfig(cert_file="c.pem", key_file="k.pem", trust_certs_file="ca.pem")
    default_config(authentication_enabled=True, authentication_providers="token,basic,tls", tls=https,
                   service_token="t")
    with pytest.raises(ConfigError, match="trust_certs_file"):
        default_config(authentication_enabled=True, authentication_providers="tls", service_token="t")
    with pytest.raises(ConfigError, match="service token"):
        default_config(authentication_enabled=True, authentication_providers="tls", tls=https)
    with pytest.raises(ConfigError, match="authentication_providers"):
        default_config(authentication_providers="token,kerberos")
