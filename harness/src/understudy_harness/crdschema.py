"""A CRD's schema checked offline, as the API server would: the OpenAPI schema as JSON
Schema, structural defaulting, and CEL rules (``x-kubernetes-validations``) evaluated with
cel-python, including transition rules that read ``oldSelf``.

Why this module exists: the BrokerGroup and BrokerTopic CRD tests check their samples, bad
specs and CEL rules the same way; one copy of these conversions serves both. Never a claim
about Kubernetes itself: the kind suite in e2e/ applies the CRDs to a real API server.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonschema


def to_json_schema(node: Any) -> Any:
    """OpenAPI v3 (Kubernetes flavour) -> JSON Schema: ``nullable`` adds "null"; objects with
    declared properties reject unknown fields (as ``kubectl apply`` with strict field
    validation does) unless they preserve unknown fields."""
    if isinstance(node, list):
        return [to_json_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: to_json_schema(v) for k, v in node.items() if not k.startswith("x-kubernetes-")}
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    if (
        node.get("type") == "object"
        and "properties" in node
        and "additionalProperties" not in node
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def apply_defaults(node: dict[str, Any], value: Any) -> Any:
    """Structural defaulting as the API server does it: a missing field with a default gets
    it, then defaulting recurses into objects."""
    if not isinstance(value, dict) or node.get("type") != "object":
        return value
    result = dict(value)
    for key, prop in node.get("properties", {}).items():
        if key not in result and "default" in prop:
            result[key] = copy.deepcopy(prop["default"])
        if key in result:
            result[key] = apply_defaults(prop, result[key])
    return result


def validator(schema: dict[str, Any]) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(to_json_schema(schema))


def cel_failures(rules: list[dict[str, Any]], node: dict[str, Any], value: Any,
                 old: Any = None) -> list[str]:
    """Messages of the rules that reject ``value`` (defaulted against ``node`` first). A
    rule that reads ``oldSelf`` is a transition rule: like the API server, it is evaluated
    only on an update (``old`` given)."""
    import celpy
    from celpy.adapter import json_to_cel

    env = celpy.Environment()
    current = json_to_cel(apply_defaults(node, value))
    previous = None if old is None else json_to_cel(apply_defaults(node, old))
    failed = []
    for rule in rules:
        if "oldSelf" in rule["rule"] and previous is None:
            continue
        program = env.program(env.compile(rule["rule"]))
        activation = {"self": current} if previous is None else {"self": current,
                                                                 "oldSelf": previous}
        if not program.evaluate(activation):
            failed.append(str(rule["message"]))
    return failed
