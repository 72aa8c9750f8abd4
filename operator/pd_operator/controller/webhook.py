"""A validating admission webhook: ``kubectl apply`` of a PDInferenceService
gets the same answer ``pdctl validate`` gives (the spec model and its rules,
then a render, which checks extraArgs against the pinned engine's and
router's flag sets), at once, with the field path and the fix; then, as the
reconciler does before it writes anything, a server-side dry-run of every
child the spec renders to, so what the API server would refuse of them (a
toleration ``Exists`` with a value, a port above 65535, duplicate env names)
is refused here too, with the child and its field.

Served over HTTPS (the API server only calls webhooks over TLS) on a daemon
thread by every replica (it keeps no state). The chart registers it with
``failurePolicy: Ignore``, so an operator that is down never blocks the
cluster: the reconciler still reports the same problems in status.
"""

from __future__ import annotations

import json
import logging
import ssl
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ..api import SpecError, validate_service

log = logging.getLogger(__name__)
PATH = "/validate"
# The API server truncates each warning to 256 characters (apiserver endpoints/filters/warning.go).
WARNING_MAX = 256


def review(admission_review: dict, kube=None) -> dict:
    """The AdmissionReview response for one AdmissionReview request (``kube``: the
    operator's client, for the children's dry-run; None: the spec checks only)."""
    request = admission_review.get("request") or {}
    response: dict = {"uid": request.get("uid", ""), "allowed": True}
    obj = request.get("object")
    old = request.get("oldObject")
    if (request.get("operation") == "UPDATE" and isinstance(obj, dict) and isinstance(old, dict)
            and obj.get("spec") == old.get("spec")):
        # a metadata-only change (a label, an annotation, a finalizer): the rendering
        # depends on the spec alone, and the API server ratchets the CRD's own rules
        # the same way, so a spec stored before a rule existed still takes one
        obj = None
    if request.get("operation") in ("CREATE", "UPDATE") and obj:
        try:
            problem = check(obj, request.get("namespace"), kube)
        except Exception as err:  # noqa: BLE001 - the operator's fault, not the request's
            # answered as an HTTP error it would be a call failure, which failurePolicy
            # Ignore drops without a word: admitted, and the user is told so
            log.exception("webhook: the check of %s/%s failed", request.get("namespace"), request.get("name"))
            # no control characters: the API server drops such a warning (apimachinery util/net/http.go NewWarningHeader)
            text = "".join(c if c.isprintable() else " " for c in str(err))
            warning = f"pd-operator could not check this spec ({type(err).__name__}: {text}"
            tail = "); check it with pdctl validate -f FILE"
            response = {**response, "warnings": [warning[:WARNING_MAX - len(tail)] + tail]}
            problem = None
        if problem:
            response = {**response, "allowed": False,
                        "status": {"code": 422, "reason": "Invalid", "message": problem}}
    return {"apiVersion": admission_review.get("apiVersion", "admission.k8s.io/v1"), "kind": "AdmissionReview",
            "response": response}


def check(obj: dict, namespace: str | None = None, kube=None) -> str | None:
    """Why ``obj`` is refused (None: it is not), as ``pdctl validate`` says it, then
    as the API server would refuse its children (with ``kube``)."""
    from ..render import render

    if (obj.get("metadata") or {}).get("deletionTimestamp"):
        return None  # a service on its way out (finalizers) is not judged again
    try:
        svc = validate_service(obj)
        if namespace and not svc.metadata.namespace:
            svc.metadata.namespace = namespace
        render(svc)
    except SpecError as err:
        return str(err)
    if kube is None:
        return None
    from .reconcile import refused_children

    meta = obj.get("metadata") or {}
    # a create is admitted before it has a uid: the children's owner reference needs one
    body = {**obj, "metadata": {**meta, "namespace": meta.get("namespace") or namespace,
                                "uid": meta.get("uid") or "00000000-0000-0000-0000-000000000000"}}
    try:
        refused = refused_children(kube, body)
    except Exception as err:  # noqa: BLE001 - the dry-run could not say: the reconciler will
        log.warning("webhook: dry-run of the children failed: %s", err)
        return None
    if not refused:
        return None
    return ("the API server refuses the children this spec renders to (nothing was written): "
            + "; ".join(f"{field}: {message}" for field, message in refused))


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server's name
        if self.path.split("?", 1)[0] != PATH:
            self.send_error(404)
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            out = json.dumps(review(body, self.server.kube() if self.server.kube else None)).encode()
        except Exception as err:  # noqa: BLE001 - a bad request is the caller's; answer, never crash
            log.warning("webhook: bad AdmissionReview: %s", err)
            self.send_error(400, str(err)[:200])
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


CERT_RELOAD_SECONDS = 30.0


def _tls_context(certfile: str, keyfile: str) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(certfile, keyfile)
    return context


def _read(*paths: str) -> bytes | None:
    out = b""
    for path in paths:
        try:
            with open(path, "rb") as f:
                out += f.read()
        except OSError:
            return None
    return out


HANDSHAKE_TIMEOUT_SECONDS = 10.0


class _TLSServer(ThreadingHTTPServer):
    """Each accepted connection is wrapped with the context in ``tls`` at that moment, so a
    context swapped in serves every connection accepted after it. The handshake runs in the
    connection's own thread, with a timeout: in the accepting thread, one client that
    connects and says nothing (a half-open connection, a port scan) would hold every other
    handshake, and with failurePolicy Ignore admission would stop checking without a word."""

    daemon_threads = True
    tls: ssl.SSLContext

    def get_request(self):
        sock, addr = self.socket.accept()
        try:
            return self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), addr
        except (ssl.SSLError, OSError):
            sock.close()
            raise

    def finish_request(self, request, client_address):
        request.settimeout(HANDSHAKE_TIMEOUT_SECONDS)
        request.do_handshake()
        super().finish_request(request, client_address)

    def handle_error(self, request, client_address):
        err = sys.exc_info()[1]
        if isinstance(err, (ssl.SSLError, OSError)):  # a client that left, timed out or spoke no TLS
            log.debug("webhook: connection from %s dropped: %s", client_address, err)
            return
        super().handle_error(request, client_address)


def serve(host: str, port: int, certfile: str, keyfile: str, kube=None,
          reload_seconds: float = CERT_RELOAD_SECONDS) -> ThreadingHTTPServer:
    """Serve the webhook over TLS on a daemon thread; returns the server (``.shutdown()`` stops it).
    ``kube``: a function giving the operator's client, for the children's dry-run.

    The certificate and key are read again every ``reload_seconds`` and, when they changed,
    served from the next connection on: the kubelet updates a mounted Secret in place, and
    the chart's certificate changes under a running pod whenever the chart is rendered
    without access to the cluster (``helm template``, GitOps: ``lookup`` finds no Secret,
    so a new CA goes into the webhook configuration's caBundle). Serving the old one until
    a restart would have the API server refuse the handshake, and with failurePolicy Ignore
    admission would stop checking without a word. A pair that does not load (the key and
    certificate caught mid-update) keeps the one served and is tried again."""
    from .health import http_server

    server = http_server(_TLSServer, host, port, _Handler)
    server.kube = kube
    loaded = _read(certfile, keyfile)  # before the load: a change in between is seen next round
    server.tls = _tls_context(certfile, keyfile)
    threading.Thread(target=server.serve_forever, name="webhook", daemon=True).start()
    if reload_seconds > 0:
        threading.Thread(target=_reload_loop, args=(server, certfile, keyfile, reload_seconds, loaded),
                         name="webhook-cert", daemon=True).start()
    return server


def _reload_loop(server: ThreadingHTTPServer, certfile: str, keyfile: str, every: float,
                 loaded: bytes | None) -> None:
    while True:
        time.sleep(every)
        if server.socket.fileno() < 0:
            return  # server_close()
        now = _read(certfile, keyfile)
        if now is None or now == loaded:
            continue
        try:
            server.tls = _tls_context(certfile, keyfile)
        except (ssl.SSLError, OSError) as err:
            log.warning("webhook: the changed certificate %s does not load (%s); still serving the one before",
                        certfile, err)
            continue
        loaded = now
        log.info("webhook: serving the changed certificate %s", certfile)
