"""Engine pods on this node, from the Kubernetes API: the DaemonSet's way to find its targets.

Each refresh lists the pods scheduled to this node (`fieldSelector=spec.nodeName=...`, the same narrow query the
kubelet's neighbours make) and turns the running ones into targets. A list every 30 s per node is lighter on the
API server than a watch per node and needs no resume logic; a pod that starts is picked up within one refresh.

With scope "cluster" (one daemon that must see every replica of a workload, for the fleet's scale-up lag) the
query has no node: the label selector, which the config then requires, is what keeps it to the engine pods. Either
way the list is read in pages of `limit` pods (`continue`), and all pages of one refresh together are bounded as
one list is.

Which pods, and where their page is, comes from annotations, Prometheus' conventions first understood:

    plimsoll.io/scrape: "false"        leave this pod out
    plimsoll.io/port: "8000"           else prometheus.io/port, else the first container port that is an
                                       engine's usual one (8000, 30000, 8002, 8080, 23333); no port, no target
    plimsoll.io/path: /metrics         else prometheus.io/path
    plimsoll.io/scheme: http           else prometheus.io/scheme
    plimsoll.io/engine: vllm           else detected from the page
    plimsoll.io/model: meta-llama/Llama-3.1-8B-Instruct   a preset, for the model's metrics

A pod whose name, model or path could not be a config's (a line break, an escape, `<<`: see
config.validators.label_value) is left out, and the problem logged names it and the annotation.

The API server, token and CA default to the in-cluster service account's; the token is re-read on every refresh
because projected tokens rotate. A failed refresh keeps the targets of the last good one.
"""

import json
import logging
import os
import ssl
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import aiohttp

from exporter.config import SCAN_PORTS, KubernetesDiscovery, Target, engine_problem, label_value
from exporter.files import read_capped

log = logging.getLogger(__name__)

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
_ANNOTATION_PREFIXES = ("plimsoll.io/", "prometheus.io/")
_MAX_LIST_BYTES = 32 * 1024 * 1024  # all pages of one refresh together
_PAGE_PODS = 500  # kubectl's page size: one page is one bounded API server request
_MAX_PAGES = 200  # per namespace listed; a server that never stops handing out `continue` is refused
_MAX_TOKEN_BYTES = 64 << 10  # a service-account token is a few kB; a file far larger is not the one meant
# What the API server says becomes label values, YAML in generated files and text on a terminal: held to the rule
# a config's target name, model and metrics path are held to, so a discovered pod can say no more than a config can.
_TARGET_NAME = label_value("a target name")
_MODEL = label_value("a model preset or the path of a config.json")
_PATH = label_value("a URL path such as /metrics")


@dataclass(frozen=True)
class PodTargets:
    targets: tuple[Target, ...]
    problems: tuple[str, ...]  # one line per pod left out for a reason its owner can fix


def _annotation_key(annotations: Mapping[str, str], name: str) -> str | None:
    """The annotation that gives `name`: plimsoll.io's if set, else prometheus.io's."""
    return next((prefix + name for prefix in _ANNOTATION_PREFIXES if annotations.get(prefix + name)), None)


def _annotation(annotations: Mapping[str, str], name: str) -> str | None:
    key = _annotation_key(annotations, name)
    return annotations[key] if key else None


def _port(pod: Mapping[str, Any], annotations: Mapping[str, str]) -> int | str | None:
    """The annotated port, or an engine's usual port among the containers'; a bad annotation is returned as is."""
    annotated = _annotation(annotations, "port")
    if annotated is not None:
        # int() refuses some of what isdigit() holds ("²"), and a ValueError here would fail the whole list.
        digits = annotated.isascii() and annotated.isdigit()
        return int(annotated) if digits and 0 < int(annotated) < 65536 else annotated
    for container in pod.get("spec", {}).get("containers", []):
        for port in container.get("ports", []):
            if port.get("containerPort") in SCAN_PORTS and port.get("protocol", "TCP") == "TCP":
                number: int = port["containerPort"]
                return number
    return None


def _label_problem(pod: str, annotations: Mapping[str, str]) -> str | None:
    """Why the pod's name or an annotation that becomes a label cannot be one, naming the annotation; such a pod is
    left out rather than shown down, since its name or model would carry the bad text into every output."""
    try:
        _TARGET_NAME(pod)
    except ValueError as error:
        return f"pod {error}; pod left out"
    for key, check in (("plimsoll.io/model", _MODEL), (_annotation_key(annotations, "path"), _PATH)):
        if key and annotations.get(key):
            try:
                check(annotations[key])
            except ValueError as error:
                return f"pod {pod}: annotation {key} {error}; pod left out"
    return None


def _annotation_problem(pod: str, annotations: Mapping[str, str], scheme: str, engine: str) -> str | None:
    """Why the pod's annotations make it unpollable, naming the annotation; the pod is then a target shown down
    with this reason, so one bad annotation costs that pod and nothing else."""
    if scheme not in ("http", "https"):
        source = "plimsoll.io/scheme" if annotations.get("plimsoll.io/scheme") else "prometheus.io/scheme"
        return f"pod {pod}: annotation {source} {scheme[:40]!r} is not one of http, https"
    bad_engine = engine_problem(engine)
    return f"pod {pod}: annotation plimsoll.io/engine {bad_engine}" if bad_engine else None


def _pod_target(pod: Mapping[str, Any]) -> Target | str | None:
    """The pod's target; the problem that leaves it out, in words; None for a pod left out quietly."""
    metadata = pod.get("metadata", {})
    annotations = metadata.get("annotations") or {}
    name = f"{metadata.get('namespace', 'default')}/{metadata.get('name', '?')}"
    ip = pod.get("status", {}).get("podIP")
    if annotations.get("plimsoll.io/scrape") == "false" or pod.get("status", {}).get("phase") != "Running":
        return None
    if not ip:
        return None
    port = _port(pod, annotations)
    if port is None:
        return None
    if bad_label := _label_problem(name, annotations):  # first: the messages below show the name as it is
        return bad_label
    if isinstance(port, str):
        return f"pod {name}: annotation port {port!r} is not a TCP port number; pod left out"
    host = f"[{ip}]" if ":" in ip else ip
    path = _annotation(annotations, "path") or "/metrics"
    scheme = _annotation(annotations, "scheme") or "http"
    engine = annotations.get("plimsoll.io/engine", "auto")
    return Target(
        name=name,
        url=f"{scheme}://{host}:{port}/{path.lstrip('/')}",
        engine="auto" if engine_problem(engine) else engine,
        model=annotations.get("plimsoll.io/model") or None,
        source="kubernetes",
        problem=_annotation_problem(name, annotations, scheme, engine),
    )


def pod_targets(pod_list: Mapping[str, Any]) -> PodTargets:
    """Targets from a PodList (GET /api/v1/pods): one per running pod with an IP and a port to read. A pod not
    shaped as the API documents (a field of another type) is left out, and the rest of the list is read."""
    targets: list[Target] = []
    problems: list[str] = []
    for n, pod in enumerate(pod_list.get("items") or []):
        try:
            found = _pod_target(pod)
        except (AttributeError, TypeError) as error:
            problems.append(f"item {n} of the pod list is not a pod as the API documents it ({error}); left out")
            continue
        if isinstance(found, Target):
            targets.append(found)
        elif found is not None:
            problems.append(found)
    return PodTargets(tuple(targets), tuple(problems))


def listed_where(settings: KubernetesDiscovery) -> str:
    """Where the pods are listed, for log lines and check-config."""
    return "across the cluster" if settings.scope == "cluster" else f"on node {settings.node}"


class PodDiscovery:
    """The pods on this node (or, scope cluster, on every node) as targets, refreshed at most once per
    `settings.refresh_seconds`."""

    def __init__(
        self,
        settings: KubernetesDiscovery,
        timeout_seconds: float,
        *,
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.settings = settings
        self._timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self._environ = os.environ if environ is None else environ
        self._clock = clock
        self._next_refresh = -float("inf")
        self._reported: set[str] = set()  # the last listing's pod problems, logged when they appeared
        self._failing = False
        self.targets: tuple[Target, ...] = ()

    def api_url(self) -> str | None:
        if self.settings.api_url:
            return self.settings.api_url.rstrip("/")
        host, port = self._environ.get("KUBERNETES_SERVICE_HOST"), self._environ.get("KUBERNETES_SERVICE_PORT")
        if not host or not port:
            return None
        return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"

    def list_urls(self, api: str) -> list[str]:
        """The first page's URL of each list (one per namespace, or one for all)."""
        query: dict[str, str] = {}
        if self.settings.scope == "node":
            query["fieldSelector"] = f"spec.nodeName={self.settings.node}"
        if self.settings.label_selector:
            query["labelSelector"] = self.settings.label_selector
        query["limit"] = str(_PAGE_PODS)
        paths = [f"/api/v1/namespaces/{ns}/pods" for ns in self.settings.namespaces] or ["/api/v1/pods"]
        return [f"{api}{path}?{urlencode(query)}" for path in paths]

    async def refresh(self, session: aiohttp.ClientSession) -> None:
        """List the pods when a refresh is due; a failure is logged once and the old targets stay."""
        now = self._clock()
        if now < self._next_refresh:
            return
        self._next_refresh = now + self.settings.refresh_seconds
        api = self.api_url()
        if api is None:
            self._fail(
                "no Kubernetes API: KUBERNETES_SERVICE_HOST/PORT are not set (not in a pod?); "
                "set discovery.kubernetes.api_url"
            )
            return
        try:
            headers, ssl_context = self._credentials(api)
            found: list[Target] = []
            problems: list[str] = []
            async for pods in self._pages(session, api, headers, ssl_context):
                listed = pod_targets(pods)
                found.extend(listed.targets)
                problems.extend(listed.problems)
        except (OSError, aiohttp.ClientError, TimeoutError, ValueError, RecursionError) as error:
            where = listed_where(self.settings)
            self._fail(f"listing pods {where} failed, keeping {len(self.targets)} targets: {error}")
            return
        if self._failing:
            log.info("kubernetes: listing pods %s works again", listed_where(self.settings))
            self._failing = False
        for problem in problems:
            if problem not in self._reported:
                log.warning("kubernetes: %s", problem)
        # This listing's problems only: one still there is not logged again, and pods that churn under new names
        # leave nothing behind.
        self._reported = set(problems)
        if {t.name for t in found} != {t.name for t in self.targets}:
            log.info("kubernetes: %d engine pods %s", len(found), listed_where(self.settings))
        self.targets = tuple(found)

    async def _pages(
        self, session: aiohttp.ClientSession, api: str, headers: Mapping[str, str], ssl_context: ssl.SSLContext | None
    ) -> AsyncIterator[Mapping[str, Any]]:
        """Every page of every list, following `continue`; together at most _MAX_LIST_BYTES. Each page is made
        targets before the next is read, so a long list is never held whole."""
        left = _MAX_LIST_BYTES
        for first in self.list_urls(api):
            url = first
            for _ in range(_MAX_PAGES):
                page, size = await _get_json(session, url, headers, ssl_context, self._timeout, left)
                yield page
                left -= size
                metadata = page.get("metadata")
                token = metadata.get("continue") if isinstance(metadata, dict) else None
                if not token or not isinstance(token, str):
                    break
                url = f"{first}&{urlencode({'continue': token})}"
            else:
                raise ValueError(f"the pod list from {first} goes on past {_MAX_PAGES} pages of {_PAGE_PODS} pods")

    def _credentials(self, api: str) -> tuple[dict[str, str], ssl.SSLContext | None]:
        headers = {"Accept": "application/json"}
        token_file = Path(self.settings.token_file or SERVICE_ACCOUNT / "token")
        if token_file.exists():
            headers["Authorization"] = f"Bearer {_token(token_file)}"
        if not api.startswith("https://"):
            return headers, None
        ca_file = Path(self.settings.ca_file or SERVICE_ACCOUNT / "ca.crt")
        return headers, ssl.create_default_context(cafile=str(ca_file) if ca_file.exists() else None)

    def _fail(self, message: str) -> None:
        """Logged when listing starts failing, not on every refresh while it keeps failing."""
        if not self._failing:
            log.warning("kubernetes: %s", message)
        self._failing = True


def _token(path: Path) -> str:
    """The bearer token in `path`; a ValueError that names the file and never shows its bytes."""
    name = "discovery.kubernetes.token_file"
    data = read_capped(str(path), _MAX_TOKEN_BYTES, name, "not a token")
    if not data.isascii():
        raise ValueError(f"{name} {path}: not a token (not ASCII text)")
    return data.decode().strip()


async def _get_json(
    session: aiohttp.ClientSession,
    url: str,
    headers: Mapping[str, str],
    ssl_context: ssl.SSLContext | None,
    timeout: aiohttp.ClientTimeout,
    max_bytes: int,
) -> tuple[Mapping[str, Any], int]:
    """One page of a PodList and its size in bytes; over `max_bytes` (what the refresh has left) is an error."""
    async with session.get(url, headers=headers, ssl=ssl_context or True, timeout=timeout) as response:
        if response.status != 200:
            hint = (
                " (the service account needs get/list on pods: see deploy/kubernetes/rbac.yaml, or "
                "deploy/kubernetes/fleet/rbac.yaml for scope: cluster)"
            )
            raise ValueError(f"HTTP {response.status} from {url}{hint if response.status == 403 else ''}")
        body = bytearray()  # read(n) returns what has arrived, not n bytes: read to the end, bounded
        async for chunk in response.content.iter_chunked(65536):
            body += chunk
            if len(body) > max_bytes:
                raise ValueError(f"the pod lists of one refresh are over {_MAX_LIST_BYTES} bytes (at {url})")
        pods = json.loads(body)
        if not isinstance(pods, dict) or pods.get("kind") != "PodList" or not isinstance(pods.get("items") or [], list):
            raise ValueError(f"{url} did not return a PodList")
        return pods, len(body)
