"""A model's metadata and config under the served name the client asked for (pure): Triton's JSON forms for
the HTTP front end (:func:`metadata_json`, :func:`config_json`), renamed protobufs for the gRPC one."""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2


def _shapes_to_int(obj: Any) -> Any:
    """MessageToDict writes int64 fields as strings; Triton's JSON has numbers for dims/shapes."""
    if isinstance(obj, dict):
        return {
            k: ([int(x) for x in v] if k in ("shape", "dims") and isinstance(v, list) else _shapes_to_int(v))
            for k, v in obj.items()
        }
    if isinstance(obj, list):
        return [_shapes_to_int(v) for v in obj]
    return obj


def metadata_json(metadata: service_pb2.ModelMetadataResponse, name: str) -> dict[str, Any]:
    doc: dict[str, Any] = _shapes_to_int(json_format.MessageToDict(metadata, preserving_proto_field_name=True))
    doc["name"] = name
    return doc


def config_json(config: model_config_pb2.ModelConfig, name: str) -> dict[str, Any]:
    doc: dict[str, Any] = _shapes_to_int(json_format.MessageToDict(config, preserving_proto_field_name=True))
    doc["name"] = name
    return doc


def renamed_metadata(metadata: service_pb2.ModelMetadataResponse, name: str) -> service_pb2.ModelMetadataResponse:
    copy = service_pb2.ModelMetadataResponse()
    copy.CopyFrom(metadata)
    copy.name = name
    return copy


def renamed_config(config: model_config_pb2.ModelConfig, name: str) -> model_config_pb2.ModelConfig:
    copy = model_config_pb2.ModelConfig()
    copy.CopyFrom(config)
    copy.name = name
    return copy
