"""The typed records' JSON Schemas, as ``docs/schemas`` holds them.

``python tests/schema_support.py`` (``make schemas``) writes them; ``test_typed_records.py``
checks that the committed files equal what the declarations generate.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCHEMA_DIR = ROOT / "docs" / "schemas"


def record_types() -> dict[str, Any]:
    """File name (without ``.json``) -> the record type it describes."""
    from stagefrontier.analysis.window_report import WindowReport
    from stagefrontier.formats.incident import Incident
    from stagefrontier.formats.stored_report import WindowFacts
    from stagefrontier.route.requests import (
        CaptureRequest,
        CaptureStatus,
        ManualAnswer,
        ManualRequest,
    )

    return {
        "incident": Incident,
        "window-facts": WindowFacts,
        "window-report": WindowReport,
        "capture-request": CaptureRequest,
        "capture-status": CaptureStatus,
        "manual-request": ManualRequest,
        "manual-answer": ManualAnswer,
    }


def schema_texts() -> dict[str, str]:
    from stagefrontier.formats.typed import json_schema

    return {
        f"{name}.json": json.dumps(json_schema(kind), indent=1, sort_keys=True) + "\n"
        for name, kind in record_types().items()
    }


def main() -> int:
    SCHEMA_DIR.mkdir(parents=True, exist_ok=True)
    for name, text in schema_texts().items():
        (SCHEMA_DIR / name).write_text(text, encoding="utf-8")
    print(f"wrote {len(schema_texts())} schemas to {SCHEMA_DIR.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    sys.exit(main())
