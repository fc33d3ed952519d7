"""``diffaccel serve --api-key``: every route but ``/health`` needs the key (401 in OpenAI's shape
otherwise), checked with the official ``openai`` client against a real server on 127.0.0.1; keys
from the flag and from ``DIFFACCEL_API_KEY``; ``--public-metrics``; the key never in the log."""

from __future__ import annotations

import httpx
import openai
import pytest

from diffaccel.serve.auth import Keys, bearer, keys_from
from diffaccel.serve.launch import start_server

MODEL = '[model]\nadapter = "text"\ncheckpoint = "wordnet-masked"\nlength = 32\nsteps = 8\n'
FLAG_KEY, ENV_KEYS = "sk-flag-0123456789", "sk-env-one,sk-env-two"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = tmp_path_factory.mktemp("auth") / "text.toml"
    path.write_text(MODEL)
    env = {"OMP_NUM_THREADS": "1", "DIFFACCEL_API_KEY": ENV_KEYS}
    with start_server(str(path), "--api-key", FLAG_KEY, "--max-batch", "2", env=env) as s:
        yield s


def _client(server, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0, timeout=60)


def test_the_openai_client_with_the_right_key_generates_and_with_a_wrong_one_gets_401(server):
    for key in (FLAG_KEY, "sk-env-two"):  # the flag's key and the environment's second one
        out = _client(server, key).completions.create(model="wordnet-masked", prompt="a dog", seed=3)
        assert len(out.choices) == 1 and out.choices[0].text.startswith("a dog")
    with pytest.raises(openai.AuthenticationError) as caught:
        _client(server, "sk-flag-012345678").completions.create(model="wordnet-masked", prompt="a dog")  # one char short
    assert caught.value.status_code == 401 and caught.value.code == "invalid_api_key"
    assert caught.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.AuthenticationError):
        _client(server, FLAG_KEY.upper()).models.list()


def test_routes_behind_the_key_and_health_open(server):
    r = httpx.post(f"{server.url}/v1/completions", json={"prompt": "a dog"}, timeout=30)  # no header at all
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    err = r.json()["error"]
    assert err["code"] == "invalid_api_key" and err["param"] is None and "no API key was sent" in err["message"]
    assert httpx.get(f"{server.url}/v1/models", headers={"Authorization": f"Basic {FLAG_KEY}"}, timeout=30).status_code == 401
    assert httpx.get(f"{server.url}/metrics", timeout=30).status_code == 401  # no --public-metrics
    assert httpx.get(f"{server.url}/health", timeout=30).status_code == 200
    ok = httpx.get(f"{server.url}/metrics", headers={"Authorization": f"bearer {FLAG_KEY}"}, timeout=30)
    assert ok.status_code == 200 and 'diffaccel_requests_total{endpoint="/v1/completions",status="401"}' in ok.text
    assert FLAG_KEY not in server.log() and "sk-env" not in server.log() and "3 API key(s)" in server.log()


def test_public_metrics_opens_metrics_only(tmp_path):
    path = tmp_path / "text.toml"
    path.write_text(MODEL)
    with start_server(str(path), "--api-key", FLAG_KEY, "--public-metrics", "--max-batch", "1",
                      env={"OMP_NUM_THREADS": "1"}) as s:
        assert httpx.get(f"{s.url}/metrics", timeout=30).status_code == 200
        assert httpx.get(f"{s.url}/v1/models", timeout=30).status_code == 401


def test_keys_compare_by_digest_and_bad_keys_are_refused():
    keys = Keys(["alpha-1", "beta-2"])
    assert keys.accepts("beta-2") and keys.accepts("alpha-1")
    assert not keys.accepts("alpha-") and not keys.accepts("") and not keys.accepts("alpha-1 ")
    assert bearer([(b"authorization", b"Bearer  tok ")]) == "tok" and bearer([(b"authorization", b"Basic tok")]) is None
    assert keys_from(["a", "b"], {"DIFFACCEL_API_KEY": "b,c"}) == ("a", "b", "c")
    from diffaccel.contract.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^DIFFACCEL_API_KEY \(key 2 of its comma-separated list\): an empty key"):
        keys_from([], {"DIFFACCEL_API_KEY": "a,,b"})
    with pytest.raises(ConfigError, match=r"^--api-key \(number 1\): a key must be printable ASCII") as caught:
        keys_from(["my key"], {})
    assert "my key" not in str(caught.value)  # a key is never printed, even a bad one
