"""The hot-path decoder for reports: msgspec structs generated from the pydantic wire models.

``monitor.ingest.wire`` stays the one definition of the format. Validating a report with pydantic
costs about ten times what msgspec costs for the same checks, and ingest is the monitor's hot
path (a thousand reports a second at 10,000 ranks), so this module mirrors every model of
``monitor.ingest.wire`` as a ``msgspec.Struct`` with the same field names, defaults and constraints
(lengths, bounds, patterns, literals), built from the pydantic models at import time.

``decode_report`` tries msgspec first. msgspec is strict where pydantic is lax (a rank sent
as the string "1", an integer sent as 1.0): anything msgspec refuses goes to pydantic, which
either accepts it (converted to the struct) or produces the 422's field-by-field errors.
Either way the caller gets the same struct types, so state code sees one kind of report.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types
import msgspec
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from monitor.ingest import wire

_STRUCTS: dict[type[BaseModel], type[msgspec.Struct]] = {}
_META_KEYS = ("ge", "gt", "le", "lt", "min_length", "max_length")


def _meta_of(metadata: list[Any]) -> msgspec.Meta | None:
    """The msgspec constraints for pydantic/annotated_types metadata (Field(max_length=...) etc)."""
    kwargs: dict[str, Any] = {}
    for item in metadata:
        for key in _META_KEYS:
            value = getattr(item, key, None)
            if value is not None and isinstance(item, (annotated_types.BaseMetadata, FieldInfo)):
                kwargs[key] = value
        pattern = getattr(item, "pattern", None)
        if pattern is not None:
            kwargs["pattern"] = pattern
    # A field narrows wire.Int's bounds (ge=0, lt=N): msgspec takes one bound a side, the tighter.
    for inclusive, exclusive, tighter in (("le", "lt", min), ("ge", "gt", max)):
        if inclusive in kwargs and exclusive in kwargs:
            if tighter(kwargs[inclusive], kwargs[exclusive]) == kwargs[exclusive]:
                del kwargs[inclusive]
            else:
                del kwargs[exclusive]
    return msgspec.Meta(**kwargs) if kwargs else None


def _translate(annotation: Any) -> Any:
    """A pydantic annotation as a msgspec one: nested models become their structs."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return struct_for(annotation)
    origin = get_origin(annotation)
    if origin is Annotated:
        inner, *metadata = get_args(annotation)
        flat: list[Any] = []
        for m in metadata:
            flat.extend(m.metadata if isinstance(m, FieldInfo) else [m])
        meta = _meta_of(flat)
        translated = _translate(inner)
        return Annotated[translated, meta] if meta is not None else translated
    if origin in (Union, types.UnionType):
        return Union[tuple(_translate(a) for a in get_args(annotation))]  # noqa: UP007
    if origin is Literal:
        return annotation
    if origin in (list, tuple, dict):
        args = tuple(_translate(a) for a in get_args(annotation))
        return origin[args] if args else origin
    return annotation


def struct_for(model: type[BaseModel]) -> type[msgspec.Struct]:
    """The msgspec struct mirroring ``model`` (built once, cached)."""
    if model in _STRUCTS:
        return _STRUCTS[model]
    fields: list[tuple[str, Any, Any]] = []
    for name, info in model.model_fields.items():
        # pydantic moves a field's outer Annotated constraints into ``metadata``.
        annotation = _translate(info.annotation)
        meta = _meta_of(info.metadata)
        if meta is not None:
            annotation = Annotated[annotation, meta]
        if info.is_required():
            fields.append((name, annotation))  # type: ignore[arg-type]
            continue
        default = info.default
        if isinstance(default, BaseModel):
            factory_model = type(default)
            fields.append((name, annotation, msgspec.field(default_factory=lambda m=factory_model: struct_for(m)())))
        elif isinstance(default, (list, dict)):
            fields.append((name, annotation, msgspec.field(default_factory=type(default))))
        else:
            fields.append((name, annotation, default))
    # Required fields first, as msgspec (like dataclasses) wants; kw_only keeps names the interface.
    fields.sort(key=lambda f: len(f) == 3)
    struct = msgspec.defstruct(model.__name__, fields, frozen=True, kw_only=True, module=__name__, gc=False)
    _STRUCTS[model] = struct
    return struct


Report = struct_for(wire.Report)
_decoder = msgspec.json.Decoder(Report)

# A relay's batch (monitor/relay/): reports it decoded with this module, encoded again, so they
# decode here strictly; ``attributed``: the relay checked the report against a node-bound token.
# Each report is first taken as its raw bytes, so its size is checked as a direct post's would be.
MAX_BATCH_REPORTS = 4096
_RawEntry = msgspec.defstruct("_RawEntry", [("report", msgspec.Raw), ("attributed", bool, False)],
                              frozen=True, kw_only=True, module=__name__, gc=False)
_RawBatch = msgspec.defstruct(
    "_RawBatch", [("reports", Annotated[list[_RawEntry], msgspec.Meta(max_length=MAX_BATCH_REPORTS)])],  # type: ignore[valid-type]
    frozen=True, kw_only=True, module=__name__, gc=False)
_batch_decoder = msgspec.json.Decoder(_RawBatch)


@dataclass(frozen=True)
class BatchEntry:
    """One report of a relay's batch: decoded, or None when larger than a report may be."""

    report: Any
    attributed: bool


def decode_report(body: bytes | str) -> Any:
    """The report as structs; raises ``pydantic.ValidationError`` (with every error) when invalid."""
    try:
        return _decoder.decode(body)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        # RecursionError: msgspec skipping a deeply nested unknown field; UnicodeDecodeError: bytes
        # that are not UTF-8 inside a string. pydantic's parser answers both as a JSON error (a 422).
        pass
    # Lax input pydantic accepts, or an error to explain field by field.
    model = wire.Report.model_validate_json(body)
    return msgspec.convert(model.model_dump(mode="python"), Report)


def decode_for_forwarding(body: bytes) -> tuple[Any, bytes]:
    """The report, and the bytes a relay forwards: the body itself when msgspec takes it as it is
    (what agents send), else the report encoded again (lax input pydantic converted, or unknown
    fields msgspec cannot skip), so the monitor's strict ``decode_batch`` always takes it."""
    try:
        return _decoder.decode(body), body
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        pass
    report = decode_report(body)
    return report, encode_report(report)


def decode_batch(body: bytes, max_report_bytes: int) -> list[BatchEntry]:
    """A relay's batch, each report decoded unless larger than ``max_report_bytes`` (that one is
    refused alone, as its direct post would be); ValueError saying where when it is not a batch."""
    try:
        entries = []
        for index, raw in enumerate(_batch_decoder.decode(body).reports):
            try:
                report = _decoder.decode(raw.report) if len(raw.report) <= max_report_bytes else None
            except msgspec.ValidationError as exc:
                raise ValueError(f"{exc} - at `$.reports[{index}].report`") from None
            entries.append(BatchEntry(report, raw.attributed))
        return entries
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError, UnicodeDecodeError) as exc:
        raise ValueError(str(exc)) from None


def encode_report(report: Any) -> bytes:
    """A decoded report as JSON again: what a relay forwards, strict enough for ``decode_batch``."""
    return msgspec.json.encode(report)


__all__ = ["BatchEntry", "MAX_BATCH_REPORTS", "Report", "decode_batch", "decode_for_forwarding",
           "decode_report", "encode_report", "struct_for"]
