"""`--model org/name[@revision]` read from the Hub through huggingface_hub: only config.json is fetched, into the
standard cache, and every way it can fail (offline, unknown, gated, no config.json) says what to do.

A local aiohttp server stands in for the Hub (HF_ENDPOINT); it answers as the Hub does for `/resolve/` URLs
(ETag, X-Repo-Commit, X-Error-Code) and records what was asked of it."""

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web

from exporter.catalog import find_model_preset
from exporter.cli import main
from tests.support.daemon_process import app_in_thread

# A real config.json, the one shipped as exporter/data/models/qwen3-8b.json (its source named in its `_preset`
# block, which the Hub's copy does not have), served under a name that is no preset.
SERVED = dict(find_model_preset("qwen3-8b").config)
SERVED_BYTES = json.dumps(SERVED, indent=2).encode()
COMMIT = "a" * 40
TOKEN = "hf_plimsoll_test_token_never_shown"


@dataclass
class FakeHub:
    """What each repository answers, and every request it saw (method, raw path, Authorization header)."""

    files: dict[str, bytes] = field(default_factory=dict)  # repo id -> its config.json
    refusals: dict[str, tuple[int, str]] = field(default_factory=dict)  # repo id -> (status, X-Error-Code)
    seen: list[tuple[str, str, str]] = field(default_factory=list)  # file requests only, not the library's others
    hung: set[str] = field(default_factory=set)  # repo ids whose requests get no answer until `release` is set
    release: threading.Event = field(default_factory=threading.Event)

    async def answer(self, request: web.Request) -> web.Response:
        parts = request.raw_path.lstrip("/").split("/")
        if len(parts) < 5 or parts[2] != "resolve":  # huggingface_hub also asks /api/... for its user agent
            return web.Response(status=404)
        self.seen.append((request.method, request.raw_path, request.headers.get("Authorization", "")))
        org, name, _resolve, _revision, *filename = parts
        repo_id = f"{org}/{name}"
        if repo_id in self.hung:
            await asyncio.to_thread(self.release.wait)
        if repo_id in self.refusals:
            status, code = self.refusals[repo_id]
            # Retry-After 0: the library's retries of a 5xx take a second each, not its 24 s of backoff
            headers = {"X-Error-Code": code, "X-Repo-Commit": COMMIT, "Retry-After": "0"}
            return web.Response(status=status, headers=headers)
        if repo_id not in self.files or filename != ["config.json"]:
            return web.Response(status=404, headers={"X-Error-Code": "EntryNotFound", "X-Repo-Commit": COMMIT})
        body = self.files[repo_id]
        headers = {"ETag": f'"{hashlib.sha1(body).hexdigest()}"', "X-Repo-Commit": COMMIT}
        return web.Response(body=body, headers=headers, content_type="application/json")


@pytest.fixture
def hub() -> Iterator[tuple[FakeHub, str]]:
    fake = FakeHub(files={"someorg/served-model": SERVED_BYTES})
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", fake.answer)
    with app_in_thread(app) as url:
        yield fake, url


def plimsoll(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    """The real CLI in a process of its own: huggingface_hub reads HF_ENDPOINT and HF_HUB_OFFLINE once, at import,
    so a test in this process would see whatever the first import saw."""
    command = [sys.executable, "-c", "import sys; from exporter.cli import main; sys.exit(main(sys.argv[1:]))"]
    return subprocess.run([*command, *argv], env=env, capture_output=True, text=True, timeout=60, check=False)


def hub_env(home: Path, **extra: str) -> dict[str, str]:
    """This environment without the developer's own Hugging Face settings, its cache under `home`. The library's
    10 s waits for an answer are lengthened: on a busy machine the stand-in Hub, a thread of the test process, can
    be slower than that, and a timeout there would fail the test for the machine's load, not the code."""
    names = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN", "HF_ENDPOINT", "HF_HUB_CACHE")
    patient = {"HF_HUB_ETAG_TIMEOUT": "60", "HF_HUB_DOWNLOAD_TIMEOUT": "60"}
    return {**{k: v for k, v in os.environ.items() if k not in names}, "HF_HOME": str(home), **patient, **extra}


def plan_json(env: dict[str, str], model: str) -> dict:
    result = plimsoll(env, "plan", "--model", model, "--gpu", "H100", "--format", "json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def preset_kv_bytes_per_token(capsys) -> int:
    assert main(["plan", "--model", "qwen3-8b", "--gpu", "H100", "--format", "json"]) == 0
    return int(json.loads(capsys.readouterr().out)["kv_bytes_per_token"])


def test_a_model_from_the_hub_fetches_only_its_config_json_and_a_second_run_is_offline(capsys, hub, tmp_path):
    fake, url = hub
    answer = plan_json(hub_env(tmp_path, HF_ENDPOINT=url), "someorg/served-model")
    assert answer["model"] == "someorg/served-model"
    assert answer["kv_bytes_per_token"] == preset_kv_bytes_per_token(capsys)
    assert fake.seen and all(path == "/someorg/served-model/resolve/main/config.json" for _, path, _ in fake.seen)
    cached = tmp_path / "hub" / "models--someorg--served-model" / "snapshots" / COMMIT / "config.json"
    assert cached.read_bytes() == SERVED_BYTES  # the standard cache layout, so every Hugging Face tool reuses it

    asked = len(fake.seen)
    offline = hub_env(tmp_path, HF_ENDPOINT=url, HF_HUB_OFFLINE="1")
    assert plan_json(offline, "someorg/served-model")["kv_bytes_per_token"] == answer["kv_bytes_per_token"]
    assert len(fake.seen) == asked


@pytest.mark.parametrize(("revision", "in_url"), [("v2.0", "v2.0"), ("refs/pr/1", "refs%2Fpr%2F1")])
def test_a_revision_reaches_the_hub_and_is_cached_under_its_name(hub, tmp_path, revision, in_url):
    fake, url = hub
    model = f"someorg/served-model@{revision}"
    assert plan_json(hub_env(tmp_path, HF_ENDPOINT=url), model)["model"] == model
    assert {path for _, path, _ in fake.seen} == {f"/someorg/served-model/resolve/{in_url}/config.json"}

    asked = len(fake.seen)
    assert plan_json(hub_env(tmp_path, HF_ENDPOINT=url, HF_HUB_OFFLINE="1"), model)["model"] == model
    assert len(fake.seen) == asked


def fill_cache_as_the_library_does(cache: Path, repo_id: str, body: bytes, revision: str) -> None:
    """blobs/<etag>, snapshots/<commit>/config.json linking to it, refs/<revision> naming the commit."""
    folder = cache / f"models--{repo_id.replace('/', '--')}"
    blob = folder / "blobs" / hashlib.sha1(body).hexdigest()
    blob.parent.mkdir(parents=True)
    blob.write_bytes(body)
    snapshot = folder / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").symlink_to(Path("..", "..", "blobs", blob.name))
    (folder / "refs").mkdir()
    (folder / "refs" / revision).write_text(COMMIT)


@pytest.mark.parametrize("variable", ["HF_HOME", "HF_HUB_CACHE"])
def test_a_prefilled_cache_answers_offline_at_a_revision(capsys, tmp_path, monkeypatch, variable):
    for name in ("HF_HUB_CACHE", "HF_ENDPOINT", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    cache = tmp_path / "home" / "hub"
    if variable == "HF_HUB_CACHE":
        cache = tmp_path / "elsewhere"
        monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    fill_cache_as_the_library_does(cache, "someorg/cached-model", SERVED_BYTES, revision="v1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    expected = preset_kv_bytes_per_token(capsys)
    assert main(["plan", "--model", "someorg/cached-model@v1", "--gpu", "H100", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["kv_bytes_per_token"] == expected


def test_a_config_json_too_large_to_be_one_is_refused(hub, tmp_path):
    fake, url = hub
    fake.files["someorg/huge"] = b"{" + b" " * (4 * 1024 * 1024) + b"}"
    result = plimsoll(hub_env(tmp_path, HF_ENDPOINT=url), "plan", "--model", "someorg/huge", "--gpu", "H100")
    assert result.returncode == 2 and "is 4,194,306 bytes, too large for a config.json" in result.stderr
    written = [p for p in (tmp_path / "hub" / "models--someorg--huge").rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in written) < 1024  # refused by its size before a byte of it was written


def test_a_hub_that_never_answers_is_given_up_on_at_three_times_the_librarys_timeouts(hub, tmp_path):
    fake, url = hub
    fake.hung.add("someorg/served-model")
    env = hub_env(tmp_path, HF_ENDPOINT=url, HF_HUB_ETAG_TIMEOUT="1", HF_HUB_DOWNLOAD_TIMEOUT="1")
    try:
        result = plimsoll(env, "plan", "--model", "someorg/served-model", "--gpu", "H100")
    finally:
        fake.release.set()
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"plimsoll plan: model 'someorg/served-model': the Hub ({url}) gave no config.json within 6 s: try again "
        "later, or pass the model's config.json by path"
    ]


@pytest.mark.parametrize(
    ("repo_id", "status", "code", "says"),
    [
        ("someorg/absent", 404, "RepoNotFound", "not a repository on the Hub"),
        ("someorg/gated", 401, "GatedRepo", "is gated on the Hub: accept its licence"),
        ("someorg/forbidden", 403, "", "answered HTTP 403: set HF_TOKEN, or accept the model's licence"),
        ("someorg/gguf-only", 404, "EntryNotFound", "has no config.json on the Hub (a GGUF-only repository?)"),
        ("someorg/served-model@nope", 404, "RevisionNotFound", "has no such revision"),
        ("someorg/down", 503, "", "answered HTTP 503: try again later"),
    ],
)
def test_what_the_hub_refuses_is_one_line_that_says_what_to_do(hub, tmp_path, repo_id, status, code, says):
    fake, url = hub
    fake.refusals[repo_id.partition("@")[0]] = (status, code)
    result = plimsoll(hub_env(tmp_path, HF_ENDPOINT=url, HF_TOKEN=TOKEN), "plan", "--model", repo_id, "--gpu", "H100")
    assert result.returncode == 2
    [error] = result.stderr.strip().splitlines()  # one line: the library's retry warnings are not shown
    assert error.startswith("plimsoll plan: model ") and says in error, result.stderr
    assert "Traceback" not in result.stderr and TOKEN not in result.stderr
    assert {auth for _, _, auth in fake.seen} == {f"Bearer {TOKEN}"}  # HF_TOKEN is sent, never shown
    assert not any(path.endswith(".safetensors") for _, path, _ in fake.seen)


def test_offline_with_an_empty_cache_names_the_folder_to_fill_and_the_command_that_fills_it(tmp_path):
    env = hub_env(tmp_path, HF_HUB_OFFLINE="1", HF_ENDPOINT="http://127.0.0.1:9")
    result = plimsoll(env, "plan", "--model", "someorg/not-here@v3", "--gpu", "H100")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        "plimsoll plan: model 'someorg/not-here@v3' is not a preset and not in the Hugging Face cache, and "
        f"HF_HUB_OFFLINE is set: fill {tmp_path / 'hub' / 'models--someorg--not-here'} by running "
        "`hf download someorg/not-here config.json --revision v3` on a machine with network (HF_HUB_CACHE naming "
        "the same cache), or pass the model's config.json by path"
    ]


def test_a_name_with_no_slash_or_a_missing_json_path_never_reaches_the_hub(hub, tmp_path):
    fake, url = hub
    for typo in ("qwen3-8bb", "missing/config.json", "some--org/name"):
        result = plimsoll(hub_env(tmp_path, HF_ENDPOINT=url), "plan", "--model", typo)
        assert result.returncode == 2 and "not a preset and not a file" in result.stderr
    assert fake.seen == []


def test_a_config_files_model_is_read_from_the_cache_only_so_the_daemon_never_waits_on_the_hub(hub, tmp_path):
    fake, url = hub
    config = tmp_path / "plimsoll.yaml"
    config.write_text("targets: [{url: 'http://127.0.0.1:8000/metrics', model: someorg/served-model}]\n")
    result = plimsoll(hub_env(tmp_path, HF_ENDPOINT=url), "check-config", str(config))
    assert result.returncode == 2 and "a config file's model is read from the cache only" in result.stderr
    assert fake.seen == []

    assert plan_json(hub_env(tmp_path, HF_ENDPOINT=url), "someorg/served-model")  # `plimsoll plan` fills the cache
    assert plimsoll(hub_env(tmp_path, HF_ENDPOINT=url), "check-config", str(config)).returncode == 0
