"""The shape of a policy or preset file, validated with pydantic at the edge.

Unknown keys are errors (``extra="forbid"``); rule strings are parsed into Rules by
policy.presets, which also knows each item's YAML line.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from policy.decision import Code, Mode, Verdict

__all__ = ["PolicyFile", "TestCase"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TestCase(_Strict):
    """``{host: api.x.com, expect: allow}``; host may carry a port (``api.x.com:8443``)."""

    __test__ = False  # not a pytest class

    host: str = Field(min_length=1)
    expect: Verdict
    port: int | None = Field(default=None, ge=1, le=65535)
    code: Code | None = None
    silent: bool | None = None  # also check whether a refusal is left out of the audit log

    @field_validator("expect", "code", mode="before")
    @classmethod
    def _lowercase(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value


class PolicyFile(_Strict):
    name: str | None = None
    description: str = ""
    mode: Mode | None = None
    presets: tuple[str, ...] = ()
    rules: tuple[str, ...] = ()
    default_ports: tuple[int, ...] | None = None
    silent: tuple[str, ...] = ()
    tests: tuple[TestCase, ...] = ()

    @field_validator("mode", mode="before")
    @classmethod
    def _mode_lower(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    @field_validator("default_ports")
    @classmethod
    def _ports(cls, value: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if value is not None:
            if not value:
                raise ValueError("must list at least one port (omit it for 80 and 443)")
            bad = [p for p in value if not 1 <= p <= 65535]
            if bad:
                raise ValueError(f"ports must be 1-65535, got {bad}")
        return value
