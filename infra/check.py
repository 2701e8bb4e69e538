#!/usr/bin/env python3
"""Checks the files in infra/, and boots the node's first-boot script against a loop device.

    python3 infra/check.py            # everything this machine can run
    python3 infra/check.py --static   # no boot test

Static checks: the cloud-init template renders to valid YAML for every placeholder value (a bootstrap with and
without a private root), fits EC2's 16 KB of user data, names each placeholder in its header, carries
infra/systemd/dataplane.service (less comments), and its script passes `bash -n` and shellcheck; the units
pass `systemd-analyze verify`; the IAM policy and the example config parse. Tools that are missing
(shellcheck, cloud-init, systemd-analyze) are reported as skipped.

The boot test (root, `unshare`, `losetup`, e2fsprogs) runs the rendered first-boot.sh in a mount namespace
of its own per simulated instance: private copies of /etc, /usr/local, /var/lib, /run and /dev, the queue's
volume a loop device that appears a few seconds late under its NVMe by-id name, `systemctl` a stub that
records its calls, and the control plane a local HTTPS server with a private root. It checks: a first boot
formats the empty volume, mounts it and installs the binary; a second run changes nothing; a replacement
instance keeps the volume's data; no private root works; a wrong hash or a foreign filesystem stops the
script with nothing touched.
"""

import base64
import hashlib
import http.server
import json
import os
import pwd
import re
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import tomllib

import yaml

INFRA = os.path.dirname(os.path.abspath(__file__))
TEMPLATE = os.path.join(INFRA, "cloud-init", "node.yaml")
DATAPLANE_UNIT = os.path.join(INFRA, "systemd", "dataplane.service")
CONTROLPLANE_UNIT = os.path.join(INFRA, "systemd", "controlplane.service")
POLICY = os.path.join(INFRA, "iam", "controlplane-ec2-policy.json")
EXAMPLE_CONFIG = os.path.join(INFRA, "controlplane.example.toml")
REPLICA_CONFIG = os.path.join(INFRA, "controlplane-replica.example.toml")
SCRIPT_PATH = "/usr/local/lib/queue-expert/first-boot.sh"

# Every placeholder the control plane fills in.
PLACEHOLDERS = {
    "queue_id",
    "control_plane",
    "bootstrap_toml",
    "bootstrap_b64",
    "dataplane_sha256",
    "volume_id",
    "mode",
    "control_plane_ca_b64",
}
# EC2 refuses user data over 16 KB (before base64).
USER_DATA_LIMIT = 16 * 1024
QUEUE_ID = "k3j9x0c2m1ab"
TOKEN = "0f" * 32
INSTANCE_ID = "i-0123456789abcdef0"

failures = []


def check(name, ok, detail=""):
    print(("ok      " if ok else "FAILED  ") + name + (f": {detail}" if detail and not ok else ""))
    if not ok:
        failures.append(name)


def skipped(name, why):
    print(f"skipped {name}: {why}")


def run(*args, **kwargs):
    return subprocess.run(args, capture_output=True, text=True, **kwargs)


def render(template, values):
    """What the control plane does: leave out the comment lines (`#` or `# ...` after any indentation; not
    `#cloud-config` nor `#!`), then replace each placeholder by its value, and nothing else."""
    comment = lambda line: line.strip() == "#" or line.lstrip().startswith("# ")
    template = "\n".join(line for line in template.splitlines() if not comment(line)) + "\n"
    for name, value in values.items():
        template = template.replace("{{" + name + "}}", value)
    return template


def bootstrap(control_plane, ca_pem=None, bootstrap_token="1700000000000." + "ab" * 32):
    text = f'control_plane = "{control_plane}"\nqueue_id = "{QUEUE_ID}"\nbootstrap_token = "{bootstrap_token}"\n'
    if ca_pem:
        text += f'control_plane_ca_pem = """{ca_pem}"""\n'
    return text


def values(control_plane, sha256, volume_id, ca_pem=None, bootstrap_token=None):
    text = bootstrap(control_plane, ca_pem, *([bootstrap_token] if bootstrap_token else []))
    b64 = lambda s: base64.b64encode(s.encode()).decode()
    return {
        "queue_id": QUEUE_ID,
        "control_plane": control_plane,
        "bootstrap_toml": text,
        "bootstrap_b64": b64(text),
        "dataplane_sha256": sha256,
        "volume_id": volume_id,
        "mode": "serve",
        "control_plane_ca_b64": b64(ca_pem) if ca_pem else "",
    }


def unit_without_comments(text):
    """The unit as node.yaml carries it: no comment lines, no runs of blank lines."""
    lines = []
    for line in text.splitlines():
        if line.startswith("#") or (line == "" and (not lines or lines[-1] == "")):
            continue
        lines.append(line)
    while lines and lines[-1] == "":
        lines.pop()
    return "\n".join(lines) + "\n"


def files_of(user_data):
    return {entry["path"]: entry for entry in yaml.safe_load(user_data)["write_files"]}


def script_of(user_data):
    return files_of(user_data)[SCRIPT_PATH]["content"]


def openssl_root(directory, name, key="ec", days=2):
    """A self-signed root: (pem path, key path)."""
    pem, keyfile = os.path.join(directory, f"{name}.pem"), os.path.join(directory, f"{name}.key")
    newkey = ["-newkey", "rsa:4096"] if key == "rsa" else ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]
    subprocess.run(
        ["openssl", "req", "-x509", *newkey, "-nodes", "-keyout", keyfile, "-out", pem, "-days", str(days),
         "-subj", f"/CN={name}", "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign"],
        check=True, capture_output=True)
    return pem, keyfile


# --- Static checks ---------------------------------------------------------------------------------------------


def check_template(work):
    template = open(TEMPLATE).read()
    check("template: starts with #cloud-config", template.startswith("#cloud-config\n"))
    used = set(re.findall(r"\{\{([a-z0-9_]+)\}\}", template))
    check("template: only known placeholders", used <= PLACEHOLDERS, f"unknown: {sorted(used - PLACEHOLDERS)}")
    header = template.split("\n\n", 1)[0]
    check("template: header has no braces (a rendered value there could break the YAML)", "{{" not in header)
    missing = [name for name in sorted(PLACEHOLDERS) if not re.search(rf"^#\s+{name}\s", header, re.M)]
    check("template: header lists every placeholder", not missing, f"missing: {missing}")

    if shutil.which("openssl"):
        big_root = open(openssl_root(work, "size-sample-root", key="rsa")[0]).read()
    else:
        big_root = "-----BEGIN CERTIFICATE-----\n" + ("A" * 64 + "\n") * 29 + "-----END CERTIFICATE-----\n"
    url = "https://cp.eu1.example.com:8443"
    samples = {
        "a private RSA-4096 root": values(url, "ab" * 32, "vol-0123456789abcdef0", big_root),
        "no private root": values(url, "ab" * 32, "vol-0123456789abcdef0"),
    }
    for what, sample in samples.items():
        user_data = render(template, sample)
        check(f"rendered ({what}): no placeholder left", "{{" not in user_data and "}}" not in user_data)
        try:
            config = yaml.safe_load(user_data)
        except yaml.YAMLError as error:
            check(f"rendered ({what}): valid YAML", False, str(error))
            continue
        files = files_of(user_data)
        written = base64.b64decode(files["/etc/queue-expert/bootstrap.toml"]["content"]).decode()
        check(f"rendered ({what}): the bootstrap file arrives whole", written == sample["bootstrap_toml"])
        check(f"rendered ({what}): the bootstrap file is 0600 root",
              files["/etc/queue-expert/bootstrap.toml"].get("permissions") == "0600"
              and files["/etc/queue-expert/bootstrap.toml"].get("owner") == "root:root")
        check(f"rendered ({what}): runcmd runs first-boot.sh only", config["runcmd"] == [[SCRIPT_PATH]])
        size = len(user_data.encode())
        check(f"rendered ({what}): {size} bytes, within EC2's {USER_DATA_LIMIT}", size <= USER_DATA_LIMIT)
        if what.startswith("a private"):
            print(f"        room left for a longer bootstrap file: {USER_DATA_LIMIT - size} bytes of user data")
            rendered_path = os.path.join(work, "rendered.yaml")
            open(rendered_path, "w").write(user_data)
            cloud_init_schema(rendered_path)

    user_data = render(template, samples["no private root"])
    embedded = files_of(user_data)["/etc/systemd/system/dataplane.service"]["content"]
    expected = unit_without_comments(open(DATAPLANE_UNIT).read())
    check("template: carries infra/systemd/dataplane.service without its comments", embedded == expected,
          "run `python3 infra/check.py --print-unit` for the text to paste")

    script = os.path.join(work, "first-boot.sh")
    open(script, "w").write(script_of(user_data))
    result = run("bash", "-n", script)
    check("first-boot.sh: bash -n", result.returncode == 0, result.stderr)
    if shutil.which("shellcheck"):
        result = run("shellcheck", "--shell=bash", script)
        check("first-boot.sh: shellcheck", result.returncode == 0, result.stdout)
    else:
        skipped("first-boot.sh: shellcheck", "not installed (apt-get install shellcheck)")


def cloud_init_schema(path):
    if not shutil.which("cloud-init"):
        skipped("rendered: cloud-init schema", "cloud-init not installed")
        return
    result = run("cloud-init", "schema", "--config-file", path)
    check("rendered: cloud-init schema", result.returncode == 0, result.stdout + result.stderr)


def check_units():
    if not shutil.which("systemd-analyze"):
        skipped("units: systemd-analyze verify", "not installed")
        return
    for unit in (DATAPLANE_UNIT, CONTROLPLANE_UNIT):
        result = run("systemd-analyze", "verify", unit)
        # The binaries are not installed here; anything else is a finding.
        findings = [line for line in (result.stdout + result.stderr).splitlines()
                    if line.strip() and "is not executable: No such file or directory" not in line]
        check(f"{os.path.basename(unit)}: systemd-analyze verify", not findings, "\n".join(findings))
        result = run("systemd-analyze", "security", "--offline=yes", "--threshold=30", unit)
        exposure = re.search(r"Overall exposure level for \S+: ([0-9.]+)", result.stdout)
        check(f"{os.path.basename(unit)}: systemd-analyze security exposure at most 3",
              result.returncode == 0, exposure.group(1) if exposure else result.stdout[-500:])


# What the policy's placeholders are filled with in docs/deploy.md's step 3.
POLICY_PLACEHOLDERS = {"region", "account_id", "cluster", "subnet_id", "standby_subnet_id", "security_group_id"}
EC2_CRATE = os.path.join(os.path.dirname(INFRA), "ec2", "src")


def ec2_actions_called():
    """The EC2 actions the ec2 crate calls (the SDK's `.describe_instances()` is ec2:DescribeInstances)."""
    called = set()
    for name in os.listdir(EC2_CRATE):
        if name.endswith(".rs"):
            text = open(os.path.join(EC2_CRATE, name)).read()
            # An operation is a client's method alone on its line, as rustfmt leaves a chain (accessors such as
            # `volume.create_time()` are not); a waiter (`wait_until_…`) describes, which DescribeVolumes covers.
            verbs = "describe|run|terminate|attach|detach|delete|create|assign|modify|stop|start|reboot"
            for method in re.findall(rf"^\s*\.((?:{verbs})_[a-z0-9_]+)\(\)\s*$", text, re.M):
                called.add("ec2:" + "".join(part.capitalize() for part in method.split("_")))
    return called


def check_policy():
    text = open(POLICY).read()
    placeholders = set(re.findall(r"\{\{([a-z_]+)\}\}", text))
    check("IAM policy: its placeholders are the ones docs/deploy.md fills", placeholders == POLICY_PLACEHOLDERS,
          str(placeholders ^ POLICY_PLACEHOLDERS))
    deploy = open(os.path.join(os.path.dirname(INFRA), "docs", "deploy.md")).read()
    unfilled = [name for name in POLICY_PLACEHOLDERS if "{{" + name + "}}" not in deploy]
    check("IAM policy: docs/deploy.md fills every placeholder", not unfilled, str(unfilled))
    policy = json.loads(text)
    statements = policy["Statement"]
    allowed = set()
    for statement in statements:
        allowed |= set(statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]])
    called = ec2_actions_called()
    check("IAM policy: allows every EC2 action the ec2 crate calls, and no other", allowed - {"ec2:CreateTags"}
          == called, f"not allowed: {sorted(called - allowed)}, not called: {sorted(allowed - called)}")
    check("IAM policy: no DescribeInstanceAttribute (user data is read back with it)",
          "ec2:DescribeInstanceAttribute" not in allowed)
    check("IAM policy: version 2012-10-17", policy["Version"] == "2012-10-17")
    sids = [statement["Sid"] for statement in statements]
    check("IAM policy: unique Sids", len(sids) == len(set(sids)))
    readme = open(os.path.join(INFRA, "README.md")).read()
    unexplained = [sid for sid in sids if f"`{sid}`" not in readme]
    check("IAM policy: every statement explained in infra/README.md", not unexplained, str(unexplained))
    for statement in statements:
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        mutating = [a for a in actions if not a.startswith("ec2:Describe")]
        if mutating:
            resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
            check(f"IAM policy: {statement['Sid']} is limited to this account's and region's resources",
                  all(r.startswith("arn:aws:ec2:{{region}}:") for r in resources))
            tagged = [r for r in resources if re.search(r":(instance|volume|network-interface)/\*$", r)]
            if tagged and "CreateTags" not in str(actions):
                check(f"IAM policy: {statement['Sid']} touches only this cluster's instances and volumes",
                      "{{cluster}}" in json.dumps(statement.get("Condition", {})))


def check_config():
    config = tomllib.load(open(EXAMPLE_CONFIG, "rb"))
    provider = config["provider"]
    check("example config: parses, with an ec2 provider and a region",
          provider["kind"] == "ec2" and {"image_id", "subnet_id", "security_group_ids"}
          <= set(provider["regions"]["eu-west-1"]))
    replica = tomllib.load(open(REPLICA_CONFIG, "rb"))
    check("replica example config: parses, on etcd, three of each, with ACME and not local_ca",
          replica["store"]["kind"] == "etcd" and len(replica["store"]["endpoints"]) == 3
          and len(replica["node_urls"]) == 3 and len(replica["dns_names"]) == 3
          and "acme" in replica and not replica.get("local_ca", False))


# --- The boot test ---------------------------------------------------------------------------------------------


class ControlPlane(http.server.ThreadingHTTPServer):
    """Trades a bootstrap token it issued, once, as instance INSTANCE_ID, for the node token, and serves the
    dataplane binary to the node token only, as the control plane does."""

    def __init__(self, binary, tls=None):
        super().__init__(("127.0.0.1", 0), Handler)
        self.binary = binary
        self.downloads = 0
        self.refused = 0
        self.issued = set()
        self.spent = set()
        self.exchanges = 0
        self.spent_refused = 0
        if tls:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self.socket = context.wrap_socket(self.socket, server_side=True)
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()


class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        token = self.headers.get("Authorization", "").removeprefix("Bearer ")
        right = (self.path == f"/v1/nodes/{QUEUE_ID}/bootstrap" and token in self.server.issued
                 and self.headers.get("Content-Type") == "application/json"
                 and json.loads(body) == {"instance_id": INSTANCE_ID})
        if not right or token in self.server.spent:
            if right:
                self.server.spent_refused += 1
            else:
                self.server.refused += 1
            self.send_error(401)
            return
        self.server.spent.add(token)
        self.server.exchanges += 1
        answer = json.dumps({"node_token": TOKEN}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def do_GET(self):
        right = (self.path == f"/v1/nodes/{QUEUE_ID}/dataplane"
                 and self.headers.get("Authorization") == f"Bearer {TOKEN}")
        if not right:
            self.server.refused += 1
            self.send_error(401)
            return
        self.server.downloads += 1
        body = open(self.server.binary, "rb").read()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class Metadata(http.server.ThreadingHTTPServer):
    """The instance metadata service, IMDSv2: a session token from a PUT, then the instance id with it."""

    def __init__(self):
        super().__init__(("127.0.0.1", 0), MetadataHandler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()


class MetadataHandler(http.server.BaseHTTPRequestHandler):
    SESSION = "imds-session"

    def do_PUT(self):
        if self.path != "/latest/api/token" or not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
            self.send_error(400)
            return
        self.answer(self.SESSION)

    def do_GET(self):
        if self.headers.get("X-aws-ec2-metadata-token") != self.SESSION:
            self.send_error(401)
        elif self.path == "/latest/meta-data/instance-id":
            self.answer(INSTANCE_ID)
        else:
            self.send_error(404)

    def answer(self, text):
        self.send_response(200)
        self.send_header("Content-Length", str(len(text)))
        self.end_headers()
        self.wfile.write(text.encode())

    def log_message(self, *args):
        pass


def boot_test(work):
    needed = ["unshare", "losetup", "mkfs.ext4", "mkfs.ext2", "blkid", "openssl", "useradd", "curl"]
    missing = [tool for tool in needed if not shutil.which(tool)]
    if os.geteuid() != 0 or missing:
        skipped("boot test", "needs root" if os.geteuid() != 0 else f"missing {missing}")
        return
    if run("unshare", "--mount", "true").returncode != 0:
        skipped("boot test", "cannot make a mount namespace here")
        return

    root_pem, root_key = openssl_root(work, "check-root")
    server_key, server_csr, server_pem = (os.path.join(work, f) for f in ("server.key", "server.csr", "server.pem"))
    open(os.path.join(work, "san.cnf"), "w").write("subjectAltName=IP:127.0.0.1\n")
    subprocess.run(["openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", server_key, "-out", server_csr, "-subj", "/CN=127.0.0.1"], check=True, capture_output=True)
    subprocess.run(["openssl", "x509", "-req", "-in", server_csr, "-CA", root_pem, "-CAkey", root_key,
                    "-CAcreateserial", "-out", server_pem, "-days", "2", "-extfile", os.path.join(work, "san.cnf")],
                   check=True, capture_output=True)
    # The "dataplane": any executable of this machine's architecture passes the script's ELF check.
    binary = os.path.join(work, "dataplane")
    shutil.copy("/bin/true", binary)
    sha = hashlib.sha256(open(binary, "rb").read()).hexdigest()
    https = ControlPlane(binary, tls=(server_pem, server_key))
    plain = ControlPlane(binary)
    metadata = Metadata()
    ca_pem = open(root_pem).read()

    volume_file = os.path.join(work, "volume.img")
    with open(volume_file, "wb") as f:
        f.truncate(64 << 20)
    device = run("losetup", "--find", "--show", volume_file).stdout.strip()
    volume_id = "vol-0c0ffee0123456789"
    template = open(TEMPLATE).read()

    def boot(case, control_plane, ca=None, sha256=sha, runs=1, delay=0.0, volume_wait=None):
        """One instance's boot; `delay` None: the volume never appears."""
        case_dir = os.path.join(work, case)
        os.makedirs(case_dir)
        # A bootstrap token of its own, which the control plane at `control_plane` issued.
        bootstrap_token = f"1700000000000.{hashlib.sha256(case.encode()).hexdigest()}"
        for server in (https, plain):
            if server.url == control_plane:
                server.issued.add(bootstrap_token)
        user_data = render(template, values(control_plane, sha256, volume_id, ca, bootstrap_token))
        # IMDS is at a link-local address on EC2; here, a local server.
        imds = "IMDS=http://169.254.169.254"
        assert imds in user_data
        user_data = user_data.replace(imds, f"IMDS={metadata.url}")
        if volume_wait is not None:
            user_data = user_data.replace("VOLUME_WAIT_SECS=600", f"VOLUME_WAIT_SECS={volume_wait}")
        open(os.path.join(case_dir, "user-data.yaml"), "w").write(user_data)
        args = json.dumps({"dir": case_dir, "device": device, "volume_id": volume_id, "runs": runs, "delay": delay})
        result = run("unshare", "--mount", "--propagation", "private", sys.executable, __file__, "--inside", args,
                     timeout=600)
        if result.returncode != 0:
            print(result.stdout, result.stderr)
            raise SystemExit(f"the boot test's namespace failed in case {case}")
        return json.load(open(os.path.join(case_dir, "facts.json")))

    def volume():
        return {key: run("blkid", "-p", "-s", key, "-o", "value", device).stdout.strip() for key in ("TYPE", "LABEL", "UUID")}

    try:
        first = boot("first", https.url, ca=ca_pem, runs=2, delay=3.0)
        runs = first["runs"]
        formatted = volume()
        check("first boot: the script succeeds, and again when run a second time",
              [r["code"] for r in runs] == [0, 0], runs[-1]["output"])
        check("first boot: it finds the volume, 3 s late, by its NVMe by-id name", "is /dev/loop" in runs[0]["output"])
        check("first boot: the empty volume is made ext4, label qe-data",
              formatted["TYPE"] == "ext4" and formatted["LABEL"] == "qe-data", str(formatted))
        check("first boot: fstab mounts it by UUID, nofail",
              first["fstab"] == [f"UUID={formatted['UUID']} /var/lib/queue-expert ext4 defaults,noatime,nofail 0 2"],
              str(first["fstab"]))
        check("first boot: mounted at /var/lib/queue-expert", first["mounted"] == device, str(first["mounted"]))
        check("first boot: the binary is installed, 0755, with the rendered hash",
              first["binary"] == {"sha256": sha, "mode": "0o755", "owner": "root"}, str(first["binary"]))
        check("first boot: the bootstrap file is the node user's, 0600",
              first["bootstrap"] == {"mode": "0o600", "owner": "queue-expert"}, str(first["bootstrap"]))
        check("first boot: the bootstrap token is traded, as the instance, for the node token",
              https.exchanges == 1 and "exchanged the bootstrap token" in runs[0]["output"], runs[0]["output"])
        check("first boot: the node token is kept on the volume, the node user's, 0600",
              first["node_token"] == {"mode": "0o600", "owner": "queue-expert", "text": TOKEN}, str(first["node_token"]))
        check("second run: its spent bootstrap token is refused, and it goes on with the node token on the volume",
              https.spent_refused == 1 and "was refused" in runs[1]["output"], runs[1]["output"])
        check("first boot: the private root is written for curl", first["ca"] == {"mode": "0o644", "owner": "root"},
              str(first["ca"]))
        check("first boot: the unit is enabled and started",
              "enable --now dataplane.service" in first["systemctl"], str(first["systemctl"]))
        check("second run: no second format, no second download, the data stays",
              "formatting" not in runs[1]["output"] and https.downloads == 1 and first["marker"],
              f"downloads={https.downloads} {runs[1]['output']}")
        check("first boot: no temporary file left beside the binary", first["usr_local_bin"] == ["dataplane"],
              str(first["usr_local_bin"]))

        replacement = boot("replacement", https.url, ca=ca_pem)
        check("replacement instance: succeeds, downloads, keeps the volume and its data",
              replacement["runs"][0]["code"] == 0 and https.downloads == 2 and replacement["marker"]
              and volume()["UUID"] == formatted["UUID"] and "formatting" not in replacement["runs"][0]["output"],
              replacement["runs"][0]["output"])

        no_root = boot("no-root", plain.url)
        check("no private root: succeeds, and no root file is left",
              no_root["runs"][0]["code"] == 0 and no_root["ca"] is None and plain.downloads == 1,
              no_root["runs"][0]["output"])
        check("the control plane never saw a wrong path or token", https.refused == 0 and plain.refused == 0)
        check("each instance traded its own bootstrap token once",
              https.exchanges == 2 and plain.exchanges == 1 and https.spent_refused == 1)

        bad = boot("wrong-hash", https.url, ca=ca_pem, sha256="00" * 32)
        check("wrong hash: the script stops, installs nothing, leaves no temporary file",
              bad["runs"][0]["code"] != 0 and "SHA-256" in bad["runs"][0]["output"] and bad["binary"] is None
              and bad["usr_local_bin"] == [], bad["runs"][0]["output"])

        absent = boot("no-volume", https.url, ca=ca_pem, delay=None, volume_wait=3)
        check("a volume that never appears: the script gives up after its wait, the node not started",
              absent["runs"][0]["code"] != 0 and "did not appear within 3 s" in absent["runs"][0]["output"]
              and absent["systemctl"] == [] and absent["fstab"] == [], absent["runs"][0]["output"])

        run("mkfs.ext2", "-q", "-F", device)
        foreign_uuid = volume()["UUID"]
        foreign = boot("foreign", https.url, ca=ca_pem)
        check("a volume holding another filesystem: the script stops and leaves it as it was",
              foreign["runs"][0]["code"] != 0 and "not ext4" in foreign["runs"][0]["output"]
              and volume() == {"TYPE": "ext2", "LABEL": "", "UUID": foreign_uuid} and foreign["fstab"] == [],
              foreign["runs"][0]["output"])
    finally:
        https.shutdown()
        plain.shutdown()
        metadata.shutdown()
        run("losetup", "--detach", device)


def inside(args):
    """Runs in a fresh mount namespace: one instance's boot, then its facts into facts.json."""
    case_dir, device = args["dir"], args["device"]
    sh = lambda *command: subprocess.run(command, check=True, capture_output=True)
    # Private copies of what the script changes; the real ones are untouched.
    sh("mount", "--make-rprivate", "/")
    sh("cp", "-a", "/etc", os.path.join(case_dir, "etc"))
    sh("mount", "--bind", os.path.join(case_dir, "etc"), "/etc")
    for path in ("/usr/local", "/var/lib", "/run"):
        sh("mount", "-t", "tmpfs", "tmpfs", path)
    # A /dev with only what the script needs, so that the volume is the one block device it can find.
    loop = os.stat(device)
    sh("mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", "/dev")
    for name, major, minor in (("null", 1, 3), ("zero", 1, 5), ("random", 1, 8), ("urandom", 1, 9)):
        os.mknod(f"/dev/{name}", 0o666 | 0o020000, os.makedev(major, minor))
    os.mknod(device, 0o600 | 0o060000, loop.st_rdev)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"/dev/{name}")
    os.makedirs("/dev/disk/by-id")
    link = f"/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_{args['volume_id'].replace('-', '', 1)}"
    if args["delay"]:
        threading.Timer(args["delay"], os.symlink, (device, link)).start()
    elif args["delay"] is not None:
        os.symlink(device, link)
    # systemd does not run here: a stub records what the script asks of it.
    stubs = os.path.join(case_dir, "bin")
    os.makedirs(stubs)
    calls = os.path.join(case_dir, "systemctl.log")
    for name, body in (("systemctl", f'echo "$*" >> {calls}\n'), ("udevadm", "")):
        with open(os.path.join(stubs, name), "w") as f:
            f.write(f"#!/bin/sh\n{body}exit 0\n")
        os.chmod(os.path.join(stubs, name), 0o755)
    environment = {"PATH": f"{stubs}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}

    # cloud-init's write_files, for this template's entries.
    user_data = yaml.safe_load(open(os.path.join(case_dir, "user-data.yaml")))
    for entry in user_data["write_files"]:
        os.makedirs(os.path.dirname(entry["path"]), exist_ok=True)
        content = entry["content"]
        data = base64.b64decode(content) if entry.get("encoding") == "b64" else content.encode()
        with open(entry["path"], "wb") as f:
            f.write(data)
        os.chmod(entry["path"], int(entry["permissions"], 8))
        shutil.chown(entry["path"], *entry["owner"].split(":"))

    runs = []
    for number in range(args["runs"]):
        result = subprocess.run(user_data["runcmd"][0], env=environment, capture_output=True, text=True, timeout=300)
        runs.append({"code": result.returncode, "output": result.stdout + result.stderr})
        if number == 0 and result.returncode == 0:
            # The queue's messages, as far as this test is concerned.
            open("/var/lib/queue-expert/marker", "w").write("messages")

    def describe(path):
        if not os.path.exists(path):
            return None
        info = os.stat(path)
        return {"mode": oct(info.st_mode & 0o7777), "owner": pwd.getpwuid(info.st_uid).pw_name}

    binary = describe("/usr/local/bin/dataplane")
    if binary:
        binary["sha256"] = hashlib.sha256(open("/usr/local/bin/dataplane", "rb").read()).hexdigest()
    mounted = run("findmnt", "-n", "-o", "SOURCE", "--mountpoint", "/var/lib/queue-expert").stdout.strip()
    facts = {
        "runs": runs,
        "fstab": [line for line in open("/etc/fstab").read().splitlines() if "/var/lib/queue-expert" in line],
        "mounted": mounted,
        "marker": os.path.exists("/var/lib/queue-expert/marker"),
        "binary": binary,
        "bootstrap": describe("/etc/queue-expert/bootstrap.toml"),
        "node_token": describe("/var/lib/queue-expert/node-token"),
        "ca": describe("/etc/queue-expert/control-plane-ca.pem"),
        "systemctl": open(calls).read().splitlines() if os.path.exists(calls) else [],
        "usr_local_bin": sorted(os.listdir("/usr/local/bin")) if os.path.isdir("/usr/local/bin") else [],
    }
    if facts["node_token"]:
        facts["node_token"]["text"] = open("/var/lib/queue-expert/node-token").read()
    if mounted:
        run("umount", "/var/lib/queue-expert")
    json.dump(facts, open(os.path.join(case_dir, "facts.json"), "w"), indent=1)


def main():
    if sys.argv[1:2] == ["--inside"]:
        inside(json.loads(sys.argv[2]))
        return
    if sys.argv[1:2] == ["--print-unit"]:
        print(unit_without_comments(open(DATAPLANE_UNIT).read()), end="")
        return
    with tempfile.TemporaryDirectory(prefix="qe-infra-check.") as work:
        check_template(work)
        check_units()
        check_policy()
        check_config()
        if "--static" not in sys.argv:
            boot_test(work)
    print(f"\n{len(failures)} failed" if failures else "\nall passed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
