"""A document a run converts: the listed PDF and the stem its outputs go under (planned, batched, converted)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from olmocr_tasks.storage.store import ObjectInfo


# Slots: a run plans one of these per document and holds them all while it converts (no ``__dict__``).
@dataclass(frozen=True, slots=True)
class SourceDocument:
    """A PDF to convert: where it is, what the listing said about it, and where its outputs go."""

    info: ObjectInfo
    stem: str
    # Planned because its last outcome was a failure (re-drive), not as new work.
    redriven: bool = False

    @property
    def uri(self) -> str:
        return self.info.uri

    def to_dict(self) -> dict[str, Any]:
        info = self.info
        data: dict[str, Any] = {
            "uri": info.uri,
            "size": info.size,
            "etag": info.etag,
            "last_modified": info.last_modified.isoformat() if info.last_modified else None,
            "stem": self.stem,
        }
        if self.redriven:
            data["redriven"] = True
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SourceDocument:
        modified = data.get("last_modified")
        info = ObjectInfo(
            uri=data["uri"],
            size=data.get("size"),
            etag=data.get("etag"),
            last_modified=datetime.fromisoformat(modified) if modified else None,
        )
        return cls(info=info, stem=data["stem"], redriven=bool(data.get("redriven", False)))
