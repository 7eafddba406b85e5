"""Checks the Kubernetes manifests and the Helm chart's rendering for what docs/deploy.md
promises an operator (scripts/helm-lint.sh runs it; no cluster is needed). Exits 1 naming
every promise a file breaks."""
import argparse
import sys

import yaml

failures = []


def check(ok, what):
    if not ok:
        failures.append(what)


def load(paths):
    docs = []
    for path in paths:
        with open(path) as f:
            docs += [d for d in yaml.safe_load_all(f) if d]
    return docs


def of_kind(docs, kind):
    return [d for d in docs if d.get("kind") == kind]


def env_of(container):
    return {e["name"]: e for e in container.get("env", [])}


def check_cluster(label, docs, replicas, cluster_tls=True, tls_secret=None, user_secret=None):
    sets = of_kind(docs, "StatefulSet")
    check(len(sets) == 1, f"{label}: one StatefulSet, found {len(sets)}")
    if not sets:
        return
    sts = sets[0]
    spec = sts["spec"]
    name = sts["metadata"]["name"]
    check(spec.get("podManagementPolicy") == "Parallel", f"{label}: podManagementPolicy Parallel")
    check(spec.get("replicas") == replicas, f"{label}: {replicas} replicas")
    services = {s["metadata"]["name"]: s for s in of_kind(docs, "Service")}
    headless = services.get(spec["serviceName"])
    check(headless is not None, f"{label}: the StatefulSet's serviceName is a Service")
    if headless:
        check(headless["spec"].get("clusterIP") == "None", f"{label}: headless nodes Service")
        check(headless["spec"].get("publishNotReadyAddresses") is True,
              f"{label}: publishNotReadyAddresses on the headless Service")
    clients = [s for n, s in services.items() if n != spec["serviceName"]]
    check(any(p["port"] == 5672 for s in clients for p in s["spec"]["ports"]),
          f"{label}: a client Service with AMQP")

    pod = spec["template"]["spec"]
    check(pod.get("terminationGracePeriodSeconds", 30) >= 3600,
          f"{label}: a termination grace period long enough for the preStop wait")
    check(pod.get("securityContext", {}).get("runAsNonRoot") is True, f"{label}: non-root")
    (container,) = pod["containers"]
    env = env_of(container)
    service = spec["serviceName"]
    check(env.get("POD_NAME", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
          == "metadata.name", f"{label}: POD_NAME from the downward API")
    check("$(POD_NAME)" in env.get("WARREN_NODE_NAME", {}).get("value", ""),
          f"{label}: WARREN_NODE_NAME from $(POD_NAME)")
    advertise = env.get("WARREN_CLUSTER_ADVERTISE", {}).get("value", "")
    check(advertise == f"$(POD_NAME).{service}.$(POD_NAMESPACE).svc:25672",
          f"{label}: WARREN_CLUSTER_ADVERTISE is the pod's DNS name, got {advertise!r}")
    seeds = env.get("WARREN_CLUSTER_SEEDS", {}).get("value", "").split(",")
    expected = [f"{name}-{i}.{service}.$(POD_NAMESPACE).svc:25672" for i in range(replicas)]
    check(seeds == expected, f"{label}: seeds {expected}, got {seeds}")
    check(env.get("WARREN_CLUSTER_LISTEN", {}).get("value") == "0.0.0.0:25672",
          f"{label}: cluster listener on every interface")
    check("WARREN_MEMORY_HIGH_WATERMARK_BYTES" in env, f"{label}: memory alarm from the limit")
    for var in ("WARREN_DEFAULT_USER", "WARREN_DEFAULT_PASS"):
        ref = env.get(var, {}).get("valueFrom", {}).get("secretKeyRef", {})
        check(bool(ref), f"{label}: {var} from a Secret")
        if user_secret:
            check(ref.get("name") == user_secret, f"{label}: {var} from Secret {user_secret}")

    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    check(ports.get("amqp") == 5672 and ports.get("cluster") == 25672
          and ports.get("management") == 15672, f"{label}: ports 5672, 15672, 25672")
    ready = container.get("readinessProbe", {})
    check(ready.get("tcpSocket", {}).get("port") in ("amqp", 5672),
          f"{label}: TCP readiness probe on AMQP")
    startup = container.get("startupProbe", {}).get("exec", {}).get("command", [])
    check(startup[:2] == ["warren", "ctl"], f"{label}: startup probe by warren ctl")
    check("livenessProbe" not in container, f"{label}: no liveness probe by default")
    pre_stop = " ".join(container.get("lifecycle", {}).get("preStop", {})
                        .get("exec", {}).get("command", []))
    wait_at = pre_stop.find("warren ctl await_online_quorum_plus_one")
    drain_at = pre_stop.find("warren ctl drain")
    check(0 <= wait_at < drain_at,
          f"{label}: preStop awaits quorum plus one, then drains")
    check("69" in pre_stop, f"{label}: preStop waits again on exit code 69 only")

    mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
    check(mounts.get("/var/lib/warren") == "data", f"{label}: data volume at /var/lib/warren")
    claims = [c["metadata"]["name"] for c in spec.get("volumeClaimTemplates", [])]
    check(claims == ["data"], f"{label}: a volume claim template for the data")
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    if cluster_tls:
        for var in ("WARREN_CLUSTER_TLS_CERT", "WARREN_CLUSTER_TLS_KEY", "WARREN_CLUSTER_TLS_CA"):
            check(env.get(var, {}).get("value", "").startswith("/etc/warren/cluster-tls/"),
                  f"{label}: {var} from the mounted Secret")
        secret = volumes.get("cluster-tls", {}).get("secret", {}).get("secretName")
        check(secret is not None, f"{label}: cluster TLS from a Secret")
        if tls_secret:
            check(secret == tls_secret, f"{label}: cluster TLS from Secret {tls_secret}")
    else:
        check("WARREN_CLUSTER_TLS_CERT" not in env, f"{label}: no cluster TLS when disabled")

    pdbs = of_kind(docs, "PodDisruptionBudget")
    check(len(pdbs) == 1 and pdbs[0]["spec"].get("maxUnavailable") == 1,
          f"{label}: a PodDisruptionBudget of one unavailable pod")
    selector = spec["selector"]["matchLabels"]
    labels = spec["template"]["metadata"]["labels"]
    check(all(labels.get(k) == v for k, v in selector.items()),
          f"{label}: the pod labels match the selector")
    for s in list(services.values()) + pdbs:
        sel = s["spec"].get("selector", {})
        sel = sel.get("matchLabels", sel)
        check(all(labels.get(k) == v for k, v in sel.items()),
              f"{label}: {s['kind']} {s['metadata']['name']} selects the pods")
    return sts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--plain", nargs="+", required=True)
    ap.add_argument("--chart", required=True)
    ap.add_argument("--chart-existing", required=True)
    ap.add_argument("--chart-plain-links", required=True)
    a = ap.parse_args()

    plain = load(a.plain)
    kustomization = [d for d in plain if d.get("kind") == "Kustomization"]
    check(len(kustomization) == 1, "deploy/kubernetes: a kustomization.yaml")
    listed = set(kustomization[0]["resources"]) if kustomization else set()
    check(listed == {p.rsplit("/", 1)[-1] for p in a.plain if "kustomization" not in p},
          "deploy/kubernetes: kustomization.yaml lists every manifest")
    check_cluster("deploy/kubernetes", plain, 3, tls_secret="warren-cluster-tls",
                  user_secret="warren-default-user")

    chart = load([a.chart])
    sts = check_cluster("chart (defaults)", chart, 3)
    secrets = {s["metadata"]["name"]: s for s in of_kind(chart, "Secret")}
    check(len(secrets) == 2, "chart (defaults): makes the login and cluster TLS Secrets")
    tls = [s for s in secrets.values() if s.get("type") == "kubernetes.io/tls"]
    check(bool(tls) and all(tls[0]["data"].get(k) for k in ("ca.crt", "tls.crt", "tls.key")),
          "chart (defaults): a generated CA, certificate and key")
    if sts:
        env = env_of(sts["spec"]["template"]["spec"]["containers"][0])
        check(env["WARREN_MEMORY_HIGH_WATERMARK_BYTES"]["value"] == str(int(0.4 * 2 * 2**30)),
              "chart (defaults): the memory alarm at 40 % of the 2Gi limit")

    existing = load([a.chart_existing])
    sts = check_cluster("chart (existing Secrets, 5 nodes)", existing, 5,
                        tls_secret="mq-cluster-tls", user_secret="mq-login")
    check(not of_kind(existing, "Secret"), "chart (existing Secrets): makes no Secret")
    if sts:
        (c,) = sts["spec"]["template"]["spec"]["containers"]
        env = env_of(c)
        check(env.get("WARREN_TLS_LISTEN", {}).get("value") == "0.0.0.0:5671",
              "chart (amqpTls): AMQP over TLS on 5671")
        check(env["WARREN_MEMORY_HIGH_WATERMARK_BYTES"]["value"] == str(int(0.4 * 512 * 2**20)),
              "chart (512Mi): the memory alarm at 40 % of the limit")

    check_cluster("chart (clusterTls.enabled=false)", load([a.chart_plain_links]), 3,
                  cluster_tls=False)

    for f in failures:
        print(f"check_manifests: {f}", file=sys.stderr)
    if failures:
        return 1
    print("check_manifests: the manifests and the chart keep every promise checked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
