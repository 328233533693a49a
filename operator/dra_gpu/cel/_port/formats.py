"""Kubernetes' CEL named formats: ``format.dns1123Label().validate(s)`` and friends.

Each format validates like the apimachinery / kube-openapi function upstream calls, with the
same messages (``validate`` returns them as an optional list of strings). Pure; no I/O.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable
from typing import Final

from dra_gpu.cel._port.urls import URLError, _parse
from dra_gpu.cel._port.values import OPTIONAL_NONE, CelError, Optional

__all__ = ["NamedFormat", "named", "validate"]

_LABEL: Final = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_LABEL_MESSAGE: Final = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
    "and must start and end with an alphanumeric character"
)
_SUBDOMAIN: Final = _LABEL + "(\\." + _LABEL + ")*"
_SUBDOMAIN_MESSAGE: Final = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
    "'.', and must start and end with an alphanumeric character"
)
_DNS1035: Final = "[a-z]([-a-z0-9]*[a-z0-9])?"
_DNS1035_MESSAGE: Final = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with "
    "an alphabetic character, and end with an alphanumeric character"
)
_KEY: Final = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_KEY_MESSAGE: Final = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character"
)
_VALUE: Final = "(" + _KEY + ")?"
_VALUE_MESSAGE: Final = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
    "'.', and must start and end with an alphanumeric character"
)
_UUID: Final = re.compile(
    r"[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}", re.IGNORECASE
)
_BASE64: Final = re.compile(
    r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=|[A-Za-z0-9+/]{4})"
)
_DATE: Final = re.compile(r"(\d{4})-(\d{2})-(\d{2})")
_TIME: Final = re.compile(r"([0-9]{2}):([0-9]{2}):([0-9]{2})(.[0-9]+)?(z|([+-][0-9]{2}:[0-9]{2}))")


def _full(pattern: str) -> Callable[[str], bool]:
    compiled = re.compile(pattern)
    return lambda s: compiled.fullmatch(s) is not None and s.isascii()


_is_label = _full(_LABEL)
_is_subdomain = _full(_SUBDOMAIN)
_is_1035 = _full(_DNS1035)
_is_key = _full(_KEY)
_is_value = _full(_VALUE)


def _regex_error(message: str, pattern: str, *examples: str) -> str:
    if not examples:
        return f"{message} (regex used for validation is '{pattern}')"
    shown = " or ".join(f"'{e}', " for e in examples)
    return f"{message} (e.g. {shown}regex used for validation is '{pattern}')"


def _max_len(n: int, unit: str = "characters") -> str:
    return f"must be no more than {n} {unit}"


def _mask_trailing_dash(name: str) -> str:
    if len(name) > 1 and name.endswith("-"):
        return name[:-2] + "a"
    return name


def dns1123_label(value: str) -> list[str]:
    errors = []
    if len(value.encode()) > 63:
        errors.append(_max_len(63))
    if not _is_label(value):
        if _is_subdomain(value):
            errors.append("must not contain dots")
        else:
            errors.append(_regex_error(_LABEL_MESSAGE, _LABEL, "my-name", "123-abc"))
    return errors


def dns1123_subdomain(value: str, unit: str = "characters") -> list[str]:
    errors = []
    if len(value.encode()) > 253:
        errors.append(_max_len(253, unit))
    if not _is_subdomain(value):
        errors.append(_regex_error(_SUBDOMAIN_MESSAGE, _SUBDOMAIN, "example.com"))
    return errors


def dns1035_label(value: str) -> list[str]:
    errors = []
    if len(value.encode()) > 63:
        errors.append(_max_len(63))
    if not _is_1035(value):
        errors.append(_regex_error(_DNS1035_MESSAGE, _DNS1035, "my-name", "abc-123"))
    return errors


def qualified_name(value: str) -> list[str]:
    """content.IsLabelKey (validation.IsQualifiedName)."""
    errors: list[str] = []
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            errors.append("prefix part must be non-empty")
        else:
            errors += [f"prefix part {m}" for m in dns1123_subdomain(prefix, "bytes")]
    else:
        return [
            "a valid label key "
            + _regex_error(_KEY_MESSAGE, _KEY, "MyName", "my.name", "123-abc")
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    if not name:
        errors.append("name part must be non-empty")
    elif len(name.encode()) > 63:
        errors.append("name part " + _max_len(63, "bytes"))
    if not _is_key(name):
        errors.append(
            "name part " + _regex_error(_KEY_MESSAGE, _KEY, "MyName", "my.name", "123-abc")
        )
    return errors


def label_value(value: str) -> list[str]:
    errors = []
    if len(value.encode()) > 63:
        errors.append(_max_len(63, "bytes"))
    if not _is_value(value):
        errors.append(_regex_error(_VALUE_MESSAGE, _VALUE, "MyValue", "my_value", "12345"))
    return errors


def _uri(value: str) -> list[str]:
    try:
        _parse(value.encode(), via_request=True)
    except URLError as error:
        return [f'parse "{value}": {error}']
    return []


def _is_date(value: str) -> bool:
    match = _DATE.fullmatch(value)
    if match is None:
        return False
    try:
        datetime.date(int(match[1]), int(match[2]), int(match[3]))
    except ValueError:
        return False
    return True


def _is_datetime(value: str) -> bool:
    if len(value) < 4:
        return False
    parts = value.lower().split("t")
    if len(parts) < 2 or not _is_date(parts[0]):
        return False
    match = _TIME.fullmatch(parts[1])
    if match is None:
        return False
    return match[1] <= "23" and match[2] <= "59" and match[3] <= "59"


class NamedFormat:
    """A ``kubernetes.NamedFormat`` value; equal by name, as upstream's Format.Equal."""

    __slots__ = ("name", "validator")
    cel_type_name: Final = "kubernetes.NamedFormat"

    def __init__(self, name: str, validator: Callable[[str], list[str]]) -> None:
        self.name = name
        self.validator = validator

    def cel_equal(self, other: object) -> bool:
        if not isinstance(other, NamedFormat):
            raise CelError("no such overload")
        return self.name == other.name


def _check(ok: Callable[[str], bool], message: str) -> Callable[[str], list[str]]:
    return lambda s: [] if ok(s) else [message]


FORMATS: Final = {
    "dns1123Label": NamedFormat("DNS1123Label", dns1123_label),
    "dns1123Subdomain": NamedFormat("DNS1123Subdomain", dns1123_subdomain),
    "dns1035Label": NamedFormat("DNS1035Label", dns1035_label),
    "qualifiedName": NamedFormat("QualifiedName", qualified_name),
    "dns1123LabelPrefix": NamedFormat(
        "DNS1123LabelPrefix", lambda s: dns1123_label(_mask_trailing_dash(s))
    ),
    "dns1123SubdomainPrefix": NamedFormat(
        "DNS1123SubdomainPrefix", lambda s: dns1123_subdomain(_mask_trailing_dash(s))
    ),
    "dns1035LabelPrefix": NamedFormat(
        "DNS1035LabelPrefix", lambda s: dns1035_label(_mask_trailing_dash(s))
    ),
    "labelValue": NamedFormat("LabelValue", label_value),
    "uri": NamedFormat("URI", _uri),
    "uuid": NamedFormat(
        "uuid", _check(lambda s: _UUID.fullmatch(s) is not None, "does not match the UUID format")
    ),
    "byte": NamedFormat(
        "byte", _check(lambda s: _BASE64.fullmatch(s) is not None, "invalid base64")
    ),
    "date": NamedFormat("date", _check(_is_date, "invalid date")),
    "datetime": NamedFormat("datetime", _check(_is_datetime, "invalid datetime")),
}


def named(name: str) -> Optional:
    found = FORMATS.get(name)
    return OPTIONAL_NONE if found is None else Optional(found)


def validate(fmt: NamedFormat, value: str) -> Optional:
    errors = fmt.validator(value)
    return Optional(errors) if errors else OPTIONAL_NONE


def constant(name: str) -> Callable[[], NamedFormat]:
    return lambda: FORMATS[name]
