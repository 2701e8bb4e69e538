#!/usr/bin/env python3
"""Boots one queue's "EC2 instance" for real on this machine, from the user data EC2 (moto) was given.

    boot.py --name NAME --user-data FILE --volume-file FILE --volume-id vol-XXXX
            --v6 ADDR/PREFIX [--v4 ADDR/PREFIX] --host-v6 ADDR [--host-v4 ADDR]
            --state DIR [--instance-id i-XXXX] [--add-host HOST=ADDR]... [--stop-timeout 15] [--boot-timeout 900]
            [--volume-wait 60] [--peer NAME=ADDR]...
    boot.py --cleanup --name NAME --state DIR      # "kill the instance": SIGKILL all of it, then tear down
    boot.py --selftest                              # boots a fake instance against a local HTTPS server

Python 3.11, stdlib only; run as root. Needs iproute2, util-linux (unshare, losetup, mount, setpriv), and what
the first-boot script itself runs: curl, e2fsprogs (blkid, mkfs.ext4), passwd (useradd), coreutils, python3.

The instance is
  * a network namespace qe-NAME, joined to the host by a veth pair (qeh-NAME on the host, qei-NAME inside). The
    inside end has --v6 (and --v4), the host end --host-v6 (and --host-v4) with the same prefix length but no
    prefix route: the host reaches the instance by a route to its address alone, so that several instances may
    share one host address and prefix. Inside: lo, default routes via the host addresses. No link-local
    addresses (addrgenmode none), no DAD (nodad), no forwarding or NAT: nothing the instance sends leaves the
    machine (IPv4 forwarding is also turned off on the host end; a host that forwards IPv6 gets a warning). With
    --peer NAME=ADDR, it and instance NAME (booted before it, at IPv6 address ADDR) reach each other directly;
  * its EBS volume: --volume-file on a loop device, which appears in the instance's private /dev as
    /dev/loopN and /dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_<volume id without its dash>. A volume is
    attached to one instance at a time: a boot waits (--volume-wait) while another loop device still holds it;
  * a mount (and UTS) namespace entered inside the netns, in which every file system of the host is read-only
    and the instance has its own: /etc (a copy of the host's, in STATE/root/etc), /usr/local
    (STATE/root/usr-local), /var/lib (STATE/root/var-lib), and tmpfs on /run, /tmp, /var/tmp, /var/log, /dev.
    Nothing on the host's file systems changes;
  * with --instance-id, EC2's instance metadata service (IMDSv2, as far as a first boot asks: a session token from
    `PUT /latest/api/token`, then `GET /latest/meta-data/instance-id` with it) at 169.254.169.254:80 on the
    instance's lo, served by its init process; without it, no metadata service;
  * cloud-init's work: the user data's write_files, then its runcmd (as the shell script cloud-init makes of
    it), with a `systemctl` stub first on PATH. `enable --now UNIT` starts the unit's ExecStart= as its User=
    and Group= (setpriv, with its AmbientCapabilities=, CapabilityBoundingSet=, NoNewPrivileges=, UMask=,
    LimitNOFILE=, StateDirectory=), output appended to STATE/node.log, pid in STATE/node.pid.

Prints on stdout, one line each, flushed:
  booted pid=PID                  the dataplane runs (PID as seen from the host)
  exited status=N                 it exited on its own (N: its exit code, 128+signal if killed by one); boot.py
                                  tears the instance down and exits N
  stopped status=N                after SIGTERM/SIGINT to boot.py ("terminate the instance"): the dataplane got
                                  SIGTERM, up to --stop-timeout s, then SIGKILL; N is its status (0: a clean
                                  stop; 143: killed by the SIGTERM, as a node that has no config yet is), "none"
                                  if the first boot was still running (it is killed), "killed"/"unknown" if its
                                  end was not seen. The instance is torn down; boot.py exits 0 (1 if something
                                  could not be torn down)
  first-boot failed status=N      the user data's runcmd failed (N its status, or "timeout" after
                                  --boot-timeout) or started no dataplane; boot.py tears down and exits 3
Setup errors (bad arguments, a volume still held after --volume-wait, ...): a message on stderr, exit 2.
SIGHUP to boot.py is passed to the dataplane (`systemctl reload`). Everything else goes to stderr, the first
boot's output (cloud-init-output.log) too, prefixed "[NAME first-boot]", and to STATE/first-boot.log.

"Killing the instance" (abruptly, no clean stop) is `boot.py --cleanup --name NAME --state STATE`: it SIGKILLs
the boot.py of that instance (if it still runs) and every process in the netns, then deletes the veth and netns
and detaches the loop device. Idempotent; exits 0 when nothing is left. Use it too after a SIGKILL of boot.py
(which cannot clean up). A boot with a STATE whose boot.py died without tearing down cleans up first.

STATE keeps: instance.json (what is set up, while it is; --cleanup reads it), user-data.json, root/ (the
instance's own files: root/usr-local/bin/dataplane, root/etc/...), node.log, node.pid, first-boot.log,
systemctl.log. A boot with the same STATE starts from a fresh root/ (a new instance); logs are appended.
"""

import argparse
import base64
import ctypes
import fcntl
import gzip
import hashlib
import http.server
import ipaddress
import json
import os
import pwd
import grp
import re
import resource
import select
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SELF = os.path.abspath(__file__)
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Instance names go into interface names (15 bytes at most): "qeh-" + NAME.
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,10}$")
# Tools the harness itself runs on the host, and those the first-boot script runs inside.
HOST_TOOLS = ["ip", "unshare", "losetup", "mount", "umount", "setpriv", "cp"]
INSTANCE_TOOLS = ["curl", "blkid", "mkfs.ext4", "useradd", "getent", "findmnt", "mountpoint", "sha256sum", "od",
                  "awk", "mktemp", "python3"]
EXIT_SETUP, EXIT_FIRST_BOOT = 2, 3


def log(message):
    print(f"boot.py: {message}", file=sys.stderr, flush=True)


def say(line):
    """One line of the protocol on stdout."""
    print(line, flush=True)


def run(*args, check=True, quiet=False, timeout=60, **kwargs):
    result = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout, **kwargs)
    if check and result.returncode != 0:
        raise Failure(f"{shlex.join(str(a) for a in args)}: exit {result.returncode}: "
                      f"{(result.stderr or result.stdout).strip()}")
    if not quiet and result.returncode != 0:
        log(f"{shlex.join(str(a) for a in args)}: exit {result.returncode}: {result.stderr.strip()}")
    return result


class Failure(Exception):
    pass


def write_json(path, data):
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def status_of(wait_status):
    """A wait status as a shell would say it: the exit code, or 128 + the signal."""
    if os.WIFSIGNALED(wait_status):
        return 128 + os.WTERMSIG(wait_status)
    return os.WEXITSTATUS(wait_status)


def start_time(pid):
    """The process's start time (to tell it from a later process with the same pid), None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


def alive(pid, start):
    """The process pid, started at start, still runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return fields[0] != "Z" and fields[19] == start


def parent_of(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return None


# --- The user data: a small YAML reader for cloud-config ------------------------------------------------------
#
# Enough YAML for cloud-config files like infra/cloud-init/node.yaml: block mappings and sequences (a sequence may
# sit at its key's indentation, a sequence item may open a mapping), literal block scalars (| |- |+, with an
# indentation digit), single- and double-quoted scalars on one line, one-line flow sequences, and plain scalars
# (null, booleans and integers resolved as YAML 1.1 does, the rest strings). Anything else is refused by name,
# so that a template using more fails here loudly rather than booting differently. The self-test checks it
# against PyYAML when that is installed.


class YamlError(Exception):
    pass


class MiniYaml:
    def __init__(self, text):
        if "\t" in "".join(line[: len(line) - len(line.lstrip())] for line in text.splitlines()):
            raise YamlError("tabs in indentation")
        self.lines = text.splitlines()
        self.i = 0

    def parse(self):
        self.skip()
        if self.i < len(self.lines) and self.lines[self.i].strip() == "---":
            self.i += 1
        value = self.block(0)
        self.skip()
        if self.i < len(self.lines):
            raise YamlError(f"line {self.i + 1}: unexpected {self.lines[self.i].strip()!r}")
        return value

    def skip(self):
        while self.i < len(self.lines):
            text = self.lines[self.i].strip()
            if text and not text.startswith("#"):
                return
            self.i += 1

    def peek(self):
        self.skip()
        if self.i >= len(self.lines):
            return None
        line = self.lines[self.i]
        indent = len(line) - len(line.lstrip(" "))
        return indent, line[indent:].rstrip()

    @staticmethod
    def is_item(text):
        return text == "-" or text.startswith("- ")

    def block(self, min_indent):
        here = self.peek()
        if here is None or here[0] < min_indent:
            return None
        indent, text = here
        return self.sequence(indent) if self.is_item(text) else self.mapping(indent)

    def sequence(self, indent):
        items = []
        while True:
            here = self.peek()
            if here is None or here[0] < indent or (here[0] == indent and not self.is_item(here[1])):
                return items
            if here[0] > indent:
                raise YamlError(f"line {self.i + 1}: bad indentation in a sequence")
            rest = here[1][1:].lstrip(" ")
            column = indent + len(here[1]) - len(rest)
            if rest == "" or rest.startswith("#"):
                self.i += 1
                items.append(self.block(indent + 1))
            elif self.is_item(rest) or self.key_of(rest) is not None:
                # "- key: value" opens a mapping (or "- - x" a sequence) at the column of what follows the dash.
                self.lines[self.i] = " " * column + rest
                items.append(self.block(column))
            elif rest[0] in "|>":
                self.i += 1
                items.append(self.block_scalar(rest, indent))
            else:
                self.i += 1
                items.append(self.scalar(rest))

    def key_of(self, text):
        """(key, rest) if the text is a mapping entry, else None."""
        if text[0] in "\"'":
            value, end = self.quoted(text)
            rest = text[end:]
            if rest.startswith(":") and (len(rest) == 1 or rest[1] == " "):
                return value, rest[1:].strip()
            return None
        if text[0] in "[{":
            return None
        match = re.search(r":( |$)", text)
        if not match or " #" in text[: match.start()]:
            return None
        return text[: match.start()].strip(), text[match.end():].strip()

    def mapping(self, indent):
        result = {}
        while True:
            here = self.peek()
            if here is None or here[0] < indent:
                return result
            if here[0] > indent:
                raise YamlError(f"line {self.i + 1}: bad indentation in a mapping")
            if self.is_item(here[1]):
                return result
            entry = self.key_of(here[1])
            if entry is None:
                raise YamlError(f"line {self.i + 1}: not a mapping entry: {here[1]!r}")
            key, rest = entry
            if key in result:
                raise YamlError(f"line {self.i + 1}: duplicate key {key!r}")
            self.i += 1
            if rest == "" or rest.startswith("#"):
                after = self.peek()
                if after and (after[0] > indent or (after[0] == indent and self.is_item(after[1]))):
                    result[key] = self.block(indent if after[0] == indent else indent + 1)
                else:
                    result[key] = None
            elif rest[0] in "|>":
                result[key] = self.block_scalar(rest, indent)
            else:
                result[key] = self.scalar(rest)

    def block_scalar(self, header, parent_indent):
        indicators = header.split(" #")[0].strip()
        if indicators[0] == ">":
            raise YamlError(f"line {self.i}: folded scalars (>) are not supported here")
        chomp, explicit = "clip", None
        for ch in indicators[1:]:
            if ch == "-":
                chomp = "strip"
            elif ch == "+":
                chomp = "keep"
            elif ch.isdigit():
                explicit = int(ch)
            else:
                raise YamlError(f"line {self.i}: bad block scalar header {header!r}")
        j = self.i
        while j < len(self.lines) and not self.lines[j].strip():
            j += 1
        if explicit is not None:
            indent = parent_indent + explicit
        elif j < len(self.lines):
            indent = len(self.lines[j]) - len(self.lines[j].lstrip(" "))
        else:
            indent = parent_indent + 1
        content = []
        if indent > parent_indent:
            while self.i < len(self.lines):
                line = self.lines[self.i]
                if not line.strip():
                    content.append(line[indent:] if len(line) > indent else "")
                elif len(line) - len(line.lstrip(" ")) >= indent:
                    content.append(line[indent:])
                else:
                    break
                self.i += 1
        if chomp == "keep":
            return "".join(line + "\n" for line in content)
        while content and not content[-1].strip():
            content.pop()
        text = "\n".join(content)
        return text + "\n" if chomp == "clip" and content else text

    def quoted(self, text):
        """A quoted scalar at the start of text: (value, index after its closing quote)."""
        quote = text[0]
        out = []
        i = 1
        escapes = {"0": "\0", "a": "\a", "b": "\b", "t": "\t", "\t": "\t", "n": "\n", "v": "\v", "f": "\f",
                   "r": "\r", "e": "\x1b", " ": " ", '"': '"', "/": "/", "\\": "\\", "N": "\x85", "_": "\xa0"}
        while i < len(text):
            ch = text[i]
            if quote == "'" and ch == "'":
                if text[i + 1: i + 2] == "'":
                    out.append("'")
                    i += 2
                    continue
                return "".join(out), i + 1
            if quote == '"' and ch == '"':
                return "".join(out), i + 1
            if quote == '"' and ch == "\\":
                code = text[i + 1: i + 2]
                if code in escapes:
                    out.append(escapes[code])
                    i += 2
                    continue
                width = {"x": 2, "u": 4, "U": 8}.get(code)
                if width is None:
                    raise YamlError(f"line {self.i}: bad escape \\{code}")
                out.append(chr(int(text[i + 2: i + 2 + width], 16)))
                i += 2 + width
                continue
            out.append(ch)
            i += 1
        raise YamlError(f"line {self.i}: a quoted scalar over several lines is not supported here")

    def scalar(self, text):
        text = text.strip()
        if text[0] in "\"'":
            value, end = self.quoted(text)
            rest = text[end:].strip()
            if rest and not rest.startswith("#"):
                raise YamlError(f"line {self.i}: text after a quoted scalar: {rest!r}")
            return value
        if text[0] == "[":
            return self.flow_sequence(text)
        if text[0] in "{&*!%@`":
            raise YamlError(f"line {self.i}: {text[0]!r} (flow mappings, anchors, tags) is not supported here")
        return self.plain(re.split(r"\s+#", text, maxsplit=1)[0].strip())

    @staticmethod
    def plain(text):
        if text in ("", "~", "null", "Null", "NULL"):
            return None
        if text in ("true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON"):
            return True
        if text in ("false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF"):
            return False
        if re.fullmatch(r"[-+]?(0|[1-9][0-9_]*)", text):
            return int(text.replace("_", ""))
        if re.fullmatch(r"[-+]?0[0-7_]+", text):
            return int(text.replace("_", ""), 8)
        return text

    def flow_sequence(self, text):
        items, i = [], 1
        while True:
            while i < len(text) and text[i] == " ":
                i += 1
            if i >= len(text):
                raise YamlError(f"line {self.i}: a flow sequence over several lines is not supported here")
            if text[i] == "]":
                rest = text[i + 1:].strip()
                if rest and not rest.startswith("#"):
                    raise YamlError(f"line {self.i}: text after a flow sequence: {rest!r}")
                return items
            if text[i] in "\"'":
                value, end = self.quoted(text[i:])
                items.append(value)
                i += end
            elif text[i] in "[{":
                raise YamlError(f"line {self.i}: nested flow collections are not supported here")
            else:
                match = re.match(r"[^,\]]*", text[i:])
                items.append(self.plain(match.group(0).strip()))
                i += match.end()
            while i < len(text) and text[i] == " ":
                i += 1
            if i < len(text) and text[i] == ",":
                i += 1


def read_user_data(path):
    """The cloud-config of a user data file: plain, or base64 of it (as EC2's API hands it out)."""
    raw = open(path, "rb").read()
    if not raw.lstrip().startswith(b"#"):
        try:
            raw = base64.b64decode(raw, validate=False)
        except ValueError:
            pass
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    text = raw.decode()
    if not text.startswith("#cloud-config"):
        raise Failure(f"{path}: not a #cloud-config file (MIME multi-part and scripts are not supported)")
    if "{{" in text:
        log(f"warning: {path} still holds a placeholder: {text[text.index('{{'):][:40]!r}")
    try:
        config = MiniYaml(text).parse()
    except YamlError as error:
        raise Failure(f"{path}: {error}")
    if not isinstance(config, dict):
        raise Failure(f"{path}: the cloud-config is not a mapping")
    known = {"write_files", "runcmd", "package_update", "package_upgrade", "package_reboot_if_required"}
    for key in sorted(set(config) - known):
        log(f"warning: the user data's {key!r} is not simulated by boot.py")
    if config.get("package_update") or config.get("package_upgrade") or config.get("packages"):
        log("warning: packages are not installed by boot.py (the instance would need a package mirror)")
    files = []
    for entry in config.get("write_files") or []:
        encoding = (entry.get("encoding") or "text/plain").lower()
        content = entry.get("content") or ""
        if isinstance(content, str):
            content = content.encode()
        if encoding in ("b64", "base64"):
            content = base64.b64decode(content)
        elif encoding in ("gz+b64", "gzip+b64", "gz+base64", "gzip+base64"):
            content = gzip.decompress(base64.b64decode(content))
        elif encoding in ("gz", "gzip"):
            content = gzip.decompress(content)
        elif encoding != "text/plain":
            raise Failure(f"write_files {entry['path']}: encoding {encoding!r} is not supported")
        permissions = entry.get("permissions", 0o644)
        if isinstance(permissions, str):
            permissions = int(permissions, 8)
        files.append({"path": entry["path"], "owner": entry.get("owner") or "root:root",
                      "permissions": permissions, "append": bool(entry.get("append")),
                      "content_b64": base64.b64encode(content).decode()})
    # What cloud-init's runcmd module makes of the list (cloudinit.util.shellify).
    script = "#!/bin/sh\n"
    for command in config.get("runcmd") or []:
        if isinstance(command, list):
            script += " ".join("'%s'" % str(arg).replace("'", "'\\''") for arg in command) + "\n"
        elif isinstance(command, str):
            script += command + "\n"
        else:
            raise Failure(f"runcmd: cannot run {command!r}")
    return {"write_files": files, "runcmd": script}


# --- Host side: the instance's network, volume and namespaces ---------------------------------------------------


def netns_path(name):
    return f"/run/netns/qe-{name}"


def link_exists(link):
    return os.path.exists(f"/sys/class/net/{link}")


def pids_in_netns(ino):
    """Every process whose network namespace is the instance's (found by the namespace's inode, so that a
    namespace whose name is gone is still found)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}/ns/net").st_ino == ino:
                pids.append(int(entry))
        except OSError:
            pass
    return pids


def loops_of(volume):
    """The loop devices backed by the volume file (by device and inode)."""
    listing = json.loads(run("losetup", "--list", "--json", "-O", "NAME,BACK-INO,BACK-MAJ:MIN").stdout or "{}")
    want_dev = f"{volume['major']}:{volume['minor']}"
    return [device["name"] for device in listing.get("loopdevices", [])
            if str(device.get("back-ino")).strip() == str(volume["ino"])
            and str(device.get("back-maj:min")).replace(" ", "") == want_dev]


def wait_until(condition, seconds, every=0.1):
    deadline = time.monotonic() + seconds
    while True:
        if condition():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(every)


def addresses(args):
    """The instance's addresses, checked: [(family, inside interface, host address)]."""
    pairs = [("6", args.v6, args.host_v6)]
    if args.v4 or args.host_v4:
        if not (args.v4 and args.host_v4):
            raise Failure("--v4 and --host-v4 go together")
        pairs.append(("4", args.v4, args.host_v4))
    checked = []
    for family, inside, host in pairs:
        try:
            interface = ipaddress.ip_interface(inside)
            host_address = ipaddress.ip_address(host.split("/")[0])
        except ValueError as error:
            raise Failure(str(error))
        if str(interface.version) != family or host_address.version != interface.version:
            raise Failure(f"--v{family} and --host-v{family} must be IPv{family} addresses")
        if "/" not in inside:
            raise Failure(f"--v{family} needs a prefix length: {inside}")
        if host_address not in interface.network or host_address == interface.ip:
            raise Failure(f"--host-v{family} {host_address} must be another address of {interface.network}")
        checked.append((family, interface, host_address))
    return checked


def link_in(netns, link):
    """The netns (by name) has the interface."""
    return (os.path.exists(f"/run/netns/{netns}")
            and run("ip", "-n", netns, "link", "show", "dev", link, check=False, quiet=True).returncode == 0)


def peers_of(args):
    """--peer NAME=ADDR, checked before anything is set up: [(name, IPv6 address)] of instances that run."""
    peers = []
    for entry in args.peer:
        peer, _, address = entry.partition("=")
        if not NAME_RE.match(peer) or peer == args.name or peer in (p for p, _ in peers):
            raise Failure(f"--peer {entry!r}: NAME must be another instance's name, once")
        try:
            address = ipaddress.IPv6Address(address)
        except ValueError:
            raise Failure(f"--peer {entry!r}: ADDR must be an IPv6 address (without a prefix length)")
        if not os.path.exists(netns_path(peer)):
            raise Failure(f"--peer {entry!r}: there is no instance {peer} (no netns qe-{peer}) to reach")
        # Its end of the link will answer for ADDR: an address the instance does not have would seem to work.
        shown = run("ip", "-n", f"qe-{peer}", "-6", "-o", "addr", "show").stdout
        if address not in {ipaddress.ip_interface(a).ip for a in re.findall(r"inet6 (\S+)", shown)}:
            raise Failure(f"--peer {entry!r}: instance {peer} has no address {address}")
        peers.append((peer, address))
    return peers


def peer_link(name, peer):
    """The record of a peer link: its ends' names, in qe-NAME and in qe-PEER (unique there: one per instance)."""
    return {"peer": peer, "link": f"qep-{peer}", "peer_link": f"qeq-{name}"}


def peer_link_left(name, link):
    """What is left of a peer link (in the instance's netns or its peer's): [(netns, interface)]."""
    ends = ((f"qe-{name}", link["link"]), (f"qe-{link['peer']}", link["peer_link"]))
    return [(netns, interface) for netns, interface in ends if link_in(netns, interface)]


def setup_peer(name, own, link, address):
    """A veth pair straight between the instance's netns and its peer's, as two instances of one VPC reach each
    other (the host forwards nothing). Each end has its instance's own address, /128 and without a prefix route:
    neighbour discovery has no source address on a link without one (there are no link-local addresses), and
    answers only for an address of the link. Each side routes the other's address alone over it."""
    netns, peer_netns = f"qe-{name}", f"qe-{link['peer']}"
    run("ip", "-n", netns, "link", "add", link["link"], "type", "veth", "peer", "name", link["peer_link"],
        "netns", peer_netns)
    for where, interface, mine, theirs in ((netns, link["link"], own, address),
                                           (peer_netns, link["peer_link"], address, own)):
        run("ip", "-n", where, "link", "set", "dev", interface, "addrgenmode", "none")
        run("ip", "-n", where, "-6", "addr", "add", f"{mine}/128", "dev", interface, "nodad", "noprefixroute")
        run("ip", "-n", where, "link", "set", "dev", interface, "up")
        run("ip", "-n", where, "-6", "route", "add", f"{theirs}/128", "dev", interface)


def setup_network(name, checked):
    netns, host, inside = f"qe-{name}", f"qeh-{name}", f"qei-{name}"
    if open("/proc/sys/net/ipv6/conf/default/disable_ipv6").read().strip() != "0":
        raise Failure("IPv6 is disabled for new interfaces here (net.ipv6.conf.default.disable_ipv6)")
    run("ip", "netns", "add", netns)
    run("ip", "link", "add", host, "type", "veth", "peer", "name", inside, "netns", netns)
    # Only the addresses given: no link-local ones.
    run("ip", "link", "set", "dev", host, "addrgenmode", "none")
    run("ip", "-n", netns, "link", "set", "dev", inside, "addrgenmode", "none")
    for path, value in ((f"/proc/sys/net/ipv4/conf/{host}/forwarding", "0"),
                        (f"/proc/sys/net/ipv6/conf/{host}/forwarding", "0"),
                        (f"/proc/sys/net/ipv6/conf/{host}/accept_ra", "0")):
        with open(path, "w") as f:
            f.write(value)
    for family, interface, host_address in checked:
        prefix = interface.network.prefixlen
        dad = ["nodad"] if family == "6" else []
        run("ip", f"-{family}", "addr", "add", f"{host_address}/{prefix}", "dev", host, *dad, "noprefixroute")
        run("ip", "-n", netns, f"-{family}", "addr", "add", str(interface), "dev", inside, *dad)
    run("ip", "link", "set", "dev", host, "up")
    run("ip", "-n", netns, "link", "set", "dev", "lo", "up")
    run("ip", "-n", netns, "link", "set", "dev", inside, "up")
    for family, interface, host_address in checked:
        full = 128 if family == "6" else 32
        run("ip", f"-{family}", "route", "add", f"{interface.ip}/{full}", "dev", host)
        run("ip", "-n", netns, f"-{family}", "route", "add", "default", "via", str(host_address), "dev", inside)

    def settled():
        for where in (["ip"], ["ip", "-n", netns]):
            link = host if len(where) == 1 else inside
            shown = run(*where, "-6", "-o", "addr", "show", "dev", link).stdout
            if "tentative" in shown:
                return False
            if "dadfailed" in shown:
                raise Failure(f"duplicate address detection failed on {link}: {shown.strip()}")
        return True

    if not wait_until(settled, 10):
        raise Failure("the IPv6 addresses stayed tentative for 10 s")
    if open("/proc/sys/net/ipv6/conf/all/forwarding").read().strip() != "0":
        log("warning: this host forwards IPv6 (net.ipv6.conf.all.forwarding=1): what the instance sends to "
            "other addresses than the host's may leave the machine")


def attach_volume(path, volume, wait_secs, interrupted):
    """The volume file on a loop device of its own, once no other instance holds it: (lock fd, device)."""
    fd = os.open(path, os.O_RDWR)
    deadline = time.monotonic() + wait_secs
    said = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held = loops_of(volume)
            if not held:
                break
            fcntl.flock(fd, fcntl.LOCK_UN)
            reason = f"loop device {', '.join(held)} (another instance's: `boot.py --cleanup` it)"
        except BlockingIOError:
            reason = "another boot.py"
        if interrupted():
            os.close(fd)
            raise Failure("terminated while waiting for the volume")
        if time.monotonic() > deadline:
            os.close(fd)
            raise Failure(f"the volume {path} is still attached to {reason} after {wait_secs} s")
        if not said:
            log(f"waiting up to {wait_secs} s for the volume, held by {reason}")
            said = True
        time.sleep(0.5)
    device = run("losetup", "--find", "--show", path).stdout.strip()
    return fd, device


def teardown(state, record, quiet=False):
    """Undoes everything `record` says was set up, idempotently: kills what runs in the instance, deletes its
    veth and netns, detaches its loop devices. True when nothing is left."""
    name = record["name"]
    netns, host = f"qe-{name}", f"qeh-{name}"
    ok = True
    ino = record.get("netns_ino")
    if ino is None and os.path.exists(netns_path(name)):
        ino = os.stat(netns_path(name)).st_ino
    if ino is not None:
        def killed():
            pids = pids_in_netns(ino)
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            return not pids
        if not wait_until(killed, 10):
            log(f"processes still in {netns} after 10 s: {pids_in_netns(ino)}")
            ok = False
    # Deleting one end of the veth deletes both, at once (a netns may outlive its name a while). So do peer links,
    # whichever end is left: its own, or, should its netns have lost its name, the peer's.
    if link_exists(host):
        run("ip", "link", "del", "dev", host, check=False, quiet=quiet)
    links = record.get("peer_links", [])
    for link in links:
        for where, interface in peer_link_left(name, link)[:1]:
            run("ip", "-n", where, "link", "del", "dev", interface, check=False, quiet=quiet)
    if os.path.exists(netns_path(name)):
        run("ip", "netns", "del", netns, check=False, quiet=quiet)
    if not wait_until(lambda: not link_exists(host) and not os.path.exists(netns_path(name)), 10):
        log(f"{host} or {netns} is still there after 10 s")
        ok = False
    if not wait_until(lambda: not any(peer_link_left(name, link) for link in links), 10):
        log(f"peer links still there after 10 s: {[peer_link_left(name, link) for link in links]}")
        ok = False
    volume = record.get("volume")
    if volume:
        # Only loop devices still backed by this volume file: a device number may have been reused since.
        for device in record.get("loops", []):
            if device in loops_of(volume):
                # Busy (a mount not yet released by a dying namespace): detached once the last user closes it.
                run("losetup", "--detach", device, check=False, quiet=quiet)
        if not wait_until(lambda: not set(record.get("loops", [])) & set(loops_of(volume)), 10):
            log(f"loop device(s) {loops_of(volume)} still hold {volume['path']} after 10 s")
            ok = False
    return ok


def cleanup(name, state):
    """`boot.py --cleanup`: the instance killed abruptly (boot.py itself, everything in the netns: SIGKILL)."""
    record = read_json(os.path.join(state, "instance.json")) or {"name": name}
    if record.get("name") != name:
        raise Failure(f"{state}/instance.json is instance {record.get('name')}'s, not {name}'s")
    outer = record.get("boot_pid")
    if outer and outer != os.getpid() and alive(outer, record.get("boot_start")):
        try:
            os.kill(outer, signal.SIGKILL)
        except ProcessLookupError:
            pass
        wait_until(lambda: not alive(outer, record.get("boot_start")), 5)
    ok = teardown(state, record)
    if ok:
        try:
            os.remove(os.path.join(state, "instance.json"))
        except FileNotFoundError:
            pass
    return ok


class Signals:
    def __init__(self):
        self.got = []
        for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(number, lambda number, frame: self.got.append(number))

    def take(self):
        got, self.got = self.got, []
        return got


def boot(args):
    name, state = args.name, os.path.abspath(args.state)
    if not NAME_RE.match(name):
        raise Failure(f"--name {name!r}: 1 to 11 of a-z 0-9 - (it goes into interface names)")
    if os.geteuid() != 0:
        raise Failure("must run as root")
    missing = [tool for tool in HOST_TOOLS + INSTANCE_TOOLS if not shutil.which(tool, path=PATH)]
    if missing:
        raise Failure(f"missing tools: {' '.join(missing)}")
    checked = addresses(args)
    peers = peers_of(args)
    user_data = read_user_data(args.user_data)
    volume_path = os.path.abspath(args.volume_file)
    info = os.stat(volume_path)
    volume = {"path": volume_path, "ino": info.st_ino, "major": os.major(info.st_dev), "minor": os.minor(info.st_dev)}
    volume_id = args.volume_id
    if not re.fullmatch(r"vol-[0-9a-zA-Z]+", volume_id):
        raise Failure(f"--volume-id {volume_id!r} is not a volume id")
    if args.instance_id is not None and not re.fullmatch(r"i-[0-9a-f]+", args.instance_id):
        raise Failure(f"--instance-id {args.instance_id!r} is not an instance id")
    hosts = []
    for entry in args.add_host:
        host_name, _, address = entry.partition("=")
        ipaddress.ip_address(address)
        hosts.append(f"{address} {host_name}")

    os.makedirs(state, exist_ok=True)
    os.chmod(state, 0o700)
    record_path = os.path.join(state, "instance.json")
    old = read_json(record_path)
    if old:
        if old.get("boot_pid") and alive(old["boot_pid"], old.get("boot_start")):
            raise Failure(f"{state} is instance {old['name']}'s, which still runs (pid {old['boot_pid']})")
        log(f"cleaning up what instance {old.get('name')} left in {state}")
        if not cleanup(old["name"], state):
            raise Failure("the last instance of this state directory cannot be cleaned up")
    if os.path.exists(netns_path(name)) or link_exists(f"qeh-{name}"):
        raise Failure(f"instance {name} exists already (qe-{name} or qeh-{name}); `boot.py --cleanup` it")

    record = {"name": name, "boot_pid": os.getpid(), "boot_start": start_time(os.getpid()), "volume": volume,
              "loops": []}
    write_json(record_path, record)
    signals = Signals()
    child = None
    lock_fd = None
    outcome = {"code": 1}
    try:
        # A fresh instance: its own files from scratch, the logs kept.
        root = os.path.join(state, "root")
        if os.path.exists(root):
            shutil.rmtree(root)
        for stale in ("node.pid",):
            if os.path.exists(os.path.join(state, stale)):
                os.remove(os.path.join(state, stale))
        os.makedirs(root, mode=0o700)
        run("cp", "-a", "/etc", os.path.join(root, "etc"), timeout=120)
        if hosts:
            with open(os.path.join(root, "etc", "hosts"), "a") as f:
                f.write("".join(line + "\n" for line in hosts))
        for path in ("usr-local/bin", "usr-local/sbin", "usr-local/lib", "usr-local/share", "usr-local/etc",
                     "usr-local/include", "usr-local/src", "var-lib/cloud/instance/scripts"):
            os.makedirs(os.path.join(root, path), mode=0o755, exist_ok=True)
        write_json(os.path.join(state, "user-data.json"), user_data)
        bin_dir = os.path.join(state, "bin")
        os.makedirs(bin_dir, exist_ok=True)
        # The stubs run this file from STATE: inside the instance, /tmp (where a checkout may be) is the
        # instance's own, and STATE is the one host directory it sees.
        stub_self = os.path.join(bin_dir, "boot.py")
        shutil.copyfile(SELF, stub_self)
        for tool in ("systemctl", "udevadm"):
            with open(os.path.join(bin_dir, tool), "w") as f:
                f.write(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(stub_self)} --stub {tool} "
                        f"{shlex.quote(state)} \"$@\"\n")
            os.chmod(os.path.join(bin_dir, tool), 0o755)

        lock_fd, device = attach_volume(volume_path, volume, args.volume_wait, lambda: bool(signals.got))
        record["loops"].append(device)
        write_json(record_path, record)

        record["netns_ino"] = None
        write_json(record_path, record)
        try:
            setup_network(name, checked)
        finally:
            if os.path.exists(netns_path(name)):
                record["netns_ino"] = os.stat(netns_path(name)).st_ino
                write_json(record_path, record)
        # Recorded before they are made: --cleanup deletes what is left of them, the peer's end too.
        record["peer_links"] = [peer_link(name, peer) for peer, _ in peers]
        write_json(record_path, record)
        for link, (_, address) in zip(record["peer_links"], peers):
            setup_peer(name, checked[0][1].ip, link, address)

        inner = {"name": name, "state": state, "device": device, "rdev": os.stat(device).st_rdev,
                 "volume_id": volume_id, "boot_timeout": args.boot_timeout, "instance_id": args.instance_id,
                 "env": {k: v for k, v in os.environ.items() if k in ("RUST_LOG", "RUST_BACKTRACE")}}
        write_json(os.path.join(state, "inner.json"), inner)
        child = subprocess.Popen(
            ["ip", "netns", "exec", f"qe-{name}", "unshare", "--mount", "--uts", "--propagation", "private", "--",
             sys.executable, SELF, "--inner", state],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, start_new_session=True)
        outcome = supervise(child, signals, args)
    except Failure as error:
        log(f"error: {error}")
        outcome = {"code": EXIT_SETUP}
    finally:
        if child is not None and child.poll() is None:
            try:
                # The inner process unmounts the volume and ends once the dataplane has exited.
                child.wait(timeout=5 if outcome.get("ending") else 0.1)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(child.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        ok = teardown(state, record)
        if child is not None:
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                ok = False
        if lock_fd is not None:
            os.close(lock_fd)
        if ok:
            os.remove(record_path)
        else:
            log(f"not everything could be torn down: `boot.py --cleanup --name {name} --state {state}`")
            if outcome["code"] == 0:
                outcome["code"] = 1
    return outcome["code"]


def supervise(child, signals, args):
    """Follows the instance: its inner process's reports, and signals to boot.py."""
    buffer = b""
    dataplane = None
    deadline = time.monotonic() + args.boot_timeout + 120

    def lines(timeout):
        nonlocal buffer
        ready, _, _ = select.select([child.stdout], [], [], timeout)
        if not ready:
            return []
        chunk = os.read(child.stdout.fileno(), 4096)
        if not chunk:
            return None
        buffer += chunk
        *complete, buffer = buffer.split(b"\n")
        return [line.decode() for line in complete]

    def stop(number):
        """The instance terminated: the dataplane stopped as systemd would stop it."""
        if dataplane is None:
            log(f"signal {number} before the dataplane started: stopping the first boot")
            say("stopped status=none")
            return {"code": 0}
        log(f"signal {number}: stopping the dataplane (pid {dataplane})")
        try:
            os.kill(dataplane, signal.SIGTERM)
        except ProcessLookupError:
            pass
        for limit, then in ((args.stop_timeout, signal.SIGKILL), (5, None)):
            until = time.monotonic() + limit
            while time.monotonic() < until:
                got = lines(0.2)
                if got is None:
                    log("the instance's inner process ended before the dataplane's exit was seen")
                    say("stopped status=unknown")
                    return {"code": 0}
                for line in got:
                    if line.startswith("exited status="):
                        say(f"stopped status={line.split('=', 1)[1]}")
                        return {"code": 0, "ending": True}
            if then is not None:
                log(f"the dataplane did not stop within {args.stop_timeout} s: SIGKILL")
                try:
                    os.kill(dataplane, then)
                except ProcessLookupError:
                    pass
        say("stopped status=killed")
        return {"code": 0}

    while True:
        for number in signals.take():
            if number == signal.SIGHUP:
                if dataplane:
                    os.kill(dataplane, signal.SIGHUP)
                continue
            return stop(number)
        if dataplane is None and time.monotonic() > deadline:
            log("the first boot did not end in time")
            say("first-boot failed status=timeout")
            return {"code": EXIT_FIRST_BOOT}
        got = lines(0.25)
        if got is None:
            child.wait(timeout=10)
            log(f"the instance's inner process ended unexpectedly (status {child.returncode})")
            if dataplane is None:
                say(f"first-boot failed status={child.returncode}")
                return {"code": EXIT_FIRST_BOOT}
            say("exited status=unknown")
            return {"code": 1}
        for line in got:
            if line.startswith("started pid="):
                dataplane = int(line.split("=", 1)[1])
                say(f"booted pid={dataplane}")
            elif line.startswith("exited status="):
                status = int(line.split("=", 1)[1])
                say(f"exited status={status}")
                return {"code": status, "ending": True}
            elif line.startswith("first-boot failed"):
                say(line)
                return {"code": EXIT_FIRST_BOOT, "ending": True}
            else:
                log(f"inner: {line}")


# --- Inside the instance's namespaces ---------------------------------------------------------------------------


def mountinfo():
    """[(mount point, file system type, per-mount options)] of this mount namespace."""
    unescape = lambda s: re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), s)
    mounts = []
    for line in open("/proc/self/mountinfo"):
        before, after = line.split(" - ", 1)
        fields = before.split()
        mounts.append((unescape(fields[4]), after.split()[0], fields[5].split(",")))
    return mounts


def covered(path, targets):
    return any(path == t or path.startswith(t.rstrip("/") + "/") for t in targets)


def make_instance_filesystem(config):
    state, root = config["state"], os.path.join(config["state"], "root")
    sh = lambda *args: run(*args)
    sh("mount", "--make-rprivate", "/")
    # Copies of other network namespaces' handles (/run/netns/*): held here, they would keep those alive.
    for point, fstype, _ in sorted(mountinfo(), key=lambda m: -len(m[0])):
        if fstype == "nsfs":
            run("umount", "--lazy", point, check=False)
    host_mounts = mountinfo()
    state_fd = os.open(state, os.O_RDONLY | os.O_DIRECTORY)
    ours = []

    def tmpfs(path, mode):
        sh("mount", "-t", "tmpfs", "-o", f"mode={mode},nosuid", "tmpfs", path)
        ours.append(path)

    def bind(source, path):
        sh("mount", "--bind", source, path)
        ours.append(path)

    bind(os.path.join(root, "etc"), "/etc")
    bind(os.path.join(root, "usr-local"), "/usr/local")
    bind(os.path.join(root, "var-lib"), "/var/lib")
    tmpfs("/run", "0755")
    os.makedirs("/run/lock", mode=0o1777)
    os.chmod("/run/lock", 0o1777)
    for path in ("/tmp", "/var/tmp"):
        tmpfs(path, "1777")
    tmpfs("/var/log", "0755")
    # A /dev with the basics and the volume: the one block device the script can find.
    sh("mount", "-t", "tmpfs", "-o", "mode=0755,nosuid", "tmpfs", "/dev")
    ours.append("/dev")
    for node, major, minor in (("null", 1, 3), ("zero", 1, 5), ("full", 1, 7), ("random", 1, 8),
                               ("urandom", 1, 9), ("tty", 5, 0)):
        os.mknod(f"/dev/{node}", 0o666 | 0o020000, os.makedev(major, minor))
        os.chmod(f"/dev/{node}", 0o666)
    for link, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"/dev/{link}")
    for directory in ("/dev/shm", "/dev/pts"):
        os.makedirs(directory)
    sh("mount", "-t", "tmpfs", "-o", "mode=1777,nosuid,nodev", "tmpfs", "/dev/shm")
    device = config["device"]
    os.mknod(device, 0o660 | 0o060000, config["rdev"])
    os.chmod(device, 0o660)
    os.makedirs("/dev/disk/by-id")
    volume = config["volume_id"].replace("-", "", 1)
    os.symlink(os.path.join("..", "..", os.path.basename(device)),
               f"/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_{volume}")
    # STATE, where the harness writes (logs, pid), wherever it is: made writable again at its own path.
    os.makedirs(state, exist_ok=True)
    # (--no-canonicalize: mount(8) would otherwise resolve the fd's link to a path, the covered one.)
    sh("mount", "--no-canonicalize", "--bind", f"/proc/{os.getpid()}/fd/{state_fd}", state)
    if not os.path.exists(os.path.join(state, "inner.json")):
        raise Failure(f"{state} is not the harness's state directory inside the instance")
    os.close(state_fd)
    ours.append(state)
    # Everything else of the host's: read-only here, so that nothing the instance does changes the host's files.
    pseudo = {"proc", "sysfs", "cgroup", "cgroup2", "devpts", "nsfs", "mqueue", "bpf", "securityfs", "debugfs",
              "tracefs", "configfs", "pstore", "fusectl", "binfmt_misc", "autofs", "efivarfs", "hugetlbfs"}
    for point, fstype, options in host_mounts:
        if fstype in pseudo or "ro" in options or covered(point, ours):
            continue
        run("mount", "-o", "remount,bind,ro", point, check=False)
    socket.sethostname(f"qe-{config['name']}")


def write_files(files):
    """cloud-init's write_files (cc_write_files): parents made, content written, then mode and owner."""
    for entry in files:
        path = entry["path"]
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "ab" if entry["append"] else "wb") as f:
            f.write(base64.b64decode(entry["content_b64"]))
        os.chmod(path, entry["permissions"])
        user, _, group = entry["owner"].partition(":")
        shutil.chown(path, user, group or None)


class Metadata(http.server.ThreadingHTTPServer):
    """EC2's instance metadata service, IMDSv2, as far as a first boot asks."""

    daemon_threads = True

    def __init__(self, instance_id):
        self.instance_id = instance_id
        self.session = base64.b64encode(os.urandom(24)).decode()
        super().__init__(("169.254.169.254", 80), MetadataHandler)


class MetadataHandler(http.server.BaseHTTPRequestHandler):
    def do_PUT(self):
        if self.path != "/latest/api/token" or not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
            self.send_error(400)
            return
        self.answer(self.server.session)

    def do_GET(self):
        if self.headers.get("X-aws-ec2-metadata-token") != self.server.session:
            self.send_error(401)
        elif self.path == "/latest/meta-data/instance-id":
            self.answer(self.server.instance_id)
        else:
            self.send_error(404)

    def answer(self, text):
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(text)))
        self.end_headers()
        self.wfile.write(text.encode())

    def log_message(self, *args):
        pass


def serve_metadata(instance_id):
    """Serves the metadata service on the instance's lo for as long as this, its init process, runs."""
    run("ip", "addr", "add", "169.254.169.254/32", "dev", "lo")
    server = Metadata(instance_id)
    threading.Thread(target=server.serve_forever, daemon=True).start()


def inner(state):
    """The instance's "init": runs inside its namespaces; reports on stdout to boot.py."""
    config = read_json(os.path.join(state, "inner.json"))
    user_data = read_json(os.path.join(state, "user-data.json"))
    libc = ctypes.CDLL(None, use_errno=True)
    # PR_SET_CHILD_SUBREAPER: the dataplane, whose starter (the systemctl stub) exits, becomes our child.
    if libc.prctl(36, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.umask(0o022)
    make_instance_filesystem(config)
    if config.get("instance_id"):
        serve_metadata(config["instance_id"])
    write_files(user_data["write_files"])
    script = "/var/lib/cloud/instance/scripts/runcmd"
    with open(script, "w") as f:
        f.write(user_data["runcmd"])
    os.chmod(script, 0o700)

    log_path = os.path.join(state, "first-boot.log")
    environment = {"PATH": f"{os.path.join(state, 'bin')}:{PATH}", "LANG": "C.UTF-8"}
    if shutil.which("systemctl", path=environment["PATH"]) != os.path.join(state, "bin", "systemctl"):
        raise Failure("the systemctl stub is not first on PATH")
    read_end, write_end = os.pipe()
    boot = subprocess.Popen([script], stdin=subprocess.DEVNULL, stdout=write_end, stderr=write_end,
                            env=environment, cwd="/", start_new_session=True)
    os.close(write_end)

    def tee():
        with open(log_path, "ab") as out, os.fdopen(read_end, "rb") as source:
            for line in source:
                out.write(line)
                out.flush()
                sys.stderr.buffer.write(f"[{config['name']} first-boot] ".encode() + line)
                sys.stderr.flush()

    copier = threading.Thread(target=tee, daemon=True)
    copier.start()
    try:
        code = boot.wait(timeout=config["boot_timeout"])
    except subprocess.TimeoutExpired:
        os.killpg(boot.pid, signal.SIGKILL)
        code = "timeout"
        boot.wait()
    copier.join(timeout=5)

    dataplane = None
    try:
        dataplane = int(open(os.path.join(state, "node.pid")).read())
    except (FileNotFoundError, ValueError):
        pass
    if dataplane is not None and parent_of(dataplane) != os.getpid():
        # Not (or no longer) ours to wait for: gone already, or started by someone else.
        try:
            pid, status = os.waitpid(dataplane, os.WNOHANG)
        except ChildProcessError:
            pid = 0
        if not pid:
            dataplane = None
    if code != 0 or dataplane is None:
        if dataplane is not None:
            os.kill(dataplane, signal.SIGKILL)
        why = code if code != 0 else "0 (no dataplane started)"
        print(f"first-boot failed status={why}", flush=True)
        return
    print(f"started pid={dataplane}", flush=True)
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            print("exited status=255", flush=True)
            break
        if pid == dataplane:
            print(f"exited status={status_of(status)}", flush=True)
            break
    # What the node held, released before the namespace goes (boot.py then kills anything left).
    run("umount", "/var/lib/queue-expert", check=False, quiet=True)


# --- The systemctl stub (inside the instance) -------------------------------------------------------------------


def parse_unit(path):
    sections, section = {}, None
    text = open(path).read().replace("\\\n", " ")
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = sections.setdefault(line[1:-1], {})
            continue
        key, _, value = line.partition("=")
        section.setdefault(key.strip(), []).append(value.strip())
    return sections


def load_unit(unit_name):
    """The unit with its drop-ins (UNIT.d/*.conf, in name order) after it: a key they set again comes after, so
    its last value wins (an empty `ExecStart=` then a new one replaces the command, as in systemd)."""
    unit = parse_unit(f"/etc/systemd/system/{unit_name}")
    drop_ins = f"/etc/systemd/system/{unit_name}.d"
    names = sorted(os.listdir(drop_ins)) if os.path.isdir(drop_ins) else []
    for name in (n for n in names if n.endswith(".conf")):
        for section, keys in parse_unit(os.path.join(drop_ins, name)).items():
            for key, values in keys.items():
                unit.setdefault(section, {}).setdefault(key, []).extend(values)
    return unit


def capabilities(values):
    names = " ".join(values).split()
    return [name.lower().removeprefix("cap_") for name in names if name != "~"]


def start_unit(state, unit_name):
    pid_path = os.path.join(state, "node.pid")
    try:
        pid = int(open(pid_path).read())
        if alive(pid, start_time(pid)):
            return 0
    except (FileNotFoundError, ValueError):
        pass
    unit = load_unit(unit_name)
    service = {key: values[-1] for key, values in unit.get("Service", {}).items()}
    all_values = unit.get("Service", {})
    exec_start = shlex.split(service["ExecStart"])
    while exec_start[0][0] in "-@:+!":
        exec_start[0] = exec_start[0][1:]
    user, group = service.get("User"), service.get("Group")
    environment = {"PATH": PATH, "LANG": "C.UTF-8"}
    environment.update(read_json(os.path.join(state, "inner.json")).get("env", {}))
    command = []
    uid = gid = 0
    if user:
        account = pwd.getpwnam(user)
        uid, gid = account.pw_uid, grp.getgrnam(group).gr_gid if group else account.pw_gid
        environment.update({"HOME": account.pw_dir, "USER": user, "LOGNAME": user, "SHELL": account.pw_shell})
        command = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--init-groups"]
        ambient = capabilities(all_values.get("AmbientCapabilities", []))
        if ambient:
            caps = ",".join(f"+{cap}" for cap in ambient)
            command += [f"--inh-caps={caps}", f"--ambient-caps={caps}"]
        bounding = capabilities(all_values.get("CapabilityBoundingSet", []))
        if bounding:
            command += ["--bounding-set=-all," + ",".join(f"+{cap}" for cap in bounding)]
        if service.get("NoNewPrivileges") in ("yes", "true", "1", "on"):
            command += ["--no-new-privs"]
        command += ["--"]
    # StateDirectory=: made, and given to the user when its top is not the user's (recursively, as systemd does).
    for directory in " ".join(all_values.get("StateDirectory", [])).split():
        path = os.path.join("/var/lib", directory)
        os.makedirs(path, exist_ok=True)
        info = os.lstat(path)
        if (info.st_uid, info.st_gid) != (uid, gid):
            for top, dirs, files in os.walk(path):
                for entry in [top] + [os.path.join(top, e) for e in dirs + files]:
                    os.lchown(entry, uid, gid)
        os.chmod(path, int(service.get("StateDirectoryMode", "0755"), 8))
        environment["STATE_DIRECTORY"] = path
    umask = int(service.get("UMask", "0022"), 8)
    nofile = service.get("LimitNOFILE")

    notes = []
    if nofile:
        # Here, inherited by the unit's process. Where the harness may not raise the hard limit (no
        # CAP_SYS_RESOURCE in a container), as far as it goes.
        soft, _, hard = nofile.partition(":")
        want = (int(soft), int(hard or soft))
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, want)
        except (ValueError, OSError):
            limit = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(want[0], limit), limit))
            notes.append(f"boot.py: LimitNOFILE={nofile} cannot be had here: {limit} instead\n")

    def prepare():
        os.umask(umask)

    with open(os.path.join(state, "node.log"), "ab") as out:
        out.write("".join(notes).encode())
        out.flush()
        process = subprocess.Popen(command + exec_start, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                   env=environment, cwd="/", start_new_session=True, preexec_fn=prepare)
    tmp = f"{pid_path}.tmp"
    with open(tmp, "w") as f:
        f.write(f"{process.pid}\n")
    os.replace(tmp, pid_path)
    return 0


def stub(tool, state, arguments):
    with open(os.path.join(state, f"{tool}.log"), "a") as f:
        f.write(" ".join(arguments) + "\n")
    if tool != "systemctl":
        return 0
    words = [a for a in arguments if not a.startswith("-")]
    now = "--now" in arguments
    if not words:
        return 0
    verb, units = words[0], [u if "." in u else f"{u}.service" for u in words[1:]]
    if verb in ("enable", "start", "restart", "reenable") and units:
        for unit in units:
            if verb in ("enable", "reenable"):
                install = parse_unit(f"/etc/systemd/system/{unit}").get("Install", {})
                for target in " ".join(install.get("WantedBy", [])).split():
                    wants = f"/etc/systemd/system/{target}.wants"
                    os.makedirs(wants, exist_ok=True)
                    if not os.path.lexists(os.path.join(wants, unit)):
                        os.symlink(f"/etc/systemd/system/{unit}", os.path.join(wants, unit))
            if verb != "enable" or now:
                start_unit(state, unit)
        return 0
    if verb in ("is-active", "stop", "reload", "kill"):
        try:
            pid = int(open(os.path.join(state, "node.pid")).read())
        except (FileNotFoundError, ValueError):
            return 3
        if not alive(pid, start_time(pid)):
            return 3
        if verb != "is-active":
            os.kill(pid, {"stop": signal.SIGTERM, "reload": signal.SIGHUP, "kill": signal.SIGTERM}[verb])
        return 0
    return 0


# --- The self-test ----------------------------------------------------------------------------------------------

SELFTEST_QUEUE = "k3j9x0c2m1ab"
SELFTEST_TOKEN = "0f" * 32
SELFTEST_BOOTSTRAP_TOKEN = "1700000000000." + "ab" * 32


def selftest():
    failures = []

    def check(what, ok, detail=""):
        print(("ok      " if ok else "FAILED  ") + what + (f": {detail}" if detail and not ok else ""), flush=True)
        if not ok:
            failures.append(what)
        return ok

    binary = os.path.join(REPO, "target", "debug", "dataplane")
    template = open(os.path.join(REPO, "infra", "cloud-init", "node.yaml")).read()
    work = tempfile.mkdtemp(prefix="qe-boot-selftest.")
    names = []
    server = None
    try:
        # The reader against PyYAML, when there is one.
        rendered_sample = render(template, values("https://[fd71:7e5e::1]:8443", "ab" * 32, "vol-0abc", "PEM\n"))
        try:
            import yaml
        except ImportError:
            yaml = None
            for python in (os.path.join(REPO, ".venv", "bin", "python"),):
                if os.path.exists(python):
                    result = subprocess.run([python, "-c", "import sys, yaml, json; "
                                             "print(json.dumps(yaml.safe_load(sys.stdin)))"],
                                            input=rendered_sample, capture_output=True, text=True)
                    if result.returncode == 0:
                        check("the YAML reader reads the template as PyYAML does (.venv)",
                              MiniYaml(rendered_sample).parse() == json.loads(result.stdout))
        if yaml is not None:
            check("the YAML reader reads the template as PyYAML does",
                  MiniYaml(rendered_sample).parse() == yaml.safe_load(rendered_sample))
        sample = ("#cloud-config\na: 'it''s'\nb: \"\\x41\\u00e9\"  # comment\nc: [1, x, 'y z']\nd:\n- |+\n  kept\n\n"
                  "- - 0644\n  - off\ne: |-\n   x\n   # not a comment\n")
        check("the YAML reader: quoting, flow sequences, chomping, nesting",
              MiniYaml(sample).parse() ==
              {"a": "it's", "b": "A\u00e9", "c": [1, "x", "y z"], "d": ["kept\n\n", [420, False]],
               "e": "x\n# not a comment"})

        # A root, and the control plane's certificate for its address as the instance sees it.
        ca_pem, ca_key = openssl_root(work, "selftest-root")
        key, csr, pem = (os.path.join(work, f) for f in ("cp.key", "cp.csr", "cp.pem"))
        with open(os.path.join(work, "san.cnf"), "w") as f:
            f.write("subjectAltName=IP:fd71:7e5e::1,IP:10.213.0.1\n")
        subprocess.run(["openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                        "-keyout", key, "-out", csr, "-subj", "/CN=control-plane"], check=True, capture_output=True)
        subprocess.run(["openssl", "x509", "-req", "-in", csr, "-CA", ca_pem, "-CAkey", ca_key, "-CAcreateserial",
                        "-out", pem, "-days", "2", "-extfile", os.path.join(work, "san.cnf")],
                       check=True, capture_output=True)
        server = SelftestControlPlane(binary, (pem, key))
        url = f"https://[fd71:7e5e::1]:{server.server_address[1]}"
        sha = hashlib.sha256(open(binary, "rb").read()).hexdigest()
        user_data = os.path.join(work, "user-data.yaml")
        volume_id = "vol-0c0ffee0123456789"
        with open(user_data, "w") as f:
            f.write(render(template, values(url, sha, volume_id, open(ca_pem).read())))
        volume_file = os.path.join(work, "volume.img")
        with open(volume_file, "wb") as f:
            f.truncate(256 << 20)
        watched = ["/etc/passwd", "/etc/group", "/etc/shadow", "/etc/fstab", "/etc/hosts"]
        before = {path: hashlib.sha256(open(path, "rb").read()).hexdigest() for path in watched}
        host_net = os.stat("/proc/self/ns/net").st_ino

        def start(name, volume=volume_file, last=2, extra=(), wait=True):
            state = os.path.join(work, name)
            names.append((name, state))
            process = subprocess.Popen(
                [sys.executable, SELF, "--name", name, "--user-data", user_data, "--volume-file", volume,
                 "--volume-id", volume_id, "--v6", f"fd71:7e5e::{last}/64", "--v4", f"10.213.0.{last}/24",
                 "--host-v6", "fd71:7e5e::1", "--host-v4", "10.213.0.1", "--state", state,
                 "--instance-id", "i-0123456789abcdef0", *extra],
                stdout=subprocess.PIPE, text=True)
            line = read_line(process, 240) if wait else None
            return process, state, line

        def dead(pid):
            def check():
                try:
                    return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
                except FileNotFoundError:
                    return True
            return pid is None or wait_until(check, 5)

        def reachable(address):
            """The host reaches the instance's address: refused at once on a closed port, not unreachable."""
            family = socket.AF_INET6 if ":" in address else socket.AF_INET
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.settimeout(3)
                try:
                    sock.connect((address, 443))
                    return True
                except ConnectionRefusedError:
                    return True
                except OSError:
                    return False

        def gone(name, state, volume=volume_file):
            leftovers = []
            if f"qe-{name}" in run("ip", "netns", "list").stdout.split():
                leftovers.append(f"netns qe-{name}")
            if link_exists(f"qeh-{name}"):
                leftovers.append(f"qeh-{name}")
            held = run("losetup", "--associated", volume).stdout.strip() if volume else ""
            if held:
                leftovers.append(held)
            if os.path.exists(os.path.join(state, "instance.json")):
                leftovers.append("instance.json")
            # Its end of a peer link, in the netns of an instance that runs on.
            for netns in (entry.split()[0] for entry in run("ip", "netns", "list").stdout.splitlines()):
                if link_in(netns, f"qeq-{name}"):
                    leftovers.append(f"qeq-{name} in {netns}")
            return leftovers

        def direct(source, target, address):
            """qe-SOURCE reaches ADDRESS of qe-TARGET over their peer link, not through the host."""
            route = run("ip", "-n", f"qe-{source}", "-6", "route", "get", address).stdout
            # The link's end in qe-SOURCE is named after TARGET: qep- if SOURCE was booted beside it, else qeq-.
            over_link = re.search(rf" dev qe[pq]-{target} ", route) is not None
            return over_link and connects(source, target, address)

        # 1. A first boot, stopped cleanly.
        name = f"st{os.getpid() % 100000}a"
        started = time.monotonic()
        process, state, line = start(name)
        if not check("first boot: boot.py says `booted pid=N`", line.startswith("booted pid="), line):
            raise Failure("no boot")
        print(f"        booted in {time.monotonic() - started:.1f} s", flush=True)
        pid = int(line.split("=")[1])
        installed = os.path.join(state, "root", "usr-local", "bin", "dataplane")
        check("the binary is installed in the instance's /usr/local/bin, with the rendered hash",
              os.path.exists(installed) and hashlib.sha256(open(installed, "rb").read()).hexdigest() == sha)
        check("the host's /usr/local/bin has no dataplane", not os.path.exists("/usr/local/bin/dataplane"))
        check("node.pid says the same pid", open(os.path.join(state, "node.pid")).read().strip() == str(pid))
        check("the dataplane runs in the instance's netns, not the host's",
              os.stat(f"/proc/{pid}/ns/net").st_ino not in (host_net, None)
              and os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat(netns_path(name)).st_ino)
        status = open(f"/proc/{pid}/status").read()
        uid = int(re.search(r"^Uid:\s+(\d+)", status, re.M).group(1))
        amb = int(re.search(r"^CapAmb:\s+([0-9a-f]+)", status, re.M).group(1), 16)
        check("it runs as the unit's User= (not root), CAP_NET_BIND_SERVICE ambient",
              uid != 0 and amb == 1 << 10, f"uid {uid}, CapAmb {amb:x}")
        check("its command line is the unit's ExecStart=",
              open(f"/proc/{pid}/cmdline").read().split("\0")[:5] ==
              ["/usr/local/bin/dataplane", "--bootstrap", "/etc/queue-expert/bootstrap.toml", "--data-dir",
               "/var/lib/queue-expert"])
        fb = open(os.path.join(state, "first-boot.log")).read()
        check("the first boot found the volume by its NVMe name and formatted it",
              "is /dev/loop" in fb and "formatting" in fb, fb)
        check("the volume is ext4, label qe-data",
              run("blkid", "-p", "-s", "LABEL", "-o", "value", volume_file, check=False).stdout.strip() == "qe-data")
        mounts = open(f"/proc/{pid}/mountinfo").read()
        check("the volume is mounted at /var/lib/queue-expert in the instance only",
              " /var/lib/queue-expert " in mounts and "/var/lib/queue-expert" not in open("/proc/self/mountinfo").read())
        check("the dataplane reaches the host's control plane from the netns (token and all)",
              wait_until(lambda: server.node_requests > 0, 30, 0.5), f"requests {server.paths}")
        check("the host reaches the instance on fd71:7e5e::2 and 10.213.0.2",
              reachable("fd71:7e5e::2") and reachable("10.213.0.2"))
        shown = run("ip", "-n", f"qe-{name}", "-o", "addr", "show").stdout
        check("the instance has only the addresses given (and lo's, the metadata service's among them)",
              sorted(re.findall(r"inet6? (\S+)", shown)) ==
              sorted(["127.0.0.1/8", "::1/128", "169.254.169.254/32", "fd71:7e5e::2/64", "10.213.0.2/24"]), shown)
        check("the host's /etc is unchanged",
              before == {path: hashlib.sha256(open(path, "rb").read()).hexdigest() for path in watched})
        process.send_signal(signal.SIGTERM)
        try:
            rest = process.communicate(timeout=60)[0]
        except subprocess.TimeoutExpired:
            process.kill()
            rest = process.communicate()[0]
        check("SIGTERM: boot.py says `stopped status=N` and exits 0",
              rest.startswith("stopped status=") and process.returncode == 0, f"{rest!r} {process.returncode}")
        check("SIGTERM: no netns, veth, loop device or record left", not gone(name, state), str(gone(name, state)))
        check("SIGTERM: the dataplane is gone", dead(pid))
        check("the host has no user queue-expert", "queue-expert" not in open("/etc/passwd").read())

        # 2. A replacement with the same volume, beside another queue's instance (same host addresses) booted as
        # its standby (--peer): the replacement is killed (--cleanup) while it runs, and the standby runs on.
        name = f"st{os.getpid() % 100000}b"
        process, state, line = start(name)
        check("replacement: booted", line.startswith("booted pid="), line)
        fb = open(os.path.join(state, "first-boot.log")).read()
        check("replacement: the volume is kept, not formatted again", "formatting" not in fb, fb)
        pid = int(line.split("=")[1]) if line.startswith("booted pid=") else None
        other_volume = os.path.join(work, "other.img")
        with open(other_volume, "wb") as f:
            f.truncate(256 << 20)
        other_name = f"st{os.getpid() % 100000}d"
        other, other_state, other_line = start(other_name, volume=other_volume, last=3,
                                               extra=["--peer", f"{name}=fd71:7e5e::2"])
        check("another instance at the same time (fd71:7e5e::3, same host addresses), --peer the first: booted",
              other_line.startswith("booted pid="), other_line)
        requests = server.node_requests
        check("both reach the control plane, the host reaches both",
              wait_until(lambda: server.node_requests >= requests + 2, 30, 0.5)
              and all(reachable(a) for a in ("fd71:7e5e::2", "10.213.0.2", "fd71:7e5e::3", "10.213.0.3")))
        check("--peer: each reaches the other's address directly, not through the host",
              direct(other_name, name, "fd71:7e5e::2") and direct(name, other_name, "fd71:7e5e::3"))
        lost = f"st{os.getpid() % 100000}h"
        stray, stray_state, _ = start(lost, last=5, extra=["--peer", f"{lost}x=fd71:7e5e::9"], wait=False)
        try:
            out = stray.communicate(timeout=30)[0]
        except subprocess.TimeoutExpired:
            stray.kill()
            out = stray.communicate()[0]
        check("--peer an instance that is not there: exit 2, nothing left",
              stray.returncode == 2 and out == "" and not gone(lost, stray_state, None), f"{stray.returncode} {out!r}")
        twin, twin_state, _ = start(f"st{os.getpid() % 100000}e", last=4, extra=["--volume-wait", "2"], wait=False)
        try:
            out = twin.communicate(timeout=30)[0]
        except subprocess.TimeoutExpired:
            twin.kill()
            out = twin.communicate()[0]
        check("a volume attached elsewhere: the boot gives up after --volume-wait, exit 2, nothing left",
              twin.returncode == 2 and out == "" and not gone(f"st{os.getpid() % 100000}e", twin_state, None)
              and len(run("losetup", "--associated", volume_file).stdout.splitlines()) == 1,
              f"{twin.returncode} {out!r}")
        result = run(sys.executable, SELF, "--cleanup", "--name", name, "--state", state, check=False, timeout=60)
        check("--cleanup: exits 0", result.returncode == 0, result.stderr)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
        check("--cleanup: boot.py was killed", process.returncode == -signal.SIGKILL, str(process.returncode))
        check("--cleanup: the dataplane is gone", dead(pid))
        check("--cleanup: nothing left", not gone(name, state), str(gone(name, state)))
        result = run(sys.executable, SELF, "--cleanup", "--name", name, "--state", state, check=False, timeout=60)
        check("--cleanup again: exits 0 (idempotent)", result.returncode == 0, result.stderr)
        check("--cleanup of a peer: the link went with it, the instance beside it runs on",
              wait_until(lambda: not link_in(f"qe-{other_name}", f"qep-{name}"), 10)
              and other.poll() is None and reachable("fd71:7e5e::3"))

        # 3. A dataplane that exits on its own, in an instance booted beside the one still running (which it
        # reaches directly): it goes first, and leaves nothing in the other's netns. Then the other is stopped.
        name = f"st{os.getpid() % 100000}c"
        process, state, line = start(name, extra=["--peer", f"{other_name}=fd71:7e5e::3"])
        check("third instance, --peer the other: booted", line.startswith("booted pid="), line)
        check("--peer: it and the other reach each other directly",
              direct(name, other_name, "fd71:7e5e::3") and direct(other_name, name, "fd71:7e5e::2"))
        if line.startswith("booted pid="):
            os.kill(int(line.split("=")[1]), signal.SIGKILL)
        try:
            rest = process.communicate(timeout=60)[0]
        except subprocess.TimeoutExpired:
            process.kill()
            rest = process.communicate()[0]
        check("a dataplane killed: boot.py says `exited status=137` and exits 137",
              rest.strip() == "exited status=137" and process.returncode == 137, f"{rest!r} {process.returncode}")
        check("...and leaves nothing (nor its end of the peer link), the other runs on",
              not gone(name, state) and other.poll() is None and reachable("fd71:7e5e::3"), str(gone(name, state)))
        other.send_signal(signal.SIGINT)
        try:
            out = other.communicate(timeout=60)[0]
        except subprocess.TimeoutExpired:
            other.kill()
            out = other.communicate()[0]
        check("SIGINT stops it as SIGTERM does", out.startswith("stopped status=") and other.returncode == 0
              and not gone(other_name, other_state, other_volume), f"{out!r} {other.returncode}")
        # 4. A first boot that fails (the wrong hash), and one terminated while it runs (no control plane).
        for case, text in (("f", render(template, values(url, "00" * 32, volume_id, open(ca_pem).read()))),
                           ("g", render(template, values("https://[fd71:7e5e::1]:1", sha, volume_id)))):
            with open(user_data, "w") as f:
                f.write(text)
            name = f"st{os.getpid() % 100000}{case}"
            process, state, line = start(name, wait=case == "f")
            if case == "g":
                time.sleep(3)
                process.send_signal(signal.SIGTERM)
            try:
                out = process.communicate(timeout=60)[0]
            except subprocess.TimeoutExpired:
                process.kill()
                out = process.communicate()[0]
            if case == "f":
                check("a failing first boot: `first-boot failed status=1`, exit 3, nothing left",
                      line == "first-boot failed status=1" and process.returncode == 3 and not gone(name, state),
                      f"{line!r} {process.returncode} {gone(name, state)}")
            else:
                check("SIGTERM during the first boot: `stopped status=none`, exit 0, nothing left",
                      out.strip() == "stopped status=none" and process.returncode == 0 and not gone(name, state),
                      f"{out!r} {process.returncode} {gone(name, state)}")
        check("the host's /etc is unchanged at the end",
              before == {path: hashlib.sha256(open(path, "rb").read()).hexdigest() for path in watched})
    except Failure as error:
        check("self-test", False, str(error))
    finally:
        for name, state in names:
            if os.path.exists(os.path.join(state, "instance.json")) or os.path.exists(netns_path(name)):
                run(sys.executable, SELF, "--cleanup", "--name", name, "--state", state, check=False, timeout=60)
        if server:
            server.shutdown()
            server.server_close()
        if not failures:
            shutil.rmtree(work)
        else:
            print(f"        kept {work}", flush=True)
    print(f"\n{len(failures)} failed" if failures else "\nall passed", flush=True)
    return 1 if failures else 0


def netns_socket(name):
    """A TCP socket of instance NAME's netns: a socket stays in the netns it was made in (setns(2) for a moment,
    in this thread only)."""
    libc = ctypes.CDLL(None, use_errno=True)
    clone_newnet = 0x40000000
    with open("/proc/thread-self/ns/net") as home, open(netns_path(name)) as there:
        if libc.setns(there.fileno(), clone_newnet) != 0:
            raise OSError(ctypes.get_errno(), f"setns qe-{name}")
        try:
            return socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        finally:
            if libc.setns(home.fileno(), clone_newnet) != 0:
                raise OSError(ctypes.get_errno(), "setns back")


def connects(source, target, address):
    """A TCP connection from qe-SOURCE to a listener on ADDRESS in qe-TARGET is made."""
    with netns_socket(target) as listener, netns_socket(source) as client:
        listener.bind((address, 0))
        listener.listen()
        client.settimeout(3)
        try:
            client.connect((address, listener.getsockname()[1]))
            return True
        except OSError:
            return False


def read_line(process, seconds):
    ready, _, _ = select.select([process.stdout], [], [], seconds)
    return process.stdout.readline().strip() if ready else "(nothing within %d s)" % seconds


# From infra/check.py (which needs PyYAML at import): what the control plane renders.
def render(template, values):
    comment = lambda line: line.strip() == "#" or line.lstrip().startswith("# ")
    template = "\n".join(line for line in template.splitlines() if not comment(line)) + "\n"
    for name, value in values.items():
        template = template.replace("{{" + name + "}}", value)
    return template


def values(control_plane, sha256, volume_id, ca_pem=None):
    text = (f'control_plane = "{control_plane}"\nqueue_id = "{SELFTEST_QUEUE}"\n'
            f'bootstrap_token = "{SELFTEST_BOOTSTRAP_TOKEN}"\n'
            + (f'control_plane_ca_pem = """{ca_pem}"""\n' if ca_pem else ""))
    b64 = lambda s: base64.b64encode(s.encode()).decode()
    return {"queue_id": SELFTEST_QUEUE, "control_plane": control_plane, "bootstrap_toml": text,
            "bootstrap_b64": b64(text), "dataplane_sha256": sha256, "volume_id": volume_id, "mode": "serve",
            "control_plane_ca_b64": b64(ca_pem) if ca_pem else ""}


def openssl_root(directory, name):
    pem, keyfile = os.path.join(directory, f"{name}.pem"), os.path.join(directory, f"{name}.key")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", keyfile, "-out", pem, "-days", "2", "-subj", f"/CN={name}",
                    "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"],
                   check=True, capture_output=True)
    return pem, keyfile


class SelftestControlPlane(http.server.ThreadingHTTPServer):
    """The control plane's node API as far as a first boot goes: the binary, to the right token only. Bound to
    fd71:7e5e::1 before that address exists (IP_FREEBIND): boot.py gives it to the host end of the veth."""

    address_family = socket.AF_INET6
    daemon_threads = True

    def __init__(self, binary, tls):
        self.binary = binary
        self.node_requests = 0
        self.paths = []
        super().__init__(("fd71:7e5e::1", 0), SelftestHandler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*tls)
        self.socket = context.wrap_socket(self.socket, server_side=True)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def server_bind(self):
        self.socket.setsockopt(socket.SOL_IP, 15, 1)  # IP_FREEBIND
        super().server_bind()


class SelftestHandler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.server.paths.append(self.path)
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if (self.path != f"/v1/nodes/{SELFTEST_QUEUE}/bootstrap"
                or self.headers.get("Authorization") != f"Bearer {SELFTEST_BOOTSTRAP_TOKEN}"):
            self.do_GET()
            return
        answer = json.dumps({"node_token": SELFTEST_TOKEN}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def do_GET(self):
        self.server.paths.append(self.path)
        authorized = self.headers.get("Authorization") == f"Bearer {SELFTEST_TOKEN}"
        if not authorized:
            self.send_error(401)
            return
        if self.path != f"/v1/nodes/{SELFTEST_QUEUE}/dataplane":
            # The node asking for its config: there is none here; it retries.
            self.server.node_requests += 1
            self.send_error(503)
            return
        size = os.path.getsize(self.server.binary)
        self.send_response(200)
        self.send_header("Content-Length", str(size))
        self.end_headers()
        with open(self.server.binary, "rb") as f:
            shutil.copyfileobj(f, self.wfile, 1 << 20)

    do_PUT = do_GET

    def log_message(self, *args):
        pass


# --- Main -------------------------------------------------------------------------------------------------------


def main():
    if sys.argv[1:2] == ["--inner"]:
        inner(sys.argv[2])
        return 0
    if sys.argv[1:2] == ["--stub"]:
        return stub(sys.argv[2], sys.argv[3], sys.argv[4:])
    parser = argparse.ArgumentParser(description="Boots a queue's instance from its user data, in namespaces.")
    parser.add_argument("--name")
    parser.add_argument("--user-data")
    parser.add_argument("--volume-file")
    parser.add_argument("--volume-id")
    parser.add_argument("--v6")
    parser.add_argument("--v4")
    parser.add_argument("--host-v6")
    parser.add_argument("--host-v4")
    parser.add_argument("--state")
    parser.add_argument("--instance-id", help="EC2's id of the instance, served by its metadata service")
    parser.add_argument("--add-host", action="append", default=[], metavar="HOST=ADDR",
                        help="a line for the instance's /etc/hosts")
    parser.add_argument("--stop-timeout", type=float, default=15, help="TimeoutStopSec= (default 15)")
    parser.add_argument("--boot-timeout", type=float, default=900, help="for the runcmd (default 900)")
    parser.add_argument("--volume-wait", type=float, default=60,
                        help="how long a volume another instance holds is waited for (default 60)")
    parser.add_argument("--peer", action="append", default=[], metavar="NAME=ADDR",
                        help="an instance booted before (at IPv6 address ADDR) that this one reaches directly")
    parser.add_argument("--cleanup", action="store_true", help="kill the instance NAME and tear it down")
    parser.add_argument("--selftest", action="store_true")
    args = parser.parse_args()
    if args.selftest:
        return selftest()
    try:
        if args.cleanup:
            if not args.name or not args.state:
                parser.error("--cleanup needs --name and --state")
            return 0 if cleanup(args.name, os.path.abspath(args.state)) else 1
        required = ("name", "user_data", "volume_file", "volume_id", "v6", "host_v6", "state")
        missing = [f"--{r.replace('_', '-')}" for r in required if not getattr(args, r)]
        if missing:
            parser.error(f"missing {' '.join(missing)}")
        return boot(args)
    except Failure as error:
        log(f"error: {error}")
        return EXIT_SETUP


if __name__ == "__main__":
    sys.exit(main())
