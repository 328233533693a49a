"""The TLS context that ``auth.Credentials`` call for: whom to trust, who we are, what to check.

Owns: ``context`` (the credentials' CA, else the system's; their client certificate and key,
inline or in files; ``insecure-skip-tls-verify``), each failure an ``auth.Invalid`` that names
the field it came from.

Must not: find or read a kubeconfig (``kubeconfig`` does, and turns ``auth.Invalid`` into a
``ConfigError``) or open a connection (``transport`` does, with this context).
"""

from __future__ import annotations

import ssl
import tempfile
from pathlib import Path

from dra_gpu.kube import auth, errors


def context(found: auth.Credentials) -> ssl.SSLContext | None:
    """TLS as the credentials say: their CA (else the system's), client certificate, checks;
    None for a plain ``http://`` server."""
    if not found.server.startswith("https://"):
        return None
    ca = found.certificate_authority
    try:
        if ca is None:
            tls = ssl.create_default_context()
        elif ca.data is not None:
            pem = b"-----BEGIN" in ca.data
            tls = ssl.create_default_context(cadata=ca.data.decode() if pem else ca.data)
        else:
            tls = ssl.create_default_context(cafile=str(ca.path))
    except (ssl.SSLError, OSError, ValueError) as exc:
        what = ca.what if ca else "the system's CA certificates"
        raise auth.Invalid(f"{what}: no CA certificate in it ({errors.words(exc)})") from None
    cert, key = found.client_certificate, found.client_key
    if cert is not None and key is not None:
        try:
            _load_client_certificate(tls, cert, key)
        except (ssl.SSLError, OSError, ValueError) as exc:
            raise auth.Invalid(
                f"{cert.what} and {key.what}: not a certificate and its key ({errors.words(exc)})"
            ) from None
    if found.insecure_skip_tls_verify:
        tls.check_hostname = False
        tls.verify_mode = ssl.CERT_NONE
    return tls


def _load_client_certificate(tls: ssl.SSLContext, cert: auth.Material, key: auth.Material) -> None:
    """``ssl`` loads certificates from files only: inline ones go through a private temporary
    directory, gone once loaded."""
    with tempfile.TemporaryDirectory(prefix="dra-gpu-tls-") as directory:
        paths = []
        for name, material in (("client.crt", cert), ("client.key", key)):
            if material.path is not None:
                paths.append(str(material.path))
                continue
            path = Path(directory, name)
            path.touch(mode=0o600)
            path.write_bytes(material.data or b"")
            paths.append(str(path))
        tls.load_cert_chain(paths[0], paths[1])
