"""Small helpers for .ci/ecosystem.sh (stdlib + PyYAML only).

  helpers.py ports N             N distinct loopback ports free for TCP and UDP
  helpers.py kustomization DIR   the base lists every manifest and file it needs
  helpers.py mesh-wait SECS URL...  every replica counts all the others
"""
import json
import pathlib
import socket
import sys
import time
import urllib.request


def ports(n):
    # Sockets stay open until all are chosen, so the ports are distinct. One
    # may still be taken before use; the replica's wait then fails with its log.
    held, chosen = [], []
    while len(chosen) < n and len(held) < 400:
        tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        tcp.bind(("127.0.0.1", 0))
        held.append(tcp)
        port = tcp.getsockname()[1]
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            udp.bind(("127.0.0.1", port))
        except OSError:
            udp.close()
            continue
        held.append(udp)
        chosen.append(port)
    for s in held:
        s.close()
    if len(chosen) < n:
        sys.exit("could not find free ports")
    print(" ".join(map(str, chosen)))


def kustomization(base):
    import yaml

    base = pathlib.Path(base)
    k = yaml.safe_load((base / "kustomization.yaml").read_text())
    listed = set(k.get("resources", []))
    files = {f for g in k.get("configMapGenerator", []) for f in g.get("files", [])}
    missing = [f for f in listed | files if not (base / f).is_file()]
    # Every manifest except examples must be part of the base.
    unlisted = [
        p.name
        for p in base.glob("*.yaml")
        if p.name != "kustomization.yaml" and ".example." not in p.name and p.name not in listed
    ]
    if missing or unlisted:
        sys.exit(f"kustomization: missing {missing}, not listed {unlisted}")
    print(f"kustomization ok: {len(listed)} resources, {len(files)} generated files")


def dashboard(path, scrape, rules_out):
    """Every PromQL expression of a Grafana dashboard: written as recording
    rules (for `promtool check rules`), and every shoal_* metric it names
    checked against a live scrape's families."""
    import json
    import re

    d = json.loads(pathlib.Path(path).read_text())
    exprs = [(p["id"], t["refId"], t["expr"]) for p in d["panels"] for t in p.get("targets", [])]
    lines = ["groups:", "  - name: dashboard", "    rules:"]
    for pid, ref, expr in exprs:
        lines.append(f"      - record: dashboard:panel_{pid}_{ref}")
        lines.append("        expr: " + json.dumps(expr))
    pathlib.Path(rules_out).write_text("\n".join(lines) + "\n")
    families = set()
    for line in pathlib.Path(scrape).read_text().splitlines():
        if line.startswith("# TYPE "):
            families.add(line.split()[2])
    unknown = set()
    for _, _, expr in exprs:
        for name in re.findall(r"\bshoal_[a-z0-9_]+", expr):
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            if name not in families and base not in families:
                unknown.add(name)
    if unknown:
        sys.exit(f"dashboard names metrics a live scrape lacks: {sorted(unknown)}")
    print(f"dashboard ok: {len(exprs)} expressions, every metric in the scrape")


def mesh_wait(secs, urls):
    deadline, want = time.monotonic() + secs, len(urls) - 1
    seen = {}
    while time.monotonic() < deadline:
        for url in urls:
            try:
                with urllib.request.urlopen(url + "/mesh/status", timeout=2) as r:
                    members = json.load(r)["members"]
                seen[url] = sorted(m["name"] for m in members if m["live"] and m["counted"])
            except (OSError, ValueError, KeyError):
                seen[url] = []
        if all(len(v) == want for v in seen.values()):
            for url, names in seen.items():
                print(f"mesh ok: {url} counts {', '.join(names)}")
            return
        time.sleep(0.5)
    sys.exit(f"mesh did not converge in {secs}s: {json.dumps(seen)}")


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "ports":
        ports(int(args[0]))
    elif cmd == "kustomization":
        kustomization(args[0])
    elif cmd == "mesh-wait":
        mesh_wait(float(args[0]), args[1:])
    elif cmd == "dashboard":
        dashboard(args[0], args[1], args[2])
    else:
        sys.exit(f"unknown command {cmd}")
