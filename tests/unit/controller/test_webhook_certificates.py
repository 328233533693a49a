"""The webhook's self-issued certificates, with the clock passed in: what is issued verifies
against its CA and names the Service, what falls due when, and a CA rotation that keeps the old
CA trusted until it expires."""

from __future__ import annotations

import datetime

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from dra_gpu.controller.admission import certificates
from dra_gpu.controller.admission.certificates import Stored

NOW = datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)
NAMES = certificates.service_names("dra-gpu-webhook", "dra-gpu")
DAY = datetime.timedelta(days=1)


def _cert(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


def _bundle(stored: Stored) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(certificates.ca_bundle(stored))


def test_service_names_are_the_four_a_client_in_the_cluster_may_use() -> None:
    assert NAMES == (
        "dra-gpu-webhook",
        "dra-gpu-webhook.dra-gpu",
        "dra-gpu-webhook.dra-gpu.svc",
        "dra-gpu-webhook.dra-gpu.svc.cluster.local",
    )


def test_the_ca_is_a_ten_year_p256_ca() -> None:
    ca = certificates.issue_ca(NOW)
    cert = _cert(ca.cert)
    assert cert.subject.rfc4514_string() == "CN=dra-gpu webhook CA"
    public = cert.public_key()
    assert isinstance(public, ec.EllipticCurvePublicKey)
    assert isinstance(public.curve, ec.SECP256R1)
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert cert.not_valid_after_utc - NOW == datetime.timedelta(days=3650)
    assert cert.not_valid_before_utc <= NOW
    cert.verify_directly_issued_by(cert)  # self-signed
    assert certificates.key_matches(ca.cert, ca.key)


def test_a_serving_certificate_verifies_against_its_ca_and_names_the_service() -> None:
    ca = certificates.issue_ca(NOW)
    serving = certificates.issue_serving(ca, NAMES, NOW)
    cert = _cert(serving.cert)
    cert.verify_directly_issued_by(_cert(ca.cert))
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == list(NAMES)
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert cert.not_valid_after_utc - NOW == datetime.timedelta(days=365)
    assert certificates.key_matches(serving.cert, serving.key)
    assert not certificates.key_matches(serving.cert, ca.key)
    assert certificates.issued_by(serving.cert, ca.cert)
    assert not certificates.issued_by(serving.cert, certificates.issue_ca(NOW).cert)


def test_renewal_is_due_when_less_than_a_third_of_the_lifetime_is_left() -> None:
    serving = certificates.issue_serving(certificates.issue_ca(NOW), NAMES, NOW)
    # One year (and the five minutes it starts early): due about 122 days before the end.
    assert not certificates.renewal_due(serving.cert, NOW, NAMES)
    assert not certificates.renewal_due(serving.cert, NOW + 242 * DAY, NAMES)
    assert certificates.renewal_due(serving.cert, NOW + 244 * DAY, NAMES)
    assert certificates.renewal_due(serving.cert, NOW + 400 * DAY, NAMES)  # expired


def test_renewal_is_due_when_the_sans_miss_a_wanted_name() -> None:
    serving = certificates.issue_serving(certificates.issue_ca(NOW), NAMES[:2], NOW)
    assert not certificates.renewal_due(serving.cert, NOW, NAMES[:2])
    assert certificates.renewal_due(serving.cert, NOW, NAMES)
    renamed = certificates.service_names("other", "dra-gpu")
    assert certificates.renewal_due(serving.cert, NOW, renamed)


@pytest.mark.parametrize("pem", [b"", b"garbage", b"-----BEGIN CERTIFICATE-----\nAAAA\n"])
def test_what_does_not_parse_is_due_and_matches_no_key(pem: bytes) -> None:
    ca = certificates.issue_ca(NOW)
    assert certificates.renewal_due(pem, NOW)
    assert not certificates.key_matches(pem, ca.key)
    assert not certificates.key_matches(ca.cert, pem)
    assert not certificates.issued_by(pem, ca.cert)


def test_renew_issues_everything_when_nothing_is_stored() -> None:
    stored = certificates.renew(None, NAMES, NOW)
    (ca,) = _bundle(stored)
    _cert(stored.cert).verify_directly_issued_by(ca)
    assert certificates.key_matches(stored.cert, stored.key)
    assert certificates.key_matches(certificates.ca_bundle(stored), stored.ca_key)


def test_renew_keeps_what_is_not_due_as_it_is() -> None:
    stored = certificates.renew(None, NAMES, NOW)
    assert certificates.renew(stored, NAMES, NOW + 200 * DAY) is stored


def test_renew_reissues_a_due_serving_certificate_with_the_same_ca() -> None:
    stored = certificates.renew(None, NAMES, NOW)
    later = certificates.renew(stored, NAMES, NOW + 250 * DAY)
    assert later.cert != stored.cert
    assert later.key != stored.key
    assert (later.bundle, later.ca_key) == (stored.bundle, stored.ca_key)
    assert not certificates.renewal_due(later.cert, NOW + 250 * DAY, NAMES)
    assert certificates.issued_by(later.cert, stored.bundle)


def test_renew_reissues_for_new_names_and_for_a_garbled_serving_pair() -> None:
    stored = certificates.renew(None, NAMES, NOW)
    renamed = certificates.service_names("renamed", "dra-gpu")
    assert not certificates.renewal_due(certificates.renew(stored, renamed, NOW).cert, NOW, renamed)
    other_key = certificates.issue_ca(NOW).key
    for broken in (
        Stored(b"junk", stored.key, stored.bundle, stored.ca_key),
        Stored(stored.cert, other_key, stored.bundle, stored.ca_key),
    ):
        fixed = certificates.renew(broken, NAMES, NOW)
        assert certificates.key_matches(fixed.cert, fixed.key)
        assert certificates.issued_by(fixed.cert, stored.bundle)
        assert fixed.bundle == stored.bundle


def test_a_serving_certificate_of_another_ca_is_reissued_by_the_current_one() -> None:
    stored = certificates.renew(None, NAMES, NOW)
    stranger = certificates.issue_serving(certificates.issue_ca(NOW), NAMES, NOW)
    fixed = certificates.renew(
        Stored(stranger.cert, stranger.key, stored.bundle, stored.ca_key), NAMES, NOW
    )
    assert certificates.issued_by(fixed.cert, stored.bundle)


def test_ca_rotation_keeps_the_old_ca_in_the_bundle_until_it_expires() -> None:
    first = certificates.renew(None, NAMES, NOW)
    (old_ca,) = _bundle(first)
    due = NOW + 2500 * DAY  # about 6.8 years: less than a third of ten years left
    rotated = certificates.renew(first, NAMES, due)
    old, new = _bundle(rotated)  # old first, the new (current) one last
    assert old == old_ca
    assert new != old_ca
    assert certificates.key_matches(new.public_bytes(serialization.Encoding.PEM), rotated.ca_key)
    _cert(rotated.cert).verify_directly_issued_by(new)  # the serving certificate moved over
    # A client that trusts only the old CA still verifies a certificate the old CA issued,
    # and the bundle it is given next trusts both.
    assert certificates.renew(rotated, NAMES, due + DAY) is rotated
    # Once the old CA has expired it leaves the bundle; the new one stays.
    after = NOW + 3651 * DAY
    pruned = certificates.renew(rotated, NAMES, after)
    assert _bundle(pruned) == [new]
    assert pruned.ca_key == rotated.ca_key


def test_a_ca_key_matching_no_bundled_ca_starts_a_new_ca_and_keeps_the_old_ones() -> None:
    first = certificates.renew(None, NAMES, NOW)
    lost = Stored(first.cert, first.key, first.bundle, b"")
    fresh = certificates.renew(lost, NAMES, NOW)
    old, new = _bundle(fresh)
    assert old == _bundle(first)[0]
    _cert(fresh.cert).verify_directly_issued_by(new)


def test_a_garbled_bundle_starts_over() -> None:
    first = certificates.renew(None, NAMES, NOW)
    fresh = certificates.renew(Stored(first.cert, first.key, b"junk", first.ca_key), NAMES, NOW)
    (ca,) = _bundle(fresh)
    _cert(fresh.cert).verify_directly_issued_by(ca)
