"""HTTPS for ``convmem serve``, and the rule that keeps plain HTTP on loopback.

``--tls-cert FILE --tls-key FILE`` make uvicorn serve HTTPS (TLS 1.2 or
later). A renewed certificate is picked up without dropping connections on
``SIGHUP`` (``systemctl reload convmem``): both files are read again, checked
in a fresh TLS context, and only then loaded into the live one, so later
handshakes use the new certificate. If the new files do not load, the error
is logged and the old certificate stays in use. A restart picks it up too.

Binding anything but a loopback address without TLS is refused: site
passwords travel in every request's ``Authorization`` header, readable by
anyone on the path. The way out, when TLS ends at a reverse proxy, is the
explicit ``--insecure-bind`` (with ``--trust-proxy`` naming the proxy, so the
client addresses in logs and throttles are the real ones).
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import ssl
from typing import Any

from .limits import DEFAULT_HANDSHAKE_TIMEOUT

logger = logging.getLogger("convmem.tls")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The TLS and bind options of ``convmem serve`` (each also a ``CONVMEM_*`` variable)."""
    env = os.environ.get
    parser.add_argument(
        "--tls-cert",
        default=env("CONVMEM_TLS_CERT"),
        metavar="FILE",
        help="PEM certificate chain: serve HTTPS; reloaded on SIGHUP (env CONVMEM_TLS_CERT)",
    )
    parser.add_argument(
        "--tls-key",
        default=env("CONVMEM_TLS_KEY"),
        metavar="FILE",
        help="PEM private key of --tls-cert (env CONVMEM_TLS_KEY)",
    )
    parser.add_argument(
        "--tls-handshake-timeout",
        type=float,
        default=float(env("CONVMEM_TLS_HANDSHAKE_TIMEOUT") or DEFAULT_HANDSHAKE_TIMEOUT),
        metavar="SECONDS",
        help="seconds a client has to finish its TLS handshake; a handshake in progress counts against "
        "--max-connections-per-address (env CONVMEM_TLS_HANDSHAKE_TIMEOUT)",
    )
    parser.add_argument(
        "--trust-proxy",
        default=env("CONVMEM_TRUST_PROXY"),
        metavar="ADDRS",
        help="comma-separated addresses of reverse proxies whose X-Forwarded-For/-Proto headers are "
        "believed (env CONVMEM_TRUST_PROXY); by default no forwarded header is believed",
    )
    parser.add_argument(
        "--insecure-bind",
        action="store_true",
        default=os.environ.get("CONVMEM_INSECURE_BIND", "").strip().lower() in ("1", "true", "yes", "on"),
        help="allow plain HTTP on a non-loopback address, for a TLS-terminating reverse proxy "
        "(env CONVMEM_INSECURE_BIND)",
    )


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback IP literals; any other name or address counts as reachable."""
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_options(args: argparse.Namespace) -> str | None:
    """Why these serve options are refused, or None. Reads no files."""
    cert, key = args.tls_cert, args.tls_key
    if bool(cert) != bool(key):
        return "--tls-cert and --tls-key go together: give both (the certificate chain and its private key)"
    if cert or is_loopback(args.host) or args.insecure_bind:
        return None
    return (
        f"refusing to serve plain HTTP on {args.host}, which is not a loopback address: site passwords "
        "would cross the network readable by anyone on the path. Either serve HTTPS with "
        "--tls-cert FILE --tls-key FILE, or put a TLS-terminating reverse proxy in front and start with "
        "--insecure-bind (and --trust-proxy PROXY_ADDRESS so client addresses are the real ones)"
    )


def check_files(cert: str, key: str) -> str | None:
    """Load ``cert``/``key`` into a throwaway context; the error text, or None when they load."""
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        return f"cannot load the TLS certificate {cert} with key {key}: {exc}"
    return None


def uvicorn_options(args: argparse.Namespace) -> dict[str, Any]:
    """Keyword arguments for :class:`uvicorn.Config`: TLS files and which forwarded headers to believe."""
    options: dict[str, Any] = {}
    if args.tls_cert:
        options["ssl_certfile"] = args.tls_cert
        options["ssl_keyfile"] = args.tls_key
    if args.trust_proxy:
        options["proxy_headers"] = True
        options["forwarded_allow_ips"] = [a.strip() for a in args.trust_proxy.split(",") if a.strip()]
    else:
        options["proxy_headers"] = False
    return options


def scheme(args: argparse.Namespace) -> str:
    """``https`` when serving TLS, else ``http`` (for the banner)."""
    return "https" if args.tls_cert else "http"


def reload_certificate(context: ssl.SSLContext | None, cert: str | None, key: str | None) -> bool:
    """Load renewed ``cert``/``key`` into the live ``context`` (SIGHUP). True when it was replaced."""
    if context is None or not cert or not key:
        logger.info("SIGHUP: not serving TLS; nothing to reload")
        return False
    problem = check_files(cert, key)
    if problem is not None:
        logger.error("SIGHUP: %s; still using the previous certificate", problem)
        return False
    context.load_cert_chain(cert, key)
    logger.info("SIGHUP: reloaded the TLS certificate from %s", cert)
    return True
