"""Renders or lints the Helm chart with Helm's own Go SDK (the helm-python-sdk package, import
name helm_python), for tests/chart.rs.

    python render.py check
        exits 0 when helm_python can be imported, 3 when it cannot.
    python render.py template CHART RELEASE NAMESPACE < values.json
        like `helm template`: prints {"manifests": {template path: text}, "crds": [text]}.
    python render.py lint CHART NAMESPACE < values.json
        like `helm lint --strict`: prints {"messages": [{"severity", "path", "error"}], "errors": [...]}.

A Helm error (bad values, a failing template) prints {"error": message, "kind": class name}
and exits 2, so the caller can tell a refused install from a broken setup (any other exit).
"""

import json
import sys


def main(argv):
    try:
        import helm_python as helm
    except ImportError as e:
        print(f"helm_python cannot be imported: {e}", file=sys.stderr)
        return 3
    command = argv[1] if len(argv) > 1 else ""
    if command == "check":
        print(helm.helm_sdk_version())
        return 0
    values = json.load(sys.stdin) if command in ("template", "lint") else None
    try:
        if command == "template":
            chart_dir, release, namespace = argv[2:5]
            with helm.Chart.load(chart_dir) as chart:
                manifests = chart.render(values, name=release, namespace=namespace, is_install=True)
                crds = [c["data"] for c in chart.crds]
            out = {"manifests": manifests, "crds": crds}
        elif command == "lint":
            chart_dir, namespace = argv[2:4]
            out = helm.lint(chart_dir, values, strict=True, namespace=namespace)
        else:
            print(__doc__, file=sys.stderr)
            return 64
    except helm.HelmError as e:
        json.dump({"error": str(e), "kind": type(e).__name__}, sys.stdout)
        return 2
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
