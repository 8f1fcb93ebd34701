"""A stand-in for the Kubernetes API server's pod list, and pods written in the API's shape (v1 Pod: metadata,
spec.containers[].ports, status.phase and podIP). The boundary for discovery unit tests; no real API server runs.
"""

from typing import Any

from aiohttp import web

NODE = "gpu-node-7"


def pod(
    name: str,
    *,
    namespace: str = "inference",
    annotations: dict[str, str] | None = None,
    ports: tuple[int, ...] = (),
    phase: str = "Running",
    ip: str | None = "10.4.2.17",
    node: str = NODE,
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations or {}},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "engine", "ports": [{"containerPort": p, "protocol": "TCP"} for p in ports]}],
        },
        "status": {"phase": phase, **({"podIP": ip} if ip else {})},
    }


def pod_list(*pods: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"}, "items": list(pods)}


class FakeApiServer:
    """Answers GET /api/v1/pods and /api/v1/namespaces/{ns}/pods with `self.pods`, or with `self.status`. Like the
    API server it keeps to the pods of `fieldSelector=spec.nodeName=...` and pages by `limit` and `continue` (the
    token here is the offset of the next page)."""

    def __init__(self) -> None:
        self.pods: dict[str, Any] = pod_list()
        self.status = 200
        self.requests: list[tuple[str, dict[str, str], str | None]] = []

    def app(self) -> web.Application:
        async def pods(request: web.Request) -> web.Response:
            self.requests.append((request.path, dict(request.query), request.headers.get("Authorization")))
            if self.status != 200:
                return web.json_response({"kind": "Status", "code": self.status}, status=self.status)
            items = self.pods["items"]
            field = request.query.get("fieldSelector")
            if field is not None:
                key, _, node = field.partition("=")
                assert key == "spec.nodeName", field  # the only field selector discovery sends
                items = [p for p in items if p["spec"]["nodeName"] == node]
            start = int(request.query.get("continue", "0"))
            limit = int(request.query.get("limit", "0")) or len(items)
            page = {**self.pods, "items": items[start : start + limit]}
            if start + limit < len(items):
                page["metadata"] = {**self.pods["metadata"], "continue": str(start + limit)}
            return web.json_response(page)

        app = web.Application()
        app.router.add_get("/api/v1/pods", pods)
        app.router.add_get("/api/v1/namespaces/{namespace}/pods", pods)
        return app
