"""What every API model shares: camelCase on the wire, unknown fields refused; how a message quotes a value
the user wrote (`shown`)."""

from __future__ import annotations

import json
import re
import reprlib
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from muralist_api.cel import CelRule


class ApiModel(BaseModel):
    """camelCase on the wire, unknown fields refused, snake_case in Python."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_enum_values=True,
        validate_default=True,
    )

    # CEL rules with `self` bound to this model's object (the CRD's x-kubernetes-validations at its
    # node); rules about one field go on the field instead (Annotated[T, CelRule(...)]).
    cel_rules: ClassVar[tuple[CelRule, ...]] = ()

    def wire(self) -> dict[str, Any]:
        """The object as it appears in a manifest (camelCase, unset optionals left out)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


# A Kubernetes object we pass through untouched (VolumeSource, Affinity, ...): the API server
# and kubelet validate those, and their schemas are far too large to copy into our CRD.
KubeObject = Annotated[dict[str, Any], Field(json_schema_extra={"x-kubernetes-preserve-unknown-fields": True})]

# What a message shows of a value the user wrote: enough to recognise it, never a megabyte.
SHOWN_CHARS = 80


_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def member_path(parent: str, key: str) -> str:
    """The field path of a map's member: `parent.key` for a plain key, else the key quoted
    (`parent["a b"]`, `parent[""]`), so that a dot, a space, a newline or nothing at all in a key
    the user made up still reads as one field."""
    if _PLAIN_KEY.fullmatch(key):
        return f"{parent}.{key}" if parent else key
    return f"{parent}[{json.dumps(key if len(key) <= SHOWN_CHARS else key[:SHOWN_CHARS] + '...')}]"


def shown(value: Any) -> str:
    """A value's repr, cut short: a 300,000-character string or a list nested 3,000 deep (whose
    plain repr raises RecursionError) is quoted by its start."""
    return _SHOWN.repr(value)


_SHOWN = reprlib.Repr()  # keyword arguments only from Python 3.12
_SHOWN.maxlevel, _SHOWN.maxlist, _SHOWN.maxdict, _SHOWN.maxlong = 3, 4, 4, 40
_SHOWN.maxstring = _SHOWN.maxother = SHOWN_CHARS



def relative_path(value: str) -> str:
    """A path that stays inside its volume: relative, no '..'; raises ValueError saying which."""
    if value.startswith("/"):
        raise ValueError(f"'{value}' is absolute; use a path relative to the volume, e.g. '{value.strip('/') or 'x'}'")
    if ".." in value.split("/"):
        raise ValueError(f"'{value}' contains '..'; it must stay inside the volume")
    return value
