#!/usr/bin/env python3
"""Captures the JobSet fixtures of tests/fixtures/{admission,kube-api}/jobset from real
Kubernetes: kube-apiserver v1.36 and the JobSet controller v0.11, on loopback.

Two control planes, as Switchyard sees them:
- a manager (etcd, kube-apiserver, the JobSet controller and its webhooks, and a capturing
  webhook registered after them as a MutatingWebhookConfiguration and a
  ValidatingWebhookConfiguration for jobsets and jobsets/status). The capturing webhook keeps
  every AdmissionReview body as it arrived and plays Switchyard's mutating webhook: a JobSet
  created with the queue label by anyone but the dispatcher gets `spec.suspend: true` and
  `spec.managedBy: switchyard.dev/dispatcher` (a JSONPatch), so the validating stage sees what
  it would see behind Switchyard. Everything else is allowed unchanged.
- a worker (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, three nodes kept by
  a small fake kubelet in this script, the JobSet controller), where copies run.

Needs python3 (standard library only), openssl, kubectl, and the binaries kube-apiserver, etcd,
kube-controller-manager, kube-scheduler and jobset-controller in $SWITCHYARD_K8S_ASSETS (or
target/k8s-assets, which .ci/run fills from ../shared/k8s).

    python3 tools/realk8s/capture-jobset.py            # writes the fixtures in place
    python3 tools/realk8s/capture-jobset.py --out DIR  # writes DIR/admission/jobset, DIR/kube-api/jobset
    python3 tools/realk8s/capture-jobset.py --keep     # keeps the work directory and its logs

Takes about a minute. The captured bodies differ from run to run only in uids, timestamps,
resourceVersions, tokens' credential ids and certificates' bytes.
"""

import argparse
import atexit
import base64
import http.client
import http.server
import json
import os
import random
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "tests/data/crds/jobset/jobset.x-k8s.io_jobsets.yaml"
QUEUE_LABEL = "switchyard.dev/queue-name"
MANAGED_BY = "switchyard.dev/dispatcher"
DISPATCHER_NS = "switchyard-system"
DISPATCHER = "switchyard"
NS = "research"
RUN_SECONDS = "fake-kubelet/run-seconds"
EXIT_CODE = "fake-kubelet/exit-code"

PROCESSES = []


def log(msg):
    print(f"capture-jobset: {msg}", flush=True)


def fail(msg):
    print(f"capture-jobset: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def stop_all():
    for p in reversed(PROCESSES):
        if p.poll() is None:
            p.kill()
            p.wait()


atexit.register(stop_all)


def run(*args, stdin=None):
    out = subprocess.run(args, input=stdin, capture_output=True, text=True)
    if out.returncode != 0:
        fail(f"{' '.join(map(str, args))}: {out.stderr.strip()}")
    return out.stdout


def free_port():
    # Below the ephemeral range, so an outgoing connection cannot take it before the process binds it.
    for _ in range(1000):
        port = random.randint(20000, 30000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    fail("no free port")


def spawn(name, args, logfile):
    out = open(logfile, "ab")
    p = subprocess.Popen([str(a) for a in args], stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    p.name = name
    p.logfile = logfile
    PROCESSES.append(p)
    return p


def wait_for(what, timeout, check, interval=0.2):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            got = check()
            if got:
                return got
        except Exception as e:  # noqa: BLE001 (what failed is reported at the deadline)
            last = e
        time.sleep(interval)
    fail(f"timed out after {timeout} s waiting for {what} (last error: {last})")


# --- PKI (openssl) ---------------------------------------------------------------------------

def ca(d, name):
    run("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-nodes", "-days", "30", "-subj", f"/CN={name}", "-keyout", d / f"{name}.key",
        "-out", d / f"{name}.crt", "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature")
    return d / f"{name}.crt", d / f"{name}.key"


def leaf(d, issuer, name, subject, ext):
    crt, key = issuer
    (d / f"{name}.ext").write_text(ext + "\n")
    run("openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-subj", subject, "-keyout", d / f"{name}.key", "-out", d / f"{name}.csr")
    run("openssl", "x509", "-req", "-in", d / f"{name}.csr", "-CA", crt, "-CAkey", key,
        "-CAcreateserial", "-days", "30", "-extfile", d / f"{name}.ext", "-out", d / f"{name}.crt")
    return d / f"{name}.crt", d / f"{name}.key"


def client_cert(d, issuer, name, user, groups=()):
    subject = "".join(f"/O={g}" for g in groups) + f"/CN={user}"
    return leaf(d, issuer, name, subject, "extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature")


def server_cert(d, issuer, name, sans):
    return leaf(d, issuer, name, f"/CN={name}",
                f"subjectAltName={sans}\nextendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature")


# --- API access ------------------------------------------------------------------------------

class Api:
    """HTTPS to one API server as one identity; returns (status, content-type, raw body)."""

    def __init__(self, port, ca_file, cert=None, token=None, user_agent="capture-jobset"):
        self.port = port
        self.ctx = ssl.create_default_context(cafile=str(ca_file))
        if cert:
            self.ctx.load_cert_chain(str(cert[0]), str(cert[1]))
        self.token = token
        self.user_agent = user_agent

    def call(self, method, path, body=None, content_type="application/json"):
        conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.ctx, timeout=30)
        headers = {"Accept": "application/json", "User-Agent": self.user_agent}
        data = None
        if body is not None:
            data = body if isinstance(body, (bytes, str)) else json.dumps(body)
            headers["Content-Type"] = content_type
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        conn.request(method, path, body=data, headers=headers)
        r = conn.getresponse()
        raw = r.read()
        conn.close()
        return r.status, r.getheader("Content-Type", ""), raw

    def json(self, method, path, body=None, content_type="application/json", ok=(200, 201)):
        status, _, raw = self.call(method, path, body, content_type)
        if status not in ok:
            fail(f"{method} {path}: {status} {raw[:600]!r}")
        return json.loads(raw) if raw else None

    def exchange(self, method, path, body=None, content_type="application/json"):
        """One call, recorded as tests/fixtures/kube-api records them."""
        status, ctype, raw = self.call(method, path, body, content_type)
        headers = {"accept": "application/json"}
        if body is not None:
            headers = {"content-type": content_type, **headers}
        return {
            "request": {"method": method, "path_and_query": path, "headers": headers,
                        "body": body},
            "response": {"status": status, "headers": {"content-type": ctype.split(";")[0]},
                         "body": json.loads(raw) if raw.startswith(b"{") else raw.decode()},
        }


# --- a control plane -------------------------------------------------------------------------

class Plane:
    def __init__(self, assets, work, name, full):
        self.name, self.full = name, full
        d = self.dir = work / name
        d.mkdir(parents=True)
        self.ca = ca(d, "ca")
        fp_ca = ca(d, "front-proxy-ca")
        serving = server_cert(d, self.ca, "apiserver",
                              "IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes.default.svc")
        fp_client = client_cert(d, fp_ca, "front-proxy-client", "front-proxy-client")
        self.admin_cert = client_cert(d, self.ca, "admin", "admin", ["system:masters"])
        run("openssl", "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", d / "sa.key")
        run("openssl", "ec", "-in", d / "sa.key", "-pubout", "-out", d / "sa.pub")
        etcd_port, peer_port, self.port = free_port(), free_port(), free_port()
        client_url, peer = f"http://127.0.0.1:{etcd_port}", f"http://127.0.0.1:{peer_port}"
        spawn(f"{name} etcd", [
            assets / "etcd", "--name", name, "--data-dir", d / "etcd",
            "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"{name}={peer}", "--unsafe-no-fsync", "--log-level", "warn",
        ], d / "etcd.log")
        spawn(f"{name} kube-apiserver", [
            assets / "kube-apiserver", "--etcd-servers", client_url,
            "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
            "--secure-port", self.port, "--cert-dir", d / "apiserver-certs",
            "--tls-cert-file", serving[0], "--tls-private-key-file", serving[1],
            "--client-ca-file", self.ca[0],
            "--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
            "--service-account-key-file", d / "sa.pub",
            "--service-account-signing-key-file", d / "sa.key",
            "--service-cluster-ip-range", "10.0.0.0/24", "--authorization-mode", "Node,RBAC",
            "--endpoint-reconciler-type", "none",
            # No node lifecycle controller runs to take the not-ready taint off the nodes.
            "--disable-admission-plugins", "TaintNodesByCondition",
            "--requestheader-client-ca-file", fp_ca[0],
            "--requestheader-allowed-names", "front-proxy-client",
            "--requestheader-username-headers", "X-Remote-User",
            "--requestheader-group-headers", "X-Remote-Group",
            "--requestheader-extra-headers-prefix", "X-Remote-Extra-",
            "--proxy-client-cert-file", fp_client[0], "--proxy-client-key-file", fp_client[1],
        ], d / "kube-apiserver.log")
        self.admin = Api(self.port, self.ca[0], cert=self.admin_cert)
        self.kubeconfig = self.write_kubeconfig("admin.kubeconfig", self.admin_cert)
        self.assets = assets

    def write_kubeconfig(self, file, cert):
        path = self.dir / file
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": self.name, "cluster": {
                "server": f"https://127.0.0.1:{self.port}", "certificate-authority": str(self.ca[0])}}],
            "users": [{"name": "u", "user": {"client-certificate": str(cert[0]),
                                             "client-key": str(cert[1])}}],
            "contexts": [{"name": self.name, "context": {"cluster": self.name, "user": "u"}}],
            "current-context": self.name,
        }))
        return path

    def wait_ready(self):
        wait_for(f"{self.name} /readyz", 60, lambda: self.admin.call("GET", "/readyz")[2] == b"ok")

    def start_controllers(self):
        d, assets = self.dir, self.assets
        kcm = self.write_kubeconfig("kcm.kubeconfig", client_cert(
            d, self.ca, "kcm", "system:kube-controller-manager"))
        spawn(f"{self.name} kube-controller-manager", [
            assets / "kube-controller-manager", "--kubeconfig", kcm,
            "--authentication-kubeconfig", kcm, "--authorization-kubeconfig", kcm,
            "--bind-address", "127.0.0.1", "--secure-port", free_port(),
            "--cert-dir", d / "kcm-certs", "--controllers", "*,-node-lifecycle-controller",
            "--service-account-private-key-file", d / "sa.key", "--root-ca-file", self.ca[0],
            "--use-service-account-credentials", "--leader-elect=false",
            "--kube-api-qps", "200", "--kube-api-burst", "400",
        ], d / "kube-controller-manager.log")
        sched = self.write_kubeconfig("scheduler.kubeconfig", client_cert(
            d, self.ca, "scheduler", "system:kube-scheduler"))
        (d / "scheduler.yaml").write_text(json.dumps({
            "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": str(sched)}, "leaderElection": {"leaderElect": False}}))
        spawn(f"{self.name} kube-scheduler", [
            assets / "kube-scheduler", "--config", d / "scheduler.yaml",
            "--authentication-kubeconfig", sched, "--authorization-kubeconfig", sched,
            "--bind-address", "127.0.0.1", "--secure-port", free_port(), "--cert-dir", d / "sched-certs",
        ], d / "kube-scheduler.log")

    def kubectl(self, *args, stdin=None):
        return run("kubectl", "--kubeconfig", self.kubeconfig, *args, stdin=stdin)

    def install_jobset(self):
        crd = CRD.read_text()
        self.admin.json("PATCH", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                        "jobsets.jobset.x-k8s.io?fieldManager=capture-jobset&force=true",
                        crd, "application/apply-patch+yaml")

        def established():
            crd = self.admin.json("GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                                  "jobsets.jobset.x-k8s.io")
            return any(c["type"] == "Established" and c["status"] == "True"
                       for c in crd.get("status", {}).get("conditions", []))
        wait_for("the JobSet CRD Established", 30, established)
        d = self.dir / "jobset"
        d.mkdir()
        jca = ca(d, "jobset-ca")
        server_cert(d, jca, "tls", "IP:127.0.0.1")  # tls.crt, tls.key: what certDir must hold
        webhook, metrics, health = free_port(), free_port(), free_port()
        (d / "config.yaml").write_text(json.dumps({
            "apiVersion": "config.jobset.x-k8s.io/v1alpha1", "kind": "Configuration",
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "webhook": {"host": "127.0.0.1", "port": webhook, "certDir": str(d)},
            "metrics": {"bindAddress": f"127.0.0.1:{metrics}", "certDir": str(d)},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
        }))
        bundle = base64.b64encode(jca[0].read_bytes()).decode()
        for obj in jobset_webhooks(webhook, bundle):
            plural = obj["kind"].lower() + "s"
            self.admin.json("POST", f"/apis/admissionregistration.k8s.io/v1/{plural}", obj)
        spawn(f"{self.name} jobset-controller", [
            self.assets / "jobset-controller", "--kubeconfig", self.kubeconfig,
            "--config", d / "config.yaml", "--zap-devel=false",
        ], self.dir / "jobset-controller.log")

        def ready():
            with urllib.request.urlopen(f"http://127.0.0.1:{health}/readyz", timeout=2) as r:
                return r.read() == b"ok"
        wait_for(f"{self.name} jobset-controller /readyz", 60, ready)
        # The webhook server answers once /readyz is ok; a dry-run create proves the API server reaches it.
        wait_for(f"{self.name}: the JobSet webhooks answer", 30,
                 lambda: self.admin.call("POST", f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/"
                                         "jobsets?dryRun=All", jobset("probe", "default"))[0] == 201)


def jobset_webhooks(port, bundle):
    """The JobSet controller's webhooks (config/components/webhook), at 127.0.0.1."""
    def hook(name, path, group, resource, ops, selector=None):
        h = {"name": name, "admissionReviewVersions": ["v1"], "sideEffects": "None",
             "failurePolicy": "Fail",
             "clientConfig": {"url": f"https://127.0.0.1:{port}{path}", "caBundle": bundle},
             "rules": [{"apiGroups": [group], "apiVersions": ["v1alpha2" if group else "v1"],
                        "operations": ops, "resources": [resource]}]}
        if selector:
            h["objectSelector"] = {"matchExpressions": [
                {"key": "jobset.sigs.k8s.io/jobset-name", "operator": "Exists"}]}
        return h
    return [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
         "metadata": {"name": "jobset-mutating-webhook-configuration"},
         "webhooks": [hook("mjobset.kb.io", "/mutate-jobset-x-k8s-io-v1alpha2-jobset",
                           "jobset.x-k8s.io", "jobsets", ["CREATE"]),
                      hook("mpod.kb.io", "/mutate--v1-pod", "", "pods", ["CREATE"], True)]},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
         "metadata": {"name": "jobset-validating-webhook-configuration"},
         "webhooks": [hook("vjobset.kb.io", "/validate-jobset-x-k8s-io-v1alpha2-jobset",
                           "jobset.x-k8s.io", "jobsets", ["CREATE", "UPDATE"]),
                      hook("vpod.kb.io", "/validate--v1-pod", "", "pods", ["CREATE"], True)]},
    ]


# --- the capturing webhook -------------------------------------------------------------------

class Captures:
    def __init__(self):
        self.lock = threading.Lock()
        self.bodies = []  # (path, raw bytes, parsed)

    def find(self, path, name, operation, sub_resource=None, user=None):
        with self.lock:
            for p, raw, review in reversed(self.bodies):
                r = review["request"]
                if (p == path and r.get("name") == name and r["operation"] == operation
                        and r.get("subResource") == sub_resource
                        and (user is None or r["userInfo"]["username"] == user)):
                    return raw
        return None


def capture_server(captures, cert, dispatcher_user):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            raw = self.rfile.read(int(self.headers["Content-Length"]))
            review = json.loads(raw)
            # The API server adds ?timeout=10s (the webhook's timeoutSeconds) to the URL.
            path = self.path.split("?")[0]
            with captures.lock:
                captures.bodies.append((path, raw, review))
            req = review["request"]
            response = {"uid": req["uid"], "allowed": True}
            obj = req.get("object") or {}
            labels = obj.get("metadata", {}).get("labels", {})
            if (path == "/mutate" and req["operation"] == "CREATE" and QUEUE_LABEL in labels
                    and req["userInfo"]["username"] != dispatcher_user
                    and "managedBy" not in obj.get("spec", {})):
                # What Switchyard's mutating webhook answers for a queued JobSet.
                patch = [{"op": "add", "path": "/spec/suspend", "value": True},
                         {"op": "add", "path": "/spec/managedBy", "value": MANAGED_BY}]
                response["patchType"] = "JSONPatch"
                response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
            body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                               "response": response}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(cert[0]), str(cert[1]))
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server.server_address[1]


def capture_webhooks(port, bundle):
    rules = [{"apiGroups": ["jobset.x-k8s.io"], "apiVersions": ["v1alpha2"],
              "operations": ["CREATE", "UPDATE", "DELETE"], "resources": ["jobsets", "jobsets/status"],
              "scope": "Namespaced"}]

    def hook(name, path):
        return {"name": name, "admissionReviewVersions": ["v1"], "sideEffects": "None",
                "failurePolicy": "Fail", "timeoutSeconds": 10, "rules": rules,
                "clientConfig": {"url": f"https://127.0.0.1:{port}{path}", "caBundle": bundle}}
    # Named to sort after jobset-mutating-webhook-configuration: the API server calls mutating
    # configurations in name order, so this one sees the JobSet as the JobSet webhook defaulted it.
    mutating = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
                "metadata": {"name": "zz-switchyard-capture"},
                "webhooks": [{**hook("capture-mutate.switchyard.dev", "/mutate"),
                              "reinvocationPolicy": "Never"}]}
    validating = {"apiVersion": "admissionregistration.k8s.io/v1",
                  "kind": "ValidatingWebhookConfiguration",
                  "metadata": {"name": "zz-switchyard-capture"},
                  "webhooks": [hook("capture-validate.switchyard.dev", "/validate")]}
    return [mutating, validating]


# --- a fake kubelet (the worker's pods) ------------------------------------------------------

def now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def fake_kubelet(api, nodes, stop):
    for n in nodes:
        capacity = {"cpu": "32", "memory": "128Gi", "pods": "110", "nvidia.com/gpu": "8",
                    "ephemeral-storage": "100Gi"}
        api.json("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": n, "labels": {"kubernetes.io/hostname": n, "kubernetes.io/os": "linux"}}})
        api.json("PATCH", f"/api/v1/nodes/{n}/status", {"status": {
            "capacity": capacity, "allocatable": capacity,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "fake kubelet", "lastHeartbeatTime": now(),
                            "lastTransitionTime": now()}],
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}]}},
            "application/merge-patch+json")
    started = {}  # uid -> (time, pod)
    done, deleting = set(), set()

    def loop():
        while not stop.is_set():
            try:
                step()
            except OSError:
                pass  # the API server is going away, or was briefly unreachable: the next round retries
            time.sleep(0.3)

    def step():
        nonlocal n
        status, _, raw = api.call("GET", "/api/v1/pods?fieldSelector=spec.nodeName!%3D")
        pods = json.loads(raw)["items"] if status == 200 else []
        for pod in pods:
            m = pod["metadata"]
            uid, path = m["uid"], f"/api/v1/namespaces/{m['namespace']}/pods/{m['name']}"
            if m.get("deletionTimestamp"):
                if uid not in deleting:
                    deleting.add(uid)
                    api.call("DELETE", path, {"gracePeriodSeconds": 0,
                                              "preconditions": {"uid": uid}})
                continue
            containers = [c["name"] for c in pod["spec"]["containers"]]
            if uid not in started:
                n += 1
                t = now()
                started[uid] = (time.time(), t)
                ip = f"10.244.0.{n % 250 + 1}"
                api.call("PATCH", path + "/status", {"status": {
                    "phase": "Running", "hostIP": "127.0.0.1", "podIP": ip,
                    "podIPs": [{"ip": ip}], "startTime": t,
                    "conditions": conditions(True),
                    "containerStatuses": [{"name": c, "image": "busybox:1.36", "imageID": "",
                                           "containerID": f"fake://{uid}/{c}", "ready": True,
                                           "started": True, "restartCount": 0,
                                           "state": {"running": {"startedAt": t}}}
                                          for c in containers]}},
                    "application/merge-patch+json")
                continue
            seconds = (m.get("annotations") or {}).get(RUN_SECONDS)
            if uid in done or seconds is None or time.time() - started[uid][0] < float(seconds):
                continue
            done.add(uid)
            code = int((m.get("annotations") or {}).get(EXIT_CODE, "0"))
            api.call("PATCH", path + "/status", {"status": {
                "phase": "Succeeded" if code == 0 else "Failed",
                "conditions": conditions(False),
                "containerStatuses": [{"name": c, "image": "busybox:1.36", "imageID": "",
                                       "containerID": f"fake://{uid}/{c}", "ready": False,
                                       "started": False, "restartCount": 0,
                                       "state": {"terminated": {
                                           "exitCode": code,
                                           "reason": "Completed" if code == 0 else "Error",
                                           "startedAt": started[uid][1], "finishedAt": now()}}}
                                      for c in containers]}},
                "application/merge-patch+json")
    n = 0
    threading.Thread(target=loop, daemon=True).start()


def conditions(ready):
    t = now()
    status = "True" if ready else "False"
    out = []
    for type_ in ["PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled"]:
        s = "True" if type_ in ("Initialized", "PodScheduled") else status
        c = {"type": type_, "status": s, "lastProbeTime": None, "lastTransitionTime": t}
        if s == "False":
            c["reason"] = "PodCompleted"
        out.append(c)
    return out


# --- the objects -----------------------------------------------------------------------------

def jobset(name, ns, labels=None, seconds=4, exit_code=None):
    """Two replicated Jobs of different pod shapes: a driver (1 pod, 1 CPU) and two worker
    Jobs of 2 pods each (2 CPUs and 1 GPU, limits = requests)."""
    annotations = {RUN_SECONDS: str(seconds)}
    failing = dict(annotations)
    if exit_code is not None:
        failing[EXIT_CODE] = str(exit_code)

    def template(pods, resources, annotations):
        return {"spec": {"parallelism": pods, "completions": pods, "backoffLimit": 0,
                         "template": {"metadata": {"annotations": annotations}, "spec": {
                             "restartPolicy": "Never",
                             "containers": [{"name": "main", "image": "busybox:1.36",
                                             "command": ["sh", "-c", "echo work"],
                                             "resources": {"requests": resources,
                                                           "limits": resources}}]}}}}
    meta = {"name": name, "namespace": ns}
    if labels:
        meta["labels"] = labels
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": meta,
        "spec": {"replicatedJobs": [
            {"name": "driver", "replicas": 1,
             "template": template(1, {"cpu": "1", "memory": "1Gi"}, annotations)},
            {"name": "workers", "replicas": 2,
             "template": template(2, {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "1"}, failing)},
        ]},
    }


def worker_copy(manager_object, manager_id):
    """The copy the dispatcher would make: no managedBy, unsuspended, origin labels, none of
    what the manager's API server generated."""
    obj = json.loads(json.dumps(manager_object))
    meta = obj["metadata"]
    uid = meta["uid"]
    for k in ["uid", "resourceVersion", "creationTimestamp", "generation", "managedFields"]:
        meta.pop(k, None)
    meta["labels"]["switchyard.dev/origin"] = manager_id
    meta["labels"]["switchyard.dev/origin-uid"] = uid
    obj["spec"].pop("managedBy", None)
    obj["spec"]["suspend"] = False
    obj.pop("status", None)
    return obj


# --- output ----------------------------------------------------------------------------------

def pretty(raw):
    return json.dumps(json.loads(raw), indent=2, ensure_ascii=False) + "\n"


class Out:
    def __init__(self, root):
        self.admission = root / "admission/jobset"
        self.kube_api = root / "kube-api/jobset"
        self.facts = []
        for d in (self.admission, self.kube_api):
            d.mkdir(parents=True, exist_ok=True)

    def review(self, file, raw):
        if raw is None:
            fail(f"no AdmissionReview captured for {file}")
        (self.admission / file).write_text(pretty(raw))
        log(f"admission/jobset/{file}")

    def exchange(self, file, record):
        (self.kube_api / file).write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
        log(f"kube-api/jobset/{file}: {record['response']['status']}")

    def fact(self, what, record):
        body = record["response"]["body"]
        msg = body.get("message") if isinstance(body, dict) else body
        self.facts.append((what, record["response"]["status"], msg))


def jobsets_path(ns, name=None, sub=None):
    p = f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets"
    if name:
        p += f"/{name}"
    if sub:
        p += f"/{sub}"
    return p


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "tests/fixtures")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    assets = Path(os.environ.get("SWITCHYARD_K8S_ASSETS") or ROOT / "target/k8s-assets")
    for b in ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "jobset-controller"]:
        if not os.access(assets / b, os.X_OK):
            fail(f"{assets / b} is missing: set SWITCHYARD_K8S_ASSETS or run the asset step of .ci/run")
    for tool in ["openssl", "kubectl"]:
        if not shutil.which(tool):
            fail(f"{tool} is not on PATH")
    work = Path(tempfile.mkdtemp(prefix="capture-jobset-"))
    log(f"work directory {work}")
    out = Out(args.out)
    try:
        capture(assets, work, out)
    except SystemExit:
        log(f"failed; logs kept in {work}")
        raise
    stop_all()
    if args.keep:
        log(f"logs kept in {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)


def capture(assets, work, out):
    manager = Plane(assets, work, "manager", full=False)
    worker = Plane(assets, work, "worker", full=True)
    manager.wait_ready()
    worker.wait_ready()
    worker.start_controllers()
    for plane in (manager, worker):
        plane.install_jobset()
        plane.kubectl("create", "namespace", NS)
    stop = threading.Event()
    fake_kubelet(worker.admin, ["node-0", "node-1", "node-2"], stop)
    log("control planes, JobSet controllers and the worker's nodes ready")

    # The manager: the dispatcher's ServiceAccount, alice, the capturing webhook.
    m = manager.admin
    m.json("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                          "metadata": {"name": DISPATCHER_NS}})
    m.json("POST", f"/api/v1/namespaces/{DISPATCHER_NS}/serviceaccounts",
           {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": DISPATCHER}})
    manager.kubectl("create", "clusterrole", "jobsets", "--verb=get,list,watch,create,update,patch,delete",
                    "--resource=jobsets.jobset.x-k8s.io,jobsets.jobset.x-k8s.io/status")
    manager.kubectl("create", "clusterrolebinding", "switchyard-jobsets", "--clusterrole=jobsets",
                    f"--serviceaccount={DISPATCHER_NS}:{DISPATCHER}")
    manager.kubectl("create", "rolebinding", "alice-jobsets", "-n", NS, "--clusterrole=jobsets",
                    "--user=alice")
    token = m.json("POST", f"/api/v1/namespaces/{DISPATCHER_NS}/serviceaccounts/{DISPATCHER}/token",
                   {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                    "spec": {"expirationSeconds": 3600}})["status"]["token"]
    # kube-rs's default User-Agent names the crate; the field manager is the agent's first word.
    dispatcher = Api(manager.port, manager.ca[0], token=token, user_agent="switchyard/0.1.0")
    dispatcher_user = f"system:serviceaccount:{DISPATCHER_NS}:{DISPATCHER}"
    captures = Captures()
    cap_ca = ca(manager.dir, "capture-ca")
    cap_port = capture_server(captures, server_cert(manager.dir, cap_ca, "capture", "IP:127.0.0.1"),
                              dispatcher_user)
    bundle = base64.b64encode(cap_ca[0].read_bytes()).decode()
    for obj in capture_webhooks(cap_port, bundle):
        plural = obj["kind"].lower() + "s"
        m.json("POST", f"/apis/admissionregistration.k8s.io/v1/{plural}", obj)

    def capturing():
        status, _, raw = m.call("POST", jobsets_path("default") + "?dryRun=All", jobset("probe", "default"))
        if status != 201:
            raise RuntimeError(f"{status} {raw[:300]!r}")
        return captures.find("/validate", "probe", "CREATE")
    wait_for("the capturing webhook to be called", 30, capturing)

    # 1. CREATE with the queue label: the mutating stage sees it defaulted by the JobSet
    #    webhook; the validating stage sees it after Switchyard's patch (suspended, managed).
    queued = jobset("trainer", NS, {QUEUE_LABEL: NS})
    manager.kubectl("create", "-f", "-", stdin=json.dumps(queued))
    created_at = time.time()
    out.review("mutate-create-queued.json", captures.find("/mutate", "trainer", "CREATE"))
    out.review("validate-create-queued.json", captures.find("/validate", "trainer", "CREATE"))

    # 2. CREATE without the queue label (the JobSet controller of the manager runs it).
    manager.kubectl("create", "-f", "-", stdin=json.dumps(jobset("unqueued", NS, {"app": "trainer"})))
    out.review("mutate-create-no-queue.json", captures.find("/mutate", "unqueued", "CREATE"))
    out.review("validate-create-no-queue.json", captures.find("/validate", "unqueued", "CREATE"))

    # 3. An ordinary user unsuspends a queued JobSet (Switchyard denies that; here it passes).
    manager.kubectl("create", "-f", "-", stdin=json.dumps(jobset("held", NS, {QUEUE_LABEL: NS})))
    manager.kubectl("patch", "jobset", "held", "-n", NS, "--type=merge",
                    "-p", '{"spec":{"suspend":false}}', "--as=alice")
    out.review("mutate-update-unsuspend-by-user.json", captures.find("/mutate", "held", "UPDATE", user="alice"))
    out.review("validate-update-unsuspend-by-user.json",
               captures.find("/validate", "held", "UPDATE", user="alice"))

    # 4. The queued JobSet, left alone by the manager's JobSet controller.
    time.sleep(max(0.0, created_at + 5 - time.time()))
    out.exchange("get_jobset_queued.json", m.exchange("GET", jobsets_path(NS, "trainer")))
    jobs = m.json("GET", f"/apis/batch/v1/namespaces/{NS}/jobs?labelSelector=jobset.sigs.k8s.io%2Fjobset-name%3Dtrainer")
    if jobs["items"]:
        fail("the manager's JobSet controller made Jobs for a JobSet managed by Switchyard")
    unqueued_jobs = m.json("GET", f"/apis/batch/v1/namespaces/{NS}/jobs?labelSelector=jobset.sigs.k8s.io%2Fjobset-name%3Dunqueued")
    log(f"manager: {len(jobs['items'])} Jobs for trainer (managed), {len(unqueued_jobs['items'])} for unqueued")

    # 5. The dispatcher unsuspends it (a merge patch as kube-rs sends it).
    out.exchange("patch_jobset_unsuspend_by_dispatcher.json", dispatcher.exchange(
        "PATCH", jobsets_path(NS, "trainer"), {"spec": {"suspend": False}}, "application/merge-patch+json"))
    out.review("mutate-update-unsuspend-by-dispatcher.json",
               captures.find("/mutate", "trainer", "UPDATE", user=dispatcher_user))
    out.review("validate-update-unsuspend-by-dispatcher.json",
               captures.find("/validate", "trainer", "UPDATE", user=dispatcher_user))
    manager_trainer = m.json("GET", jobsets_path(NS, "trainer"))

    # 6. Its copy runs in the worker: mid-run, a Job, a pod, the Service, then Completed.
    w = worker.admin
    w.json("POST", jobsets_path(NS), worker_copy(manager_trainer, "switchyard-system.manager"))

    def running():
        js = w.json("GET", jobsets_path(NS, "trainer"))
        st = js.get("status", {}).get("replicatedJobsStatus", [])
        return len(st) == 2 and all(r["ready"] + r["succeeded"] >= 1 for r in st) and \
            any(r["active"] > 0 for r in st)
    wait_for("the copy running in the worker", 60, running)
    out.exchange("get_jobset_running.json", w.exchange("GET", jobsets_path(NS, "trainer")))
    out.exchange("get_job_of_jobset.json",
                 w.exchange("GET", f"/apis/batch/v1/namespaces/{NS}/jobs/trainer-workers-0"))
    pods = w.json("GET", f"/api/v1/namespaces/{NS}/pods?labelSelector="
                  "jobset.sigs.k8s.io%2Fjobset-name%3Dtrainer")["items"]
    pod = sorted(p["metadata"]["name"] for p in pods if p["metadata"]["name"].startswith("trainer-workers-1-1"))[0]
    out.exchange("get_pod_of_jobset.json", w.exchange("GET", f"/api/v1/namespaces/{NS}/pods/{pod}"))
    out.exchange("get_service_of_jobset.json", w.exchange("GET", f"/api/v1/namespaces/{NS}/services/trainer"))

    def terminal(name):
        def check():
            js = w.json("GET", jobsets_path(NS, name))
            return js.get("status", {}).get("terminalState")
        return check
    wait_for("the copy Completed", 90, terminal("trainer"))
    completed = w.exchange("GET", jobsets_path(NS, "trainer"))
    out.exchange("get_jobset_completed.json", completed)

    # 7. The dispatcher mirrors the copy's status onto the manager's JobSet (status subresource).
    status = completed["response"]["body"]["status"]
    out.exchange("patch_jobset_status_mirror.json", dispatcher.exchange(
        "PATCH", jobsets_path(NS, "trainer", "status"), {"status": status}, "application/merge-patch+json"))
    out.review("mutate-update-status-by-dispatcher.json",
               captures.find("/mutate", "trainer", "UPDATE", "status", dispatcher_user))
    out.review("validate-update-status-by-dispatcher.json",
               captures.find("/validate", "trainer", "UPDATE", "status", dispatcher_user))

    # 8. A JobSet whose worker pods fail, in the worker: Failed.
    w.json("POST", jobsets_path(NS), jobset("trainer-fails", NS, seconds=2, exit_code=1))
    wait_for("the failing JobSet Failed", 90, terminal("trainer-fails"))
    out.exchange("get_jobset_failed.json", w.exchange("GET", jobsets_path(NS, "trainer-fails")))
    # What becomes of the Jobs still running when the JobSet failed.
    time.sleep(5)
    out.exchange("get_jobset_failed_later.json", w.exchange("GET", jobsets_path(NS, "trainer-fails")))
    out.exchange("list_jobs_of_failed_jobset.json", w.exchange(
        "GET", f"/apis/batch/v1/namespaces/{NS}/jobs?labelSelector=jobset.sigs.k8s.io%2Fjobset-name%3Dtrainer-fails"))

    # 9. What the manager's API server makes of status and spec writes on a managed JobSet.
    status_writes(m, dispatcher, out)

    # 10. DELETE of the queued JobSet by its user.
    manager.kubectl("delete", "jobset", "trainer", "-n", NS, "--wait=false")
    out.review("mutate-delete.json", captures.find("/mutate", "trainer", "DELETE"))
    out.review("validate-delete.json", captures.find("/validate", "trainer", "DELETE"))

    notes = out.kube_api / "status-writes.txt"
    notes.write_text("".join(f"{what}\n  -> {code}: {msg}\n" for what, code, msg in out.facts))
    log(f"kube-api/jobset/status-writes.txt ({len(out.facts)} writes)")


def status_writes(m, dispatcher, out):
    """Writes on `held` (managed by Switchyard, suspended again first): each one recorded in
    status-writes.txt, the telling ones as exchanges too."""
    m.json("PATCH", jobsets_path(NS, "held"), {"spec": {"suspend": True}}, "application/merge-patch+json")
    path = jobsets_path(NS, "held", "status")
    merge = "application/merge-patch+json"
    t = now()
    good = {"type": "Completed", "status": "True", "reason": "AllJobsCompleted",
            "message": "jobset completed successfully", "lastTransitionTime": t}
    cases = [
        ("status: a condition without reason, message, lastTransitionTime", "patch_jobset_status_condition_incomplete.json",
         {"status": {"conditions": [{"type": "Completed", "status": "True"}]}}),
        ("status: a condition with an empty reason", None,
         {"status": {"conditions": [{**good, "reason": ""}]}}),
        ("status: a reason that is not CamelCase-ish (has a space)", None,
         {"status": {"conditions": [{**good, "reason": "All Jobs Completed"}]}}),
        ("status: condition status Maybe", None,
         {"status": {"conditions": [{**good, "status": "Maybe"}]}}),
        ("status: a custom condition type switchyard.dev/Dispatched", "patch_jobset_status_custom_condition.json",
         {"status": {"conditions": [{**good, "type": "switchyard.dev/Dispatched", "reason": "Dispatched",
                                     "message": "copy created in worker w1"}]}}),
        ("status: a lastTransitionTime that is no date-time", None,
         {"status": {"conditions": [{**good, "lastTransitionTime": "yesterday"}]}}),
        ("status: terminalState Exploded (no enum in the schema)", "patch_jobset_status_terminalstate_any.json",
         {"status": {"terminalState": "Exploded"}}),
        ("status: replicatedJobsStatus entry with only a name", "patch_jobset_status_rjs_incomplete.json",
         {"status": {"replicatedJobsStatus": [{"name": "workers"}]}}),
        ("status: replicatedJobsStatus for a replicatedJob the spec does not have", None,
         {"status": {"replicatedJobsStatus": [{"name": "nosuch", "active": 0, "failed": 0, "ready": 0,
                                               "succeeded": 0, "suspended": 0}]}}),
        ("status: negative restarts", None, {"status": {"restarts": -1}}),
        ("status: an unknown status field", None, {"status": {"futureField": 1}}),
        ("status: Completed=True while spec.suspend is true", None,
         {"status": {"conditions": [good], "terminalState": "Completed"}}),
        ("status: Completed back to False after Completed=True", None,
         {"status": {"conditions": [{**good, "status": "False", "reason": "Undone"}], "terminalState": None}}),
        ("status: a merge patch carrying spec.suspend and a label too", "patch_jobset_status_spec_ignored.json",
         {"metadata": {"labels": {"via-status": "yes"}}, "spec": {"suspend": False},
          "status": {"restarts": 0}}),
    ]
    for what, file, body in cases:
        record = dispatcher.exchange("PATCH", path, body, merge)
        out.fact(what, record)
        if file:
            out.exchange(file, record)
    # Strategic merge patch is not served for custom resources.
    record = dispatcher.exchange("PATCH", path, {"status": {"restarts": 0}},
                                 "application/strategic-merge-patch+json")
    out.fact("status: a strategic merge patch", record)
    out.exchange("patch_jobset_status_strategic_merge.json", record)
    # PUT with a stale resourceVersion.
    current = m.json("GET", path)
    stale = json.loads(json.dumps(current))
    stale["metadata"]["resourceVersion"] = "1"
    record = dispatcher.exchange("PUT", path, stale)
    out.fact("status: PUT with a stale resourceVersion", record)
    current = m.json("GET", path)
    no_rv = json.loads(json.dumps(current))
    no_rv["metadata"].pop("resourceVersion")
    out.fact("status: PUT without a resourceVersion", dispatcher.exchange("PUT", path, no_rv))
    # Server-side apply of status: conditions merge by type.
    apply = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
             "metadata": {"name": "held", "namespace": NS},
             "status": {"conditions": [{**good, "type": "StartupPolicyCompleted", "reason": "X"}]}}
    record = dispatcher.exchange("PATCH", path + "?fieldManager=switchyard-status&force=true",
                                 apply, "application/apply-patch+yaml")
    out.fact("status: server-side apply of one condition (fieldManager switchyard-status)", record)
    conds = [c["type"] for c in m.json("GET", path).get("status", {}).get("conditions", [])]
    out.facts.append(("  conditions after the apply", "", ", ".join(conds)))

    # The spec, through the JobSet validating webhook and the CEL rules.
    spec_path = jobsets_path(NS, "held")
    spec_cases = [
        ("spec: change managedBy", "patch_jobset_managedby_change.json", {"spec": {"managedBy": "kueue.x-k8s.io/multikueue"}}),
        ("spec: remove managedBy", None, {"spec": {"managedBy": None}}),
        # held has no failurePolicy: self == oldSelf is a transition rule, not checked when the old value is unset.
        ("spec: add failurePolicy where none was set (CEL)", "patch_jobset_failurepolicy_add.json",
         {"spec": {"failurePolicy": {"maxRestarts": 3}}}),
        ("spec: change failurePolicy.maxRestarts 3 -> 4 (CEL)", "patch_jobset_failurepolicy_change.json",
         {"spec": {"failurePolicy": {"maxRestarts": 4}}}),
        ("spec: change network.enableDNSHostnames (CEL)", None, {"spec": {"network": {"enableDNSHostnames": False}}}),
        ("spec: change successPolicy (CEL)", None, {"spec": {"successPolicy": {"operator": "Any"}}}),
    ]
    for what, file, body in spec_cases:
        record = dispatcher.exchange("PATCH", spec_path, body, merge)
        out.fact(what, record)
        if file:
            out.exchange(file, record)
    held = m.json("GET", spec_path)
    rjs = held["spec"]["replicatedJobs"]
    for what, change in [
        ("spec: replicas 2 -> 3 of workers while suspended", lambda r: r[1].__setitem__("replicas", 3)),
        ("spec: add a pod template label while suspended", lambda r: r[1]["template"]["spec"]["template"]["metadata"].setdefault("labels", {}).__setitem__("x", "y")),
        ("spec: remove a replicatedJob while suspended", lambda r: r.pop(0)),
    ]:
        copy = json.loads(json.dumps(rjs))
        change(copy)
        out.fact(what, dispatcher.exchange("PATCH", spec_path, {"spec": {"replicatedJobs": copy}}, merge))
    out.fact("spec: unsuspend", dispatcher.exchange("PATCH", spec_path, {"spec": {"suspend": False}}, merge))
    held = m.json("GET", spec_path)
    copy = json.loads(json.dumps(held["spec"]["replicatedJobs"]))
    copy[1]["replicas"] = 3
    out.fact("spec: replicas 2 -> 3 of workers while unsuspended",
             dispatcher.exchange("PATCH", spec_path, {"spec": {"replicatedJobs": copy}}, merge))
    copy = json.loads(json.dumps(held["spec"]["replicatedJobs"]))
    copy[1]["template"]["spec"]["template"]["metadata"].setdefault("labels", {})["z"] = "w"
    out.fact("spec: add a pod template label while unsuspended",
             dispatcher.exchange("PATCH", spec_path, {"spec": {"replicatedJobs": copy}}, merge))
    out.fact("spec: suspend again", dispatcher.exchange("PATCH", spec_path, {"spec": {"suspend": True}}, merge))


if __name__ == "__main__":
    main()
