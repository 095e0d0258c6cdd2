"""The Helm chart, checked as far as an offline machine allows: `helm lint --strict`, `helm
template` over the values files in charts/larder/ci, every rendered manifest validated against the
Kubernetes OpenAPI schemas (kubernetes-validate, offline, strict), the PrometheusRule's rules by
`promtool check rules`, and the rendered larder.toml by the real binary (`larder serve
--check-config`). No cluster is reachable here, so nothing is installed."""

import base64
import random
import re
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from conftest import ROOT, FleetOf, binary, metric

CHART = ROOT / "charts" / "larder"
VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
KUBERNETES_VERSION = "1.30"
# Custom resources of the Prometheus Operator: no schema ships with kubernetes-validate.
CRDS = {"ServiceMonitor", "PrometheusRule"}


def helm(*args, check=True):
    exe = shutil.which("helm") or str(Path.home() / "go" / "bin" / "helm")
    return subprocess.run([exe, *args], check=check, capture_output=True, text=True)


def refused_render(*sets: str) -> str:
    """helm's error for the minimal values with `sets`, which it must refuse to render."""
    args = ["template", "larder", str(CHART), "-f", str(CHART / "ci" / "minimal-values.yaml")]
    for s in sets:
        args += ["--set", s]
    result = helm(*args, check=False)
    assert result.returncode != 0, sets
    return result.stderr


def render(values: Path | None = None, *sets: str) -> list[dict]:
    args = ["template", "larder", str(CHART)]
    if values:
        args += ["-f", str(values)]
    for s in sets:
        args += ["--set", s]
    return [d for d in yaml.safe_load_all(helm(*args).stdout) if d]


def by_kind(docs, kind):
    return [d for d in docs if d["kind"] == kind]


@pytest.mark.parametrize("values", VALUES, ids=lambda p: p.stem)
def test_lint_template_and_validate(values, workdir):
    assert len(VALUES) >= 4
    lint = helm("lint", "--strict", str(CHART), "-f", str(values), check=False)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    docs = render(values)
    for d in docs:
        if d["kind"] in CRDS:
            continue
        kubernetes_validate.validate(d, KUBERNETES_VERSION, strict=True)
    (sts,) = by_kind(docs, "StatefulSet")
    pod = sts["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["capabilities"]["drop"] == ["ALL"]
    assert sc["allowPrivilegeEscalation"] is False
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    services = {s["metadata"]["name"]: s for s in by_kind(docs, "Service")}
    assert set(services) == {"larder", "larder-headless", "larder-admin"}
    # The admin port is on its own Service only, never on the one S3 clients use, and its
    # warm-up and fleet routes need the token the chart mounts.
    ports = {name: {p["name"] for p in s["spec"]["ports"]} for name, s in services.items()}
    assert ports["larder"] == {"s3"} and ports["larder-admin"] == {"admin"}
    assert "admin" not in ports["larder-headless"]
    assert "/etc/larder/admin" in {m["mountPath"] for m in container["volumeMounts"]}
    # A NetworkPolicy by default.
    assert by_kind(docs, "NetworkPolicy")
    assert by_kind(docs, "ServiceAccount") and by_kind(docs, "PodDisruptionBudget")
    # The fleet: members from the headless Service's DNS, a peer port on it, the pod's IP as
    # its name, the zone from the pod's topology label, the shared secret mounted.
    (headless,) = [s for s in by_kind(docs, "Service") if s["metadata"]["name"].endswith("-headless")]
    env = {e["name"]: e for e in container["env"]}
    fleet = not values.stem.startswith("tls")
    assert ("peer" in {p["name"] for p in headless["spec"]["ports"]}) == fleet
    assert ("/etc/larder/fleet" in {m["mountPath"] for m in container["volumeMounts"]}) == fleet
    if fleet:
        assert env["LARDER_FLEET_ADVERTISE"]["value"] == "$(POD_IP):9002"
        zone = env["LARDER_FLEET_ZONE"]["valueFrom"]["fieldRef"]["fieldPath"]
        assert zone == "metadata.labels['topology.kubernetes.io/zone']"
    else:
        assert "LARDER_FLEET_ADVERTISE" not in env

    # The configuration the chart renders is one the binary accepts.
    (config,) = [c for c in by_kind(docs, "ConfigMap") if "larder.toml" in c.get("data", {})]
    toml = workdir / f"chart-{values.stem}.toml"
    toml.write_text(config["data"]["larder.toml"])
    check = subprocess.run([binary("larder"), "serve", "--config", str(toml), "--check-config"],
                           capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert check.returncode == 0, check.stderr + config["data"]["larder.toml"]
    dns = 'fleet_peers_dns = "larder-headless.default.svc.cluster.local:9002"'
    assert (dns in check.stdout) == fleet
    assert 'admin_token_file = "/etc/larder/admin/token"' in check.stdout
    # The disk tier is encrypted by default: the key's Secret mounted where the option points,
    # made by the chart (64 hex digits, what the binary accepts) unless one is given.
    assert 'disk_encryption_key_file = "/etc/larder/disk-key/key"' in check.stdout
    assert "/etc/larder/disk-key" in {m["mountPath"] for m in container["volumeMounts"]}
    disk_key = {v["name"]: v for v in pod["volumes"]}["disk-key"]["secret"]["secretName"]
    made = [d for d in by_kind(docs, "Secret") if d["metadata"]["name"] == "larder-disk-key"]
    if values.stem.startswith("persistence"):
        assert disk_key == "larder-disk-key" and not made
    else:
        (made,) = made
        assert re.fullmatch("[0-9a-f]{64}", base64.b64decode(made["data"]["key"]).decode())

    if values.stem.startswith("persistence"):
        # A key's rates reach the configuration as numbers and sizes the binary reads back.
        assert "requests_per_second = 200" in check.stdout
        assert 'bytes_per_second = "50MiB"' in check.stdout
        (claim,) = sts["spec"]["volumeClaimTemplates"]
        assert claim["spec"]["storageClassName"] == "local-nvme"
        assert claim["spec"]["resources"]["requests"]["storage"] == "500Gi"
        sa = by_kind(docs, "ServiceAccount")[0]
        assert sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].startswith("arn:aws:iam::")
        assert not by_kind(docs, "Secret"), "an existing secret is used, none rendered"
        # Events: the token mounted from the Secret given, the queue and the heartbeat set.
        vols = {v["name"]: v for v in pod["volumes"]}
        assert vols["events-token"]["secret"]["secretName"] == "larder-events"
        assert "/etc/larder/events" in {m["mountPath"] for m in container["volumeMounts"]}
        for line in ['events_token_file = "/etc/larder/events/token"',
                     'events_sqs_queue_url = "https://sqs.eu-west-1.amazonaws.com/123456789012/larder-events"',
                     'events_heartbeat = "lake/.larder/heartbeat"']:
            assert line in check.stdout, line
    if values.stem.startswith("tls"):
        vols = {v["name"]: v for v in pod["volumes"]}
        assert vols["tls"]["secret"]["secretName"] == "larder-tls"
        # The upstream's private CA: its Secret mounted where the rendered option points.
        assert vols["upstream-ca"]["secret"]["secretName"] == "storage-ca"
        assert "/etc/larder/upstream-ca" in {m["mountPath"] for m in container["volumeMounts"]}
        assert 'upstream_ca_file = "/etc/larder/upstream-ca/ca.crt"' in check.stdout
        assert vols["cache"]["emptyDir"]["sizeLimit"] == "50Gi"
    if values.stem.startswith("monitoring"):
        (monitor,) = by_kind(docs, "ServiceMonitor")
        assert monitor["spec"]["endpoints"][0]["port"] == "admin"
        (policy,) = by_kind(docs, "NetworkPolicy")
        peer_in = [r for r in policy["spec"]["ingress"] if r["ports"] == [{"port": "peer"}]]
        assert peer_in and "podSelector" in peer_in[0]["from"][0], "replicas reach each other's peer port"
        assert any(r.get("to") and r["ports"][0]["port"] == 9002 for r in policy["spec"]["egress"])
        (rule,) = by_kind(docs, "PrometheusRule")
        rules = workdir / "larder-rules.yaml"
        rules.write_text(yaml.safe_dump(rule["spec"]))
        promtool = shutil.which("promtool")
        assert promtool, "promtool comes with Debian's prometheus package (e2e/setup.sh)"
        out = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True)
        assert out.returncode == 0 and "9 rules found" in out.stdout, out.stdout + out.stderr
        # Five alerts evaluated by promtool on series as Larder exports them. The certificate
        # one fires on requests refused at TLS, and not on other transport faults; the event
        # stream's, once one replica has been without events for 15 minutes, not before; the
        # fleet's, once one replica has seen fewer members than there are replicas for 15
        # minutes, and not while a new replica is being found; the credentials' and the
        # policies', once a file has stayed refused for 5 minutes, not for a moment's
        # half-written file.
        alerts = {r["alert"]: r for r in rule["spec"]["groups"][0]["rules"] if "alert" in r}

        def case(alert, series, quiet_at, fires_at=None):
            """A promtool test: `series` (name to values, every minute); `alert` not firing at
            `quiet_at`, and firing with its labels and annotations at `fires_at`."""
            checks = [{"eval_time": quiet_at, "alertname": alert, "exp_alerts": []}]
            if fires_at:
                fired = {"exp_labels": alerts[alert]["labels"], "exp_annotations": alerts[alert]["annotations"]}
                checks.append({"eval_time": fires_at, "alertname": alert, "exp_alerts": [fired]})
            return {"interval": "1m", "input_series": [{"series": k, "values": v} for k, v in series.items()],
                    "alert_rule_test": checks}

        requests, members = "larder_upstream_requests_total", "larder_fleet_members"
        cases = workdir / "larder-rules-test.yaml"
        cases.write_text(yaml.safe_dump({
            "rule_files": [rules.name], "evaluation_interval": "1m",
            "tests": [
                case("LarderUpstreamTlsRefused", {
                    f'{requests}{{operation="GetObject",status="206"}}': "0+100x30",
                    f'{requests}{{operation="GetObject",status="tls"}}': "0+3x30",
                    f'{requests}{{operation="HeadObject",status="transport"}}': "0+3x30",
                }, quiet_at="3m", fires_at="10m"),
                case("LarderUpstreamTlsRefused", {f'{requests}{{operation="GetObject",status="transport"}}': "0+3x30"},
                     quiet_at="20m"),
                case("LarderEventStreamSilent", {
                    'larder_events_stream_healthy{pod="larder-0"}': "1x40",
                    'larder_events_stream_healthy{pod="larder-1"}': "1x5 0x35",
                }, quiet_at="15m", fires_at="25m"),
                case("LarderEventStreamSilent", {'larder_events_stream_healthy{pod="larder-0"}': "1x40"},
                     quiet_at="30m"),
                case("LarderFleetSplit", {
                    f'{members}{{pod="larder-0"}}': "3x40",
                    f'{members}{{pod="larder-1"}}': "3x40",
                    f'{members}{{pod="larder-2"}}': "3x5 1x35",
                }, quiet_at="15m", fires_at="25m"),
                # A changed credentials file that did not load, for longer than a rewrite takes.
                case("LarderCredentialsRefused", {
                    'larder_auth_credentials_refused{pod="larder-0"}': "0x40",
                    'larder_auth_credentials_refused{pod="larder-1"}': "0x10 1x30",
                }, quiet_at="12m", fires_at="20m"),
                case("LarderCredentialsRefused", {'larder_auth_credentials_refused{pod="larder-0"}': "0x5 1x3 0x32"},
                     quiet_at="8m"),
                case("LarderPoliciesRefused", {
                    'larder_auth_policies_refused{pod="larder-0"}': "0x40",
                    'larder_auth_policies_refused{pod="larder-1"}': "0x10 1x30",
                }, quiet_at="12m", fires_at="20m"),
                case("LarderPoliciesRefused", {'larder_auth_policies_refused{pod="larder-0"}': "0x5 1x3 0x32"},
                     quiet_at="8m"),
                # A third replica found within a minute of its start: no split.
                case("LarderFleetSplit", {
                    f'{members}{{pod="larder-0"}}': "2x10 3x30",
                    f'{members}{{pod="larder-1"}}': "2x10 3x30",
                    f'{members}{{pod="larder-2"}}': "_x10 1 3x29",
                }, quiet_at="35m"),
            ],
        }))
        out = subprocess.run([promtool, "test", "rules", str(cases)], capture_output=True, text=True, cwd=workdir)
        assert out.returncode == 0 and "SUCCESS" in out.stdout, out.stdout + out.stderr


def test_the_fleet_certificate_the_chart_makes_joins_real_replicas_over_tls(make_larder, workdir, direct, bucket):
    # What `helm install` would mount at /etc/larder/fleet-tls, with the options the chart
    # renders: two replicas must find each other over TLS with it, and share a block.
    docs = render(CHART / "ci" / "minimal-values.yaml")
    (secret,) = [s for s in by_kind(docs, "Secret") if s["metadata"]["name"] == "larder-fleet-tls"]
    mounted = workdir / "fleet-tls"
    mounted.mkdir()
    for name, value in secret["data"].items():
        (mounted / name).write_bytes(base64.b64decode(value))
    (config,) = [c for c in by_kind(docs, "ConfigMap") if "larder.toml" in c.get("data", {})]
    options = dict(re.findall(r'^\s*(fleet_tls_\w+) = "([^"]*)"$', config["data"]["larder.toml"], re.M))
    assert set(options) == {"fleet_tls_cert", "fleet_tls_key", "fleet_tls_ca", "fleet_tls_name"}, options
    flags = [a for k, v in options.items()
             for a in (f"--{k.replace('_', '-')}", v.replace("/etc/larder/fleet-tls", str(mounted)))]
    fleet = FleetOf(make_larder, workdir, "chart-tls", "--fleet-refresh", "300ms", *flags)
    fleet.start(2)
    data = random.Random(3).randbytes(8 * 64 * 1024)
    direct.put_object(Bucket=bucket, Key="k", Body=data)
    for node in fleet.nodes:
        assert node.client().get_object(Bucket=bucket, Key="k")["Body"].read() == data
    made = sum(metric(n, "larder_peer_requests_total", direction="made", outcome="ok") for n in fleet.nodes)
    assert made >= 8 and sum(metric(n, "larder_peer_fallbacks_total") for n in fleet.nodes) == 0


def test_a_typo_or_a_missing_secret_fails_at_install():
    assert "replicas" in refused_render("replicas=2")
    assert "disk" in refused_render("disk.type=nvme")
    for bad in ("config.listen=0.0.0.0:1", "fleet.scope=region", "config.fleet_peers_dns=x:1",
                "config.fleet_tls_ca=/x", "fleet.tls.name=", "config.events_token_file=/x",
                "events.sqsQueueUrl=sqs-queue", "config.disk_encryption_previous_key_file=/x"):
        refused_render(bad)
    # Events without a Secret of one's own: one is generated, mounted and named in the config.
    docs = render(CHART / "ci" / "minimal-values.yaml", "events.webhook=true")
    secrets = {d["metadata"]["name"] for d in by_kind(docs, "Secret")}
    assert "larder-events" in secrets
    (config,) = [c for c in by_kind(docs, "ConfigMap") if "larder.toml" in c.get("data", {})]
    assert 'events_token_file = "/etc/larder/events/token"' in config["data"]["larder.toml"]
    no_keys = helm("template", "larder", str(CHART), check=False)
    assert no_keys.returncode != 0 and "auth.existingSecret" in no_keys.stderr
    # A key rotation: the old key read from the same Secret, which must be one's own.
    docs = render(CHART / "ci" / "minimal-values.yaml", "disk.encryption.rotating=true",
                  "disk.encryption.existingSecret=my-disk-keys")
    (config,) = [c for c in by_kind(docs, "ConfigMap") if "larder.toml" in c.get("data", {})]
    assert 'disk_encryption_previous_key_file = "/etc/larder/disk-key/previous"' in config["data"]["larder.toml"]
    assert "larder-disk-key" not in {d["metadata"]["name"] for d in by_kind(docs, "Secret")}
    assert "disk.encryption.existingSecret" in refused_render("disk.encryption.rotating=true")


def test_a_changed_policy_reaches_the_pods_without_rolling_them():
    """Larder reloads `auth_policies` when its configuration file changes, so the chart mounts
    the ConfigMap as a directory (a subPath mount is never updated) and leaves the policies out
    of the checksum that rolls the pods: narrowing a team's access keeps every replica's memory
    tier. Any other setting still rolls them, as it needs a restart to apply."""
    minimal = CHART / "ci" / "minimal-values.yaml"

    def rendered(*sets):
        docs = render(minimal, *sets)
        (sts,) = by_kind(docs, "StatefulSet")
        (config,) = [c for c in by_kind(docs, "ConfigMap") if "larder.toml" in c.get("data", {})]
        pod = sts["spec"]["template"]
        return pod, config["data"]["larder.toml"]

    base, _ = rendered()
    narrowed, toml = rendered("auth.policies[0].access_key=analytics", "auth.policies[0].access=read-only",
                              "auth.policies[0].buckets[0]=lake")
    assert 'access_key = "analytics"' in toml and 'buckets = ["lake"]' in toml
    checksum = lambda pod: pod["metadata"]["annotations"]["checksum/config"]
    assert checksum(narrowed) == checksum(base)
    for setting in ("config.metadata_ttl=5s", "extraConfig=[[disk_partitions]]"):
        assert checksum(rendered(setting)[0]) != checksum(base), setting
    (container,) = [c for c in base["spec"]["containers"] if c["name"] == "larder"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "config"]
    assert "subPath" not in mount
    config_file = container["args"][container["args"].index("--config") + 1]
    assert config_file == mount["mountPath"] + "/larder.toml"


def test_every_value_is_documented_in_the_chart_readme():
    readme = (CHART / "README.md").read_text()
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def leaves(d, prefix=""):
        for k, v in d.items():
            path = f"{prefix}{k}"
            if isinstance(v, dict) and v and k not in ("config", "resources"):
                yield from leaves(v, path + ".")
            else:
                yield path

    missing = [p for p in leaves(values) if f"`{p}`" not in readme]
    assert not missing, f"charts/larder/README.md does not document {missing}"
