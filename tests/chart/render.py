"""Renders or lints the Helm chart with Helm's own Go SDK (the helm-python-sdk package, import
name helm_python), for tests/chart.rs.

    python render.py check
        exits 0 when helm_python can be imported, 3 when it cannot.
    python render.py template CHART RELEASE NAMESPACE [--api-versions V,...] < values.json
        like `helm template`: prints {"manifests": {template path: text}, "crds": [text]}.
        --api-versions, as Helm's flag: what .Capabilities.APIVersions holds besides the
        built-in versions (e.g. jobset.x-k8s.io/v1alpha2, or .../JobSet for a kind).
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
            api_versions = option(argv[5:], "--api-versions")
            with helm.Chart.load(chart_dir) as chart:
                if api_versions is None:
                    manifests = chart.render(
                        values, name=release, namespace=namespace, is_install=True
                    )
                else:
                    manifests = render_with_api_versions(
                        helm, chart, values, release, namespace, api_versions.split(",")
                    )
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


def option(args, name):
    """The value of `name VALUE` or `name=VALUE` in args, else None."""
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg[len(name) + 1 :]
    if args:
        raise SystemExit(f"render.py: unknown arguments {args}")
    return None


def render_with_api_versions(helm, chart, values, release, namespace, api_versions):
    """Chart.render with Capabilities.APIVersions extended. Chart.render of helm-python-sdk
    0.2.2 (pinned in requirements.txt) does not pass this option on, but the native render it
    calls reads it (`api_versions`, as `helm template --api-versions`), so call that."""
    from helm_python import _native

    opts = {
        "name": release,
        "namespace": namespace,
        "is_install": True,
        "api_versions": api_versions,
    }
    rendered = _native.call_string(
        "helm_render", chart._raw(), json.dumps(values), json.dumps(opts)
    )
    return json.loads(rendered)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
