"""Generate ``docs/crd-reference.md`` from the same structural schemas as the CRDs."""

from __future__ import annotations

from typing import Any

from trtfleet.api.crdgen import build_crds


def _type_of(node: dict[str, Any]) -> str:
    if node.get("x-kubernetes-int-or-string"):
        return "int or string"
    kind = node.get("type", "object")
    if kind == "array":
        return f"[]{_type_of(node.get('items', {}))}"
    if kind == "object" and "additionalProperties" in node:
        return f"map[string]{_type_of(node['additionalProperties'])}"
    return str(kind)


def _constraints(node: dict[str, Any]) -> str:
    parts = []
    if "enum" in node:
        parts.append("one of " + ", ".join(f"`{v}`" for v in node["enum"]))
    for key, exclusive, inclusive_label, exclusive_label in (
        ("minimum", "exclusiveMinimum", ">=", ">"),
        ("maximum", "exclusiveMaximum", "<=", "<"),
    ):
        if key in node:
            parts.append(f"{exclusive_label if node.get(exclusive) is True else inclusive_label} {node[key]}")
    if "pattern" in node:
        parts.append(f"pattern `{node['pattern']}`")
    if "default" in node and node["default"] not in ({}, None):
        parts.append(f"default `{node['default']}`")
    for rule in node.get("x-kubernetes-validations", []):
        parts.append(f"rule: {rule['message']}")
    return "; ".join(parts)


def _rows(node: dict[str, Any], prefix: str, required: set[str]) -> list[str]:
    rows = []
    for name, sub in sorted(node.get("properties", {}).items()):
        path = f"{prefix}.{name}"
        description = " ".join(str(sub.get("description", "")).split()).replace("|", "\\|")
        constraint = _constraints(sub).replace("|", "\\|")
        flag = "yes" if name in required else ""
        rows.append(f"| `{path}` | {_type_of(sub)} | {flag} | {description} | {constraint} |")
        target = sub.get("items", sub) if sub.get("type") == "array" else sub
        if "properties" in target:
            rows.extend(_rows(target, path + ("[]" if target is not sub else ""), set(target.get("required", []))))
    return rows


def render_crd_reference() -> str:
    """Markdown reference of every field of every trtfleet kind."""
    lines = [
        "# CRD reference",
        "",
        "Generated from `trtfleet/api` by `trtfleet crds --markdown`; do not edit by hand.",
        "",
    ]
    for crd in build_crds().values():
        version = crd["spec"]["versions"][0]
        schema = version["schema"]["openAPIV3Schema"]
        names = crd["spec"]["names"]
        lines += [
            f"## {names['kind']} (`{crd['spec']['group']}/{version['name']}`)",
            "",
            str(schema["description"]),
            "",
            f"Short names: {', '.join(names['shortNames'])}. Scope: {crd['spec']['scope']}.",
            "",
        ]
        for part in ("spec", "status"):
            sub = schema["properties"][part]
            lines += [f"### {part}", "", "| field | type | required | description | constraints |",
                      "| --- | --- | --- | --- | --- |"]
            lines += _rows(sub, part, set(sub.get("required", [])))
            for rule in sub.get("x-kubernetes-validations", []):
                lines.append(f"| `{part}` | rule | | {rule['message']} | `{rule['rule']}` |")
            lines.append("")
    return "\n".join(lines)
