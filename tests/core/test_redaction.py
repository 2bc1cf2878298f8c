"""One redaction function (``olmocr_tasks.core.redaction.redact``) for storage errors, logs, manifests and
the runs page: examples of each rule, then properties over generated URLs, headers and fields that no
secret survives, whatever its characters, and that ordinary locations come back unchanged."""

from __future__ import annotations

import json
import logging
import string
import time

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from olmocr_tasks.core.redaction import (
    SECRET_ENVIRONMENT_VARIABLES,
    RedactingFilter,
    environment_secrets,
    is_secret_name,
    redact,
    redact_url,
    secret_values,
)


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("api_key", True),
        ("aws_secret_access_key", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("aws_session_token", True),
        ("key", True),
        ("username", True),
        ("Authorization", True),
        ("secretAccessKey", True),
        ("sessionToken", True),
        ("SessionToken", True),
        ("apiKey", True),
        ("APIKey", True),
        ("X-Amz-Signature", True),
        ("X-Amz-Credential", True),
        ("X-Amz-Security-Token", True),
        ("accesstoken", True),
        ("client-secret", True),
        ("max_tokens", False),
        ("input_tokens", False),
        ("api_key_set", False),
        ("apiKeySet", False),
        ("endpoint_url", False),
        ("keyword", False),
        ("batch_keys", False),
        ("X-Amz-Date", False),
    ],
)
def test_secret_names_are_whole_name_parts_in_any_case(name: str, secret: bool) -> None:
    assert is_secret_name(name) is secret


def test_secret_values_are_found_in_nested_storage_options() -> None:
    options = {
        "key": "AKIAEXAMPLE",
        "secret": "s3cr3t-value",
        "client_kwargs": {"endpoint_url": "http://minio:9000", "aws_session_token": "session-token"},
        "config_kwargs": {"s3": {"addressing_style": "path"}},
        "anon": False,
    }
    assert sorted(secret_values(options)) == ["AKIAEXAMPLE", "s3cr3t-value", "session-token"]


def test_every_credential_variable_is_read() -> None:
    environ = {name: f"value-of-{name}" for name in SECRET_ENVIRONMENT_VARIABLES}
    assert environment_secrets(environ) == list(environ.values())
    assert "AWS_SECURITY_TOKEN" in SECRET_ENVIRONMENT_VARIABLES


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://user:hunter22@minio:9000/b/x", "http://***@minio:9000/b/x"),
        # Passwords holding what ends an authority for a URL parser, or more @.
        ("https://user:pa/ss@vllm:8000/v1", "https://***@vllm:8000/v1"),
        ("https://user:p#ss@vllm/v1", "https://***@vllm/v1"),
        ("https://user:p?ss@vllm/v1", "https://***@vllm/v1"),
        ("https://u:p@ss@h/v1", "https://***@h/v1"),
        ("https://user:12/34@vllm/v1", "https://***@vllm/v1"),
        ("https://sk-token@vllm/v1", "https://***@vllm/v1"),
        ("redis://:redis-pass@redis:6379/0", "redis://***@redis:6379/0"),
        # A non-numeric port, no host: nothing to remove, and no exception.
        ("http://vllm:port/v1", "http://vllm:port/v1"),
        ("http://[::1/v1", "http://[::1/v1"),
        ("https://", "https://"),
        # Secret-looking query and fragment parameters keep their names only.
        ("https://h/v1?api_key=abc123&page=2", "https://h/v1?api_key=***&page=2"),
        ("https://h/cb#access_token=abc123&state=x", "https://h/cb#access_token=***&state=x"),
        (
            "https://b.s3.amazonaws.com/k.pdf?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIA%2F20260101"
            "&X-Amz-Date=20260101T000000Z&X-Amz-Security-Token=FQo&X-Amz-Signature=deadbeef",
            "https://b.s3.amazonaws.com/k.pdf?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=***"
            "&X-Amz-Date=20260101T000000Z&X-Amz-Security-Token=***&X-Amz-Signature=***",
        ),
        # Object names are names: their @, ? and = are not user-info or queries.
        ("s3://bucket/people/me@example.com/a.pdf", "s3://bucket/people/me@example.com/a.pdf"),
        ("s3://bucket/in/report?token=1.pdf", "s3://bucket/in/report?token=1.pdf"),
        ("s3://key:pw@bucket/k", "s3://***@bucket/k"),
        ("not a url", "not a url"),
    ],
)
def test_urls_lose_user_info_of_any_shape_and_secret_parameters(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    assert redact(url) == shown


def test_texts_lose_urls_headers_tokens_and_secret_named_values() -> None:
    text = (
        "PUT http://user:hunter22@minio:9000/b/x failed; see s3://key:pw@bucket/k\n"
        "headers: {'Authorization': 'Basic dXNlcjpodW50ZXIy', 'X-Amz-Security-Token': 'FQoGZXIvYXdz'}\n"
        "Authorization: Bearer sk-live-123\n"
        "retrying with bearer eyJhbGciOi.payload.sig; aws_secret_access_key=wJalrXUtnFEMI sessionToken: IQoJb3Jp\n"
        'body {"apiKey": "k-123456", "max_tokens": 8000} Basic checks passed'
    )
    shown = redact(text)
    for secret in ("hunter22", ":pw@", "dXNlcjpodW50ZXIy", "FQoGZXIvYXdz", "sk-live-123", "eyJhbGciOi"):
        assert secret not in shown
    for secret in ("wJalrXUtnFEMI", "IQoJb3Jp", "k-123456"):
        assert secret not in shown
    # What is not secret stays readable.
    assert "http://***@minio:9000/b/x" in shown and "s3://***@bucket/k" in shown
    assert '"max_tokens": 8000' in shown and "Basic checks passed" in shown


def test_known_secret_values_are_removed_wherever_they_appear() -> None:
    text = "KeyError: 'sk-canary-1234' while reading s3://b/k (short values like 'ab' are left)"
    assert redact(text, ["sk-canary-1234", "ab", None]) == (
        "KeyError: '***' while reading s3://b/k (short values like 'ab' are left)"
    )


def test_fields_hide_secret_values_and_url_passwords() -> None:
    server = {
        "base_urls": ["http://user:hunter2@vllm:8000/v1"],
        "api_key": "sk-live",
        "max_tokens": 8000,
        "storage": {"secretAccessKey": "wJalr", "sessionToken": "IQoJ", "endpoint_url": "http://minio:9000"},
        "api_key_set": True,
    }
    assert redact(server) == {
        "base_urls": ["http://***@vllm:8000/v1"],
        "api_key": "***",
        "max_tokens": 8000,
        "storage": {"secretAccessKey": "***", "sessionToken": "***", "endpoint_url": "http://minio:9000"},
        "api_key_set": True,
    }


def test_log_records_are_redacted_by_the_same_rules(caplog: pytest.LogCaptureFixture) -> None:
    record = logging.LogRecord(
        "botocore", logging.DEBUG, __file__, 1, "GET %s with %s", ("https://u:p/w@h/x?token=zz", "Bearer abc.def"), None
    )
    assert RedactingFilter(["never-seen"]).filter(record)
    assert record.getMessage() == "GET https://***@h/x?token=*** with Bearer ***"


# ------------------------------------------------------------------------------- properties

# Secrets carry a marker no generated host, path or name contains, so "the secret is not in the output"
# cannot be satisfied by chance; their other characters are any a careless writer leaves unescaped.
_MARK = "Zq9"
_SECRET_TAIL = st.text(
    alphabet=string.ascii_letters + string.digits + "/#?@:;=&+-._~!$%*()[],", min_size=4, max_size=24
)
SECRETS = st.builds(lambda tail: _MARK + tail, _SECRET_TAIL)
# Hosts, paths and plain values never hold the marker (lower-case letters, digits and a few signs).
HOSTS = st.from_regex(r"[a-z][a-z0-9-]{0,12}(\.[a-z][a-z0-9-]{0,8}){0,2}", fullmatch=True)
PORTS = st.one_of(st.just(""), st.integers(1, 65535).map(lambda port: f":{port}"))
PATHS = st.from_regex(r"(/[a-z0-9._-]{0,10}){0,4}", fullmatch=True)
SCHEMES = st.sampled_from(["http", "https", "redis", "postgresql+psycopg2", "s3", "ftp"])
USERS = st.from_regex(r"[a-z0-9._-]{0,10}", fullmatch=True)
PLAIN = st.from_regex(r"[a-z0-9 ._/-]{0,20}", fullmatch=True)


def _secret_spellings(words: list[str]) -> list[str]:
    """A secret name written as snake, kebab, camel, Pascal and upper case."""
    lower = [word.lower() for word in words]
    return [
        "_".join(lower),
        "-".join(lower),
        lower[0] + "".join(word.title() for word in lower[1:]),
        "".join(word.title() for word in lower),
        "_".join(lower).upper(),
        "-".join(word.title() for word in lower),
    ]


SECRET_NAMES = st.sampled_from(
    [
        spelling
        for words in (
            ["api", "key"],
            ["secret", "access", "key"],
            ["session", "token"],
            ["aws", "secret", "access", "key"],
            ["x", "amz", "signature"],
            ["x", "amz", "credential"],
            ["x", "amz", "security", "token"],
            ["access", "token"],
            ["password"],
            ["client", "secret"],
            ["authorization"],
            ["private", "key"],
        )
        for spelling in _secret_spellings(words)
    ]
)
PLAIN_NAMES = st.sampled_from(["page", "max_tokens", "model", "region_name", "endpoint_url", "state", "x_amz_date"])


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(scheme=SCHEMES, user=USERS, password=SECRETS, host=HOSTS, port=PORTS, path=PATHS)
@example(scheme="https", user="user", password=_MARK + "/#?@x", host="vllm", port=":8000", path="/v1")
@example(scheme="https", user="u", password=_MARK + "1/2", host="h", port="", path="")
def test_no_password_survives_a_url(scheme: str, user: str, password: str, host: str, port: str, path: str) -> None:
    url = f"{scheme}://{user}:{password}@{host}{port}{path}"
    shown = redact_url(url)
    assert password not in shown
    assert _MARK not in shown, f"part of the password survived: {shown}"
    assert shown.endswith(f"@{host}{port}{path}"), "the host and path stay readable"


@settings(max_examples=150)
@given(scheme=SCHEMES, token=SECRETS, host=HOSTS, path=PATHS)
def test_no_token_user_name_survives_a_url(scheme: str, token: str, host: str, path: str) -> None:
    token = token.replace("/", "").replace("?", "").replace("#", "")  # a user name ends at the path
    url = f"{scheme}://{token}@{host}{path}"
    assert _MARK not in redact_url(url)


@settings(max_examples=150)
@given(
    host=HOSTS,
    path=PATHS,
    params=st.lists(st.tuples(st.one_of(SECRET_NAMES, PLAIN_NAMES), st.booleans()), min_size=1, max_size=5),
    fragment=st.booleans(),
    secret=st.from_regex(r"[A-Za-z0-9%._~+/-]{4,16}", fullmatch=True),
)
def test_no_secret_parameter_value_survives_a_web_url(
    host: str, path: str, params: list[tuple[str, bool]], fragment: bool, secret: str
) -> None:
    value = _MARK + secret
    query = "&".join(f"{name}={value if is_secret_name(name) else 'plain'}" for name, _ in params)
    url = f"https://{host}{path}{'#' if fragment else '?'}{query}"
    shown = redact_url(url)
    assert _MARK not in shown
    for name, _ in params:
        assert f"{name}=" in shown, "parameter names stay"
        if not is_secret_name(name):
            assert f"{name}=plain" in shown


@settings(max_examples=150)
@given(name=SECRET_NAMES, secret=SECRETS, prefix=PLAIN, style=st.sampled_from(["{n}={v}", "{n}: {v}", '"{n}": "{v}"']))
def test_no_secret_named_value_survives_a_text(name: str, secret: str, prefix: str, style: str) -> None:
    # In prose a value ends at a space, a quote or a separator: the generated one has none of those.
    value = _MARK + "".join(char for char in secret[len(_MARK) :] if char not in " \"',;&}]")
    text = f"{prefix} {style.format(n=name, v=value)} and more"
    assert _MARK not in redact(text)


@settings(max_examples=100)
@given(
    tree=st.recursive(
        st.one_of(PLAIN, st.integers(), st.booleans(), st.none()),
        lambda children: st.one_of(
            st.lists(children, max_size=3),
            st.dictionaries(st.one_of(PLAIN_NAMES, SECRET_NAMES), children, max_size=4),
        ),
        max_leaves=12,
    ),
    planted=st.lists(st.tuples(SECRET_NAMES, SECRETS), min_size=1, max_size=3),
)
def test_no_secret_field_survives_a_nested_mapping(tree: object, planted: list[tuple[str, str]]) -> None:
    data = {"nested": {"deeper": [tree, dict(planted)]}, **dict(planted)}
    shown = redact(data)
    assert _MARK not in json.dumps(shown)
    assert redact(shown) == shown, "redacting twice changes nothing"


@settings(max_examples=150)
@given(scheme=st.sampled_from(["http", "https", "s3"]), host=HOSTS, port=PORTS, path=PATHS)
def test_urls_without_secrets_come_back_unchanged(scheme: str, host: str, port: str, path: str) -> None:
    url = f"{scheme}://{host}{'' if scheme == 's3' else port}{path}"
    assert redact_url(url) == url
    assert redact(f"GET {url} returned 404") == f"GET {url} returned 404"


@settings(max_examples=100)
@given(bucket=HOSTS, key=st.text(alphabet=string.ascii_letters + string.digits + "@?=&#:;/._-", max_size=40))
def test_object_names_are_never_changed(bucket: str, key: str) -> None:
    uri = f"s3://{bucket}/{key}"
    # Only a user-info part before the bucket is removed; a key is a name, whatever it holds.
    assert redact_url(uri) == uri


@pytest.mark.parametrize(
    "text",
    [
        "x" * 4_000_000,  # one long word: no pattern may be tried at each of its positions
        "a" * 2_000_000 + "://",
        "@" * 1_000_000,
        "key=" * 500_000,
        "https://h/?" + "a=b&" * 200_000,
    ],
    ids=["word", "scheme", "ats", "pairs", "params"],
)
def test_redaction_takes_time_in_proportion_to_the_text(text: str) -> None:
    """An error text of megabytes (a manifest allows entries of up to 8 MiB) is redacted in seconds: a
    pattern that backtracked over each position of a long word would take hours."""
    started = time.monotonic()
    redact(text)
    assert time.monotonic() - started < 20
