"""Kubernetes pod discovery: PodList to targets, and the refresh against a local stand-in for the API server
(tests/support/kubernetes_api.py). No real API server runs in these tests."""

import asyncio
import json
import logging

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from exporter.config import ConfigError, KubernetesDiscovery, parse_config
from exporter.sources import kubernetes
from exporter.sources.kubernetes import PodDiscovery, pod_targets
from tests.support.kubernetes_api import NODE, FakeApiServer, pod, pod_list


def test_running_pods_with_a_port_become_targets_named_namespace_slash_pod():
    listed = pod_targets(
        pod_list(
            pod(
                "llama-0",
                annotations={
                    "plimsoll.io/port": "8000",
                    "plimsoll.io/model": "llama-3.1-8b",
                    "plimsoll.io/engine": "vllm",
                },
            ),
            pod("qwen-0", annotations={"prometheus.io/port": "9000", "prometheus.io/path": "stats"}),
            pod("sglang-0", ports=(30000,), ip="fd00::12"),
        )
    )
    assert [(t.name, t.url, t.engine, t.model, t.source) for t in listed.targets] == [
        ("inference/llama-0", "http://10.4.2.17:8000/metrics", "vllm", "llama-3.1-8b", "kubernetes"),
        ("inference/qwen-0", "http://10.4.2.17:9000/stats", "auto", None, "kubernetes"),
        ("inference/sglang-0", "http://[fd00::12]:30000/metrics", "auto", None, "kubernetes"),
    ]
    assert listed.problems == ()


def test_plimsoll_annotations_win_over_prometheus_ones():
    annotations = {"plimsoll.io/port": "8000", "prometheus.io/port": "9090", "prometheus.io/scheme": "https"}
    (target,) = pod_targets(pod_list(pod("p", annotations=annotations))).targets
    assert target.url == "https://10.4.2.17:8000/metrics"


def test_pods_not_running_opted_out_without_ip_or_port_are_left_out_quietly():
    listed = pod_targets(
        pod_list(
            pod("starting", ports=(8000,), phase="Pending"),
            pod("opted-out", ports=(8000,), annotations={"plimsoll.io/scrape": "false"}),
            pod("no-ip", ports=(8000,), ip=None),
            pod("nginx", ports=(80,)),
        )
    )
    assert listed == type(listed)((), ())


@pytest.mark.parametrize("port", ["http", "0", "65536", "\u00b2", "\uff18\uff10\uff10\uff10"])  # ², fullwidth 8000
def test_a_bad_port_annotation_is_a_problem_naming_the_pod_and_the_rest_of_the_list_is_read(port):
    listed = pod_targets(pod_list(pod("llama-0", annotations={"plimsoll.io/port": port}), pod("qwen-0", ports=(8000,))))
    assert [t.name for t in listed.targets] == ["inference/qwen-0"]
    assert listed.problems == (
        f"pod inference/llama-0: annotation port {port!r} is not a TCP port number; pod left out",
    )


def test_a_bad_engine_annotation_marks_that_pod_only_naming_the_annotation_and_the_valid_engines():
    listed = pod_targets(
        pod_list(
            pod("llama-0", ports=(8000,), annotations={"plimsoll.io/engine": "vlm"}),
            pod("llama-1", ports=(8000,), annotations={"plimsoll.io/engine": "vllm"}),
        )
    )
    bad, good = listed.targets
    assert bad.problem is not None
    assert bad.problem.startswith("pod inference/llama-0: annotation plimsoll.io/engine 'vlm' is not one of auto, vllm")
    assert bad.engine == "auto"  # never handed to the adapters: the target is shown down with its problem
    assert (good.engine, good.problem) == ("vllm", None)


def test_a_scheme_annotation_that_is_not_http_marks_the_pod():
    (target,) = pod_targets(pod_list(pod("p", ports=(8000,), annotations={"prometheus.io/scheme": "ftp"}))).targets
    assert target.problem == "pod inference/p: annotation prometheus.io/scheme 'ftp' is not one of http, https"


def test_a_name_or_annotation_that_cannot_be_a_label_value_leaves_that_pod_out_with_an_escaped_problem():
    listed = pod_targets(
        pod_list(
            pod("newline", ports=(8000,), annotations={"plimsoll.io/model": "llama\nsaturation: {queue: 999}"}),
            pod("escape", ports=(8000,), annotations={"prometheus.io/path": "/metrics\x1b]0;pwned\x07"}),
            pod("template", ports=(8000,), annotations={"plimsoll.io/model": "a<<b"}),
            pod("evil\x1b[2J", ports=(8000,), annotations={"plimsoll.io/port": "http"}),
            pod("good", ports=(8000,), annotations={"plimsoll.io/model": "llama-3.1-8b"}),
        )
    )
    assert [(t.name, t.model) for t in listed.targets] == [("inference/good", "llama-3.1-8b")]
    newline, escape, template, name = listed.problems
    assert newline.startswith("pod inference/newline: annotation plimsoll.io/model 'llama\\nsaturation")
    assert escape.startswith("pod inference/escape: annotation prometheus.io/path '/metrics\\x1b]0;pwned\\x07'")
    assert template.startswith("pod inference/template: annotation plimsoll.io/model 'a<<b' is not a usable label")
    assert name.startswith("pod 'inference/evil\\x1b[2J' is not a usable label value")  # before the port's problem
    assert all(p.endswith("; pod left out") and "\n" not in p and "\x1b" not in p for p in listed.problems)


def _discover(api: FakeApiServer, settings: KubernetesDiscovery, steps, clock=None):
    """Runs `steps(discovery, session)` against the stand-in; returns its result."""

    async def go():
        async with TestServer(api.app(), host="127.0.0.1") as server, aiohttp.ClientSession() as session:
            url = str(server.make_url("")).rstrip("/")
            kwargs = {"clock": clock} if clock else {}
            discovery = PodDiscovery(
                KubernetesDiscovery(**{**settings.__dict__, "api_url": url}), 2.0, environ={}, **kwargs
            )
            return await steps(discovery, session)

    return asyncio.run(go())


def test_refresh_lists_this_nodes_pods_with_the_service_account_token(tmp_path):
    token = tmp_path / "token"
    token.write_text("secret-token\n")
    api = FakeApiServer()
    api.pods = pod_list(pod("llama-0", ports=(8000,)))
    settings = KubernetesDiscovery(node=NODE, label_selector="app=vllm", token_file=str(token))

    async def steps(discovery, session):
        await discovery.refresh(session)
        return discovery.targets

    (target,) = _discover(api, settings, steps)
    assert target.name == "inference/llama-0"
    query = {"fieldSelector": f"spec.nodeName={NODE}", "labelSelector": "app=vllm", "limit": "500"}
    assert api.requests == [("/api/v1/pods", query, "Bearer secret-token")]


@pytest.mark.parametrize(
    ("content", "problem"),
    [(b"secret-token" * 10000, "over 64 KiB; not a token"), (b"secret-\xfftoken", "not a token (not ASCII text)")],
)
def test_a_token_file_that_is_no_token_fails_the_refresh_without_showing_it(tmp_path, caplog, content, problem):
    token = tmp_path / "token"
    token.write_bytes(content)
    api = FakeApiServer()
    api.pods = pod_list(pod("llama-0", ports=(8000,)))
    settings = KubernetesDiscovery(node=NODE, token_file=str(token))
    with caplog.at_level(logging.WARNING):
        assert _names_listed(settings, api) == []
    assert f"discovery.kubernetes.token_file {token}: {problem}" in caplog.text and "secret" not in caplog.text
    assert api.requests == []


def test_namespaces_are_listed_one_by_one():
    api = FakeApiServer()
    settings = KubernetesDiscovery(node=NODE, namespaces=("team-a", "team-b"), token_file="/nonexistent")

    async def steps(discovery, session):
        await discovery.refresh(session)

    _discover(api, settings, steps)
    assert [path for path, _, _ in api.requests] == ["/api/v1/namespaces/team-a/pods", "/api/v1/namespaces/team-b/pods"]


def test_a_failed_refresh_keeps_the_last_targets_and_says_what_rbac_needs(caplog):
    api = FakeApiServer()
    api.pods = pod_list(pod("llama-0", ports=(8000,)))
    now = [0.0]
    settings = KubernetesDiscovery(node=NODE, refresh_seconds=30.0, token_file="/nonexistent")

    async def steps(discovery, session):
        await discovery.refresh(session)
        api.status = 403
        for t in (31.0, 62.0):
            now[0] = t
            await discovery.refresh(session)
        return discovery.targets

    with caplog.at_level(logging.WARNING):
        targets = _discover(api, settings, steps, clock=lambda: now[0])
    assert [t.name for t in targets] == ["inference/llama-0"]
    (failure,) = [r.getMessage() for r in caplog.records]  # once, not on every failing refresh
    assert "HTTP 403" in failure and "deploy/kubernetes/rbac.yaml" in failure


def test_refresh_waits_for_its_interval():
    api = FakeApiServer()
    now = [100.0]
    settings = KubernetesDiscovery(node=NODE, refresh_seconds=30.0, token_file="/nonexistent")

    async def steps(discovery, session):
        for t in (100.0, 110.0, 129.9, 130.0):
            now[0] = t
            await discovery.refresh(session)

    _discover(api, settings, steps, clock=lambda: now[0])
    assert len(api.requests) == 2  # at 100 and 130


def test_outside_a_cluster_without_api_url_there_are_no_pods_and_no_crash(caplog):
    async def go():
        async with aiohttp.ClientSession() as session:
            discovery = PodDiscovery(KubernetesDiscovery(node=NODE), 2.0, environ={})
            await discovery.refresh(session)
            return discovery.targets

    with caplog.at_level(logging.WARNING):
        assert asyncio.run(go()) == ()
    assert "KUBERNETES_SERVICE_HOST" in caplog.text


def test_in_cluster_api_url_comes_from_the_service_environment():
    discovery = PodDiscovery(
        KubernetesDiscovery(node=NODE),
        2.0,
        environ={"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"},
    )
    assert discovery.api_url() == "https://10.96.0.1:443"


def test_a_failure_after_recovery_is_logged_again(caplog):
    api = FakeApiServer()
    now = [0.0]
    settings = KubernetesDiscovery(node=NODE, refresh_seconds=30.0, token_file="/nonexistent")

    async def steps(discovery, session):
        for t, status in ((0.0, 500), (30.0, 200), (60.0, 500)):
            now[0], api.status = t, status
            await discovery.refresh(session)

    with caplog.at_level(logging.INFO, logger="exporter.sources.kubernetes"):
        _discover(api, settings, steps, clock=lambda: now[0])
    messages = [r.getMessage() for r in caplog.records]
    assert [("HTTP 500" in m, "works again" in m) for m in messages] == [(True, False), (False, True), (True, False)]


def test_a_pod_problem_is_logged_once_while_it_lasts_and_churning_pods_leave_none_behind(caplog):
    api = FakeApiServer()
    now = [0.0]
    settings = KubernetesDiscovery(node=NODE, refresh_seconds=30.0, token_file="/nonexistent")
    bad = {"plimsoll.io/port": "x"}

    async def steps(discovery, session):
        # The same bad pod twice, then ten replaced under new names, then the first back.
        names = ["llama-0", "llama-0", *(f"llama-{n}" for n in range(1, 11)), "llama-0"]
        for refresh, name in enumerate(names):
            now[0], api.pods = 30.0 * refresh, pod_list(pod(name, annotations=bad))
            await discovery.refresh(session)
        return len(discovery._reported)

    with caplog.at_level(logging.WARNING, logger="exporter.sources.kubernetes"):
        kept = _discover(api, settings, steps, clock=lambda: now[0])
    logged = [r.getMessage() for r in caplog.records if "not a TCP port" in r.getMessage()]
    assert [m.split(":")[1].strip() for m in logged] == [f"pod inference/llama-{n}" for n in (0, *range(1, 11), 0)]
    assert kept == 1


def _names_listed(settings: KubernetesDiscovery, api: FakeApiServer) -> list[str]:
    async def steps(discovery, session):
        await discovery.refresh(session)
        return [t.name for t in discovery.targets]

    return _discover(api, settings, steps)


def _two_nodes() -> FakeApiServer:
    api = FakeApiServer()
    api.pods = pod_list(pod("llama-0", ports=(8000,)), pod("llama-1", ports=(8000,), node="gpu-node-8"))
    return api


def test_cluster_scope_lists_every_nodes_pods_with_no_node_in_the_query():
    api = _two_nodes()
    settings = KubernetesDiscovery(node="", scope="cluster", label_selector="app=vllm", token_file="/nonexistent")
    assert _names_listed(settings, api) == ["inference/llama-0", "inference/llama-1"]
    ((_, query, _),) = api.requests
    assert query == {"labelSelector": "app=vllm", "limit": "500"}


def test_node_scope_lists_only_this_nodes_pods():
    api = _two_nodes()
    settings = KubernetesDiscovery(node=NODE, label_selector="app=vllm", token_file="/nonexistent")
    assert _names_listed(settings, api) == ["inference/llama-0"]


def test_a_long_list_is_read_page_by_page():
    api = FakeApiServer()
    api.pods = pod_list(*(pod(f"llama-{i}", ports=(8000,)) for i in range(1201)))
    settings = KubernetesDiscovery(node="", scope="cluster", label_selector="app=vllm", token_file="/nonexistent")
    names = _names_listed(settings, api)
    assert len(names) == 1201 and names[-1] == "inference/llama-1200"
    assert [query.get("continue") for _, query, _ in api.requests] == [None, "500", "1000"]
    assert all(query["limit"] == "500" for _, query, _ in api.requests)


def test_the_byte_bound_holds_over_all_the_pages_of_one_refresh(monkeypatch, caplog):
    """Each page is under the bound, the first two together over it: the refresh fails rather than hold them."""
    api = FakeApiServer()
    api.pods = pod_list(*(pod(f"llama-{i}", ports=(8000,)) for i in range(1201)))
    monkeypatch.setattr(kubernetes, "_MAX_LIST_BYTES", len(json.dumps(api.pods)) // 2)
    settings = KubernetesDiscovery(node="", scope="cluster", label_selector="app=vllm", token_file="/nonexistent")
    with caplog.at_level(logging.WARNING):
        assert _names_listed(settings, api) == []
    assert len(api.requests) == 2 and "the pod lists of one refresh are over" in caplog.text


def test_an_api_that_never_stops_paging_is_refused_and_the_last_targets_stay(caplog):
    async def endless(request: web.Request) -> web.Response:
        page = int(request.query.get("continue", "0"))
        return web.json_response({"kind": "PodList", "metadata": {"continue": str(page + 1)}, "items": []})

    app = web.Application()
    app.router.add_get("/api/v1/pods", endless)

    async def go():
        async with TestServer(app, host="127.0.0.1") as server, aiohttp.ClientSession() as session:
            settings = KubernetesDiscovery(
                node="", scope="cluster", label_selector="app=vllm", api_url=str(server.make_url("")).rstrip("/")
            )
            discovery = PodDiscovery(settings, 2.0, environ={})
            await discovery.refresh(session)
            return discovery.targets

    with caplog.at_level(logging.WARNING):
        assert asyncio.run(go()) == ()
    assert "listing pods across the cluster failed" in caplog.text and "past 200 pages of 500 pods" in caplog.text


def test_an_item_that_is_not_a_pod_is_left_out_and_the_rest_of_the_list_is_read():
    no_annotations = pod("odd", ports=(8000,))
    no_annotations["metadata"]["annotations"] = ["plimsoll.io/port"]
    listed = pod_targets(pod_list("not a pod", pod("llama-0", ports=(8000,)), no_annotations))
    assert [t.name for t in listed.targets] == ["inference/llama-0"]
    assert [p.split(" (")[0] for p in listed.problems] == [
        "item 0 of the pod list is not a pod as the API documents it",
        "item 2 of the pod list is not a pod as the API documents it",
    ]


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ('{"kind": "PodList", "items": {"llama-0": {}}}', "did not return a PodList"),
        ('{"kind": "PodList", "items": ' + "[" * 100_000 + "]" * 100_000 + "}", "maximum recursion depth"),
    ],
)
def test_a_list_that_is_not_a_pod_list_fails_the_refresh_and_the_last_targets_stay(caplog, body, problem):
    api = FakeApiServer()
    api.pods = pod_list(pod("llama-0", ports=(8000,)))
    garbled = []

    @web.middleware
    async def garble(request: web.Request, handler):
        return web.Response(text=body, content_type="application/json") if garbled else await handler(request)

    class Garbling:
        def app(self) -> web.Application:
            app = api.app()
            app.middlewares.append(garble)
            return app

    now = [0.0]

    async def steps(discovery, session):
        await discovery.refresh(session)
        garbled.append(True)
        now[0] = 31.0
        await discovery.refresh(session)
        return discovery.targets

    settings = KubernetesDiscovery(node=NODE, refresh_seconds=30.0, token_file="/nonexistent")
    with caplog.at_level(logging.WARNING):
        targets = _discover(Garbling(), settings, steps, clock=lambda: now[0])
    assert [t.name for t in targets] == ["inference/llama-0"]
    assert "failed, keeping 1 targets" in caplog.text and problem in caplog.text


def test_cluster_scope_needs_no_node_and_ignores_node_name():
    text = "discovery:\n  kubernetes: {enabled: true, scope: cluster, label_selector: app=vllm}\n"
    settings = parse_config(text, "c.yaml", environ={"NODE_NAME": "gpu-node-7"}).kubernetes
    assert settings is not None and (settings.scope, settings.node) == ("cluster", "")
    default = parse_config(text.replace("scope: cluster, ", ""), "c.yaml", environ={"NODE_NAME": "n1"}).kubernetes
    assert default is not None and (default.scope, default.node) == ("node", "n1")


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ("scope: cluster", "c.yaml: discovery.kubernetes.label_selector: required with scope: cluster"),
        (
            "scope: cluster, label_selector: app=vllm, node: n1",
            "c.yaml: discovery.kubernetes.node: only with scope: node",
        ),
        (
            "scope: fleet, label_selector: app=vllm",
            "c.yaml: discovery.kubernetes.scope: 'fleet' is not one of node, cluster",
        ),
    ],
)
def test_cluster_scope_config_errors_name_the_field(fields, problem):
    text = f"discovery:\n  kubernetes: {{enabled: true, {fields}}}\n"
    with pytest.raises(ConfigError) as error:
        parse_config(text, "c.yaml", environ={"NODE_NAME": "n1"})
    (found,) = error.value.problems
    assert found.startswith(problem)
